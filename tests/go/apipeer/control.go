package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"log"
)

// command is one line of the test's control input:
//
//	{"op":"apply","resource":"leases","object":{...}}      -> {"ok":true,"rv":"123"}
//	{"op":"delete","resource":"leases","namespace":"kube-system","name":"x"}
//	{"op":"mode","mode":{"split":3,"splitDelayMs":1}}      (fields given are set)
//	{"op":"stats"}            -> {"ok":true,"connections":[...],"requests":[...]}
//	{"op":"compact"}          (every resourceVersion so far: 410 Gone)
//	{"op":"closeAll"}         (closes every open connection)
type command struct {
	Op        string          `json:"op"`
	Resource  string          `json:"resource"`
	Namespace string          `json:"namespace"`
	Name      string          `json:"name"`
	Object    object          `json:"object"`
	Mode      json.RawMessage `json:"mode"`
}

// control answers the commands read from `in` until it closes.
func (p *peer) control(in io.Reader, out io.Writer) {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	enc := json.NewEncoder(out)
	for sc.Scan() {
		var c command
		reply := object{"ok": true}
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			reply = object{"ok": false, "error": err.Error()}
		} else if err := p.do(c, reply); err != nil {
			reply = object{"ok": false, "error": err.Error()}
		}
		if err := enc.Encode(reply); err != nil {
			log.Fatalf("control output: %v", err)
		}
	}
}

func (p *peer) do(c command, reply object) error {
	switch c.Op {
	case "apply":
		if c.Resource == "" || c.Object == nil {
			return fmt.Errorf("apply needs a resource and an object")
		}
		reply["rv"] = fmt.Sprint(p.store.apply(c.Resource, c.Object))
	case "delete":
		if !p.store.remove(c.Resource, c.Namespace, c.Name) {
			return fmt.Errorf("no %s %s/%s", c.Resource, c.Namespace, c.Name)
		}
	case "mode":
		p.mu.Lock()
		// Unmarshalled over the current mode: the fields not given stay.
		err := json.Unmarshal(c.Mode, &p.mode)
		reply["mode"] = p.mode
		p.mu.Unlock()
		return err
	case "stats":
		p.mu.Lock()
		conns := make([]connInfo, 0, len(p.order))
		for _, c := range p.order {
			conns = append(conns, *c)
		}
		reqs := make([]reqInfo, 0, len(p.requests))
		for _, r := range p.requests {
			reqs = append(reqs, *r)
		}
		p.mu.Unlock()
		reply["connections"], reply["requests"] = conns, reqs
	case "compact":
		reply["compacted"] = fmt.Sprint(p.store.compact())
	case "closeAll":
		reply["closed"] = p.closeAll()
	default:
		return fmt.Errorf("unknown op %q", c.Op)
	}
	return nil
}
