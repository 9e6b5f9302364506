package main

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// object is a stored object as JSON decodes it; never changed once stored.
type object = map[string]any

type objKey struct{ res, ns, name string }

// event is one change of the store, as a watch replays it.
type event struct {
	typ string // ADDED, MODIFIED, DELETED
	res string
	rv  int64
	obj object
	// prev is the object before a MODIFIED (a watch with a selector turns
	// a change across it into ADDED or DELETED).
	prev object
}

// store holds the objects, their history and the resourceVersion.
type store struct {
	mu      sync.Mutex
	rv      int64
	objs    map[objKey]object
	history []event
	// Watches from a resourceVersion below this get 410 Gone.
	compacted int64
	// Closed and replaced on every change: watches wait on it.
	changed chan struct{}
}

// kinds: a collection's kind and group/version by its plural.
var kinds = map[string][2]string{
	"services":                     {"Service", "v1"},
	"nodes":                        {"Node", "v1"},
	"pods":                         {"Pod", "v1"},
	"configmaps":                   {"ConfigMap", "v1"},
	"namespaces":                   {"Namespace", "v1"},
	"leases":                       {"Lease", "coordination.k8s.io/v1"},
	"servicel2statuses":            {"ServiceL2Status", "metallb.io/v1beta1"},
	"l2advertisements":             {"L2Advertisement", "metallb.io/v1beta1"},
	"ciliuml2announcementpolicies": {"CiliumL2AnnouncementPolicy", "cilium.io/v2alpha1"},
	"arpguardnodes":                {"ArpGuardNode", "arp-guard.io/v1alpha1"},
}

func kindOf(res string) (kind, apiVersion string) {
	if k, ok := kinds[res]; ok {
		return k[0], k[1]
	}
	return "Object", "v1"
}

func newStore() *store {
	s := &store{rv: 100, objs: map[objKey]object{}, changed: make(chan struct{})}
	// Every cluster has it: the guard's API check GETs it.
	s.apply("services", object{
		"metadata": object{"name": "kubernetes", "namespace": "default"},
		"spec": object{"type": "ClusterIP", "clusterIP": "10.96.0.1",
			"ports": []any{object{"name": "https", "port": 443, "protocol": "TCP"}}},
	})
	return s
}

func meta(o object) object {
	m, _ := o["metadata"].(object)
	if m == nil {
		return object{}
	}
	return m
}

func str(o object, k string) string {
	s, _ := o[k].(string)
	return s
}

// withMeta copies `o` with kind, apiVersion and the server's metadata set.
func withMeta(res string, o object, rv int64, prev object) object {
	c := object{}
	for k, v := range o {
		c[k] = v
	}
	m := object{}
	for k, v := range meta(o) {
		m[k] = v
	}
	kind, apiVersion := kindOf(res)
	c["kind"], c["apiVersion"] = kind, apiVersion
	m["resourceVersion"] = strconv.FormatInt(rv, 10)
	if prev != nil {
		m["uid"] = meta(prev)["uid"]
		m["creationTimestamp"] = meta(prev)["creationTimestamp"]
	}
	if _, ok := m["uid"]; !ok {
		m["uid"] = fmt.Sprintf("00000000-0000-4000-8000-%012d", rv)
	}
	if _, ok := m["creationTimestamp"]; !ok {
		m["creationTimestamp"] = "2026-11-30T10:00:00Z"
	}
	c["metadata"] = m
	return c
}

// notify wakes every watch (with s.mu held).
func (s *store) notify() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// apply creates or replaces an object of collection `res`; its new rv.
func (s *store) apply(res string, o object) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := meta(o)
	k := objKey{res, str(m, "namespace"), str(m, "name")}
	s.rv++
	prev := s.objs[k]
	stored := withMeta(res, o, s.rv, prev)
	s.objs[k] = stored
	typ := "ADDED"
	if prev != nil {
		typ = "MODIFIED"
	}
	s.history = append(s.history, event{typ: typ, res: res, rv: s.rv, obj: stored, prev: prev})
	s.notify()
	return s.rv
}

// remove deletes an object; false if there was none.
func (s *store) remove(res, ns, name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := objKey{res, ns, name}
	prev, ok := s.objs[k]
	if !ok {
		return false
	}
	delete(s.objs, k)
	s.rv++
	gone := withMeta(res, prev, s.rv, prev)
	s.history = append(s.history, event{typ: "DELETED", res: res, rv: s.rv, obj: gone})
	s.notify()
	return true
}

// compact makes every resourceVersion so far too old to watch from.
func (s *store) compact() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.compacted = s.rv + 1
	return s.compacted
}

// list returns the objects of `res` (in `ns` unless "") that `keep` keeps,
// sorted by namespace and name, and the resourceVersion they were read at.
func (s *store) list(res, ns string, keep func(object) bool) ([]object, int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var keys []objKey
	for k, o := range s.objs {
		if k.res == res && (ns == "" || k.ns == ns) && keep(o) {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].ns != keys[j].ns {
			return keys[i].ns < keys[j].ns
		}
		return keys[i].name < keys[j].name
	})
	out := make([]object, 0, len(keys))
	for _, k := range keys {
		out = append(out, s.objs[k])
	}
	return out, s.rv
}

func (s *store) get(res, ns, name string) (object, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.objs[objKey{res, ns, name}]
	return o, ok
}

// since returns the events of `res` after `rv`, the store's resourceVersion
// (what a watch has seen once it sent them) and the channel that closes at
// the next change. gone: `rv` is compacted.
func (s *store) since(res string, rv int64) (evs []event, now int64, changed <-chan struct{}, gone bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rv < s.compacted {
		return nil, s.rv, s.changed, true
	}
	i := sort.Search(len(s.history), func(i int) bool { return s.history[i].rv > rv })
	for _, e := range s.history[i:] {
		if e.res == res {
			evs = append(evs, e)
		}
	}
	return evs, s.rv, s.changed, false
}

// selector is a parsed label or field selector: every requirement holds.
type selector []requirement

type requirement struct {
	key, op string // op: = != in notin exists !
	vals    []string
}

// parseSelector reads `a=b,c!=d,e in (f,g),!h,i` (labels) or the `=`,
// `==`, `!=` terms a field selector has.
func parseSelector(s string) (selector, error) {
	var out selector
	for _, term := range splitTerms(s) {
		term = strings.TrimSpace(term)
		if term == "" {
			continue
		}
		r, err := parseTerm(term)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// splitTerms splits at the commas outside parentheses.
func splitTerms(s string) []string {
	var out []string
	depth, from := 0, 0
	for i, c := range s {
		switch c {
		case '(':
			depth++
		case ')':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, s[from:i])
				from = i + 1
			}
		}
	}
	return append(out, s[from:])
}

func parseTerm(t string) (requirement, error) {
	for _, op := range []string{" notin ", " in "} {
		if k, rest, ok := strings.Cut(t, op); ok {
			rest = strings.TrimSpace(rest)
			if !strings.HasPrefix(rest, "(") || !strings.HasSuffix(rest, ")") {
				return requirement{}, fmt.Errorf("unable to parse requirement: %q", t)
			}
			var vals []string
			for _, v := range strings.Split(rest[1:len(rest)-1], ",") {
				vals = append(vals, strings.TrimSpace(v))
			}
			return requirement{strings.TrimSpace(k), strings.TrimSpace(op), vals}, nil
		}
	}
	for _, op := range []string{"!=", "==", "="} {
		if k, v, ok := strings.Cut(t, op); ok {
			if op == "==" {
				op = "="
			}
			return requirement{strings.TrimSpace(k), op, []string{strings.TrimSpace(v)}}, nil
		}
	}
	if strings.HasPrefix(t, "!") {
		return requirement{strings.TrimSpace(t[1:]), "!", nil}, nil
	}
	return requirement{t, "exists", nil}, nil
}

// matches: every requirement holds for `value` (has: the key is present).
func (sel selector) matches(value func(key string) (string, bool)) bool {
	for _, r := range sel {
		v, has := value(r.key)
		ok := false
		switch r.op {
		case "=":
			ok = has && v == r.vals[0]
		case "!=":
			ok = !has || v != r.vals[0]
		case "in":
			ok = has && contains(r.vals, v)
		case "notin":
			ok = !has || !contains(r.vals, v)
		case "exists":
			ok = has
		case "!":
			ok = !has
		}
		if !ok {
			return false
		}
	}
	return true
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if x == y {
			return true
		}
	}
	return false
}

// labelValue reads a label of `o`.
func labelValue(o object) func(string) (string, bool) {
	labels, _ := meta(o)["labels"].(object)
	return func(k string) (string, bool) {
		v, ok := labels[k].(string)
		return v, ok
	}
}

// fieldValue reads the fields the real server selects on (an unknown one
// is refused when the selector is parsed: checkFields).
func fieldValue(o object) func(string) (string, bool) {
	return func(k string) (string, bool) {
		switch k {
		case "metadata.name":
			return str(meta(o), "name"), true
		case "metadata.namespace":
			return str(meta(o), "namespace"), true
		case "spec.type":
			spec, _ := o["spec"].(object)
			return str(spec, "type"), true
		}
		return "", false
	}
}

// checkFields refuses a field the server cannot select on, in the real
// server's words.
func checkFields(sel selector) error {
	for _, r := range sel {
		switch r.key {
		case "metadata.name", "metadata.namespace", "spec.type":
		default:
			return fmt.Errorf("field label not supported: %s", r.key)
		}
	}
	return nil
}
