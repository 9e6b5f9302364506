package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand"
	"net/http"
	"strconv"
	"time"
)

// watch streams the changes of a collection from a resourceVersion, as
// kube-apiserver's watch cache does: JSON lines in a chunked body, flushed
// once per burst, bookmarks when allowed (about every minute and one 2 s
// before the end), a 410 Expired ERROR event from a compacted
// resourceVersion, and the end of the watch at timeoutSeconds (the handler
// returns: net/http writes the last chunk and keeps the connection).
func (p *peer) watch(w http.ResponseWriter, r *http.Request, ri *reqInfo, info *connInfo, pa path, m mode) {
	keep, ok := p.filter(w, r, ri)
	if !ok {
		return
	}
	q := r.URL.Query()
	timeout := 30 * time.Minute
	if t, err := strconv.Atoi(q.Get("timeoutSeconds")); err == nil && t > 0 {
		timeout = time.Duration(t) * time.Second
	}
	bookmarks := q.Get("allowWatchBookmarks") == "true"
	var from int64
	initial := q.Get("resourceVersion") == "" || q.Get("resourceVersion") == "0"
	if !initial {
		v, err := strconv.ParseInt(q.Get("resourceVersion"), 10, 64)
		if err != nil {
			p.answer(w, ri, http.StatusBadRequest, "BadRequest", "invalid resourceVersion")
			return
		}
		from = v
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	p.note(ri, func() { ri.Status = http.StatusOK })
	out := &lines{w: w, flusher: w.(http.Flusher), m: m, p: p, ri: ri,
		rng: rand.New(rand.NewSource(ri.StartMs*1_000 + ri.Conn))}
	// The head goes out at once, before any event.
	out.flusher.Flush()
	end := p.stream(r, out, pa, keep, streamFrom{rv: from, initial: initial, bookmarks: bookmarks, timeout: timeout})
	p.note(ri, func() {
		ri.End = end
		if end == "timeout" && m.CloseAfterWatch && info != nil {
			info.closeOnIdle = true
		}
	})
}

// streamFrom is where and how a watch starts.
type streamFrom struct {
	rv        int64
	initial   bool
	bookmarks bool
	timeout   time.Duration
}

// stream writes the watch's events until its end; how it ended.
func (p *peer) stream(r *http.Request, out *lines, pa path, keep func(object) bool, s streamFrom) string {
	deadline := time.NewTimer(s.timeout)
	defer deadline.Stop()
	every := time.Duration(out.m.BookmarkMs) * time.Millisecond
	if every <= 0 {
		every = time.Minute
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	var last <-chan time.Time
	if s.timeout > 2*time.Second {
		last = time.After(s.timeout - 2*time.Second)
	}
	from := s.rv
	if s.initial {
		items, rv := p.store.list(pa.res, pa.ns, keep)
		var batch [][]byte
		for _, o := range items {
			batch = append(batch, eventLine("ADDED", o))
		}
		if out.send(batch, len(batch), 0) != nil {
			return "client"
		}
		from = rv
	}
	for {
		evs, now, changed, gone := p.store.since(pa.res, from)
		if gone {
			_ = out.send([][]byte{expired(from, now)}, 0, 0)
			return "gone"
		}
		var batch [][]byte
		for _, e := range evs {
			if typ, o, ok := seen(e, pa.ns, keep); ok {
				batch = append(batch, eventLine(typ, o))
			}
		}
		if out.send(batch, len(batch), 0) != nil {
			return "client"
		}
		from = now
		bookmark := false
		select {
		case <-changed:
		case <-tick.C:
			bookmark = s.bookmarks
		case <-last:
			bookmark = s.bookmarks
		case <-deadline.C:
			return "timeout"
		case <-r.Context().Done():
			return "client"
		}
		if bookmark && out.send([][]byte{bookmarkLine(pa.res, from)}, 0, 1) != nil {
			return "client"
		}
	}
}

// seen is an event as a watch with this namespace and selectors shows it:
// a change that makes an object match is ADDED, one that makes it stop
// matching is DELETED with its previous content at the event's version.
func seen(e event, ns string, keep func(object) bool) (string, object, bool) {
	covers := func(o object) bool {
		return o != nil && (ns == "" || str(meta(o), "namespace") == ns) && keep(o)
	}
	now := covers(e.obj)
	switch {
	case e.typ != "MODIFIED":
		return e.typ, e.obj, now
	case now && covers(e.prev):
		return "MODIFIED", e.obj, true
	case now:
		return "ADDED", e.obj, true
	case covers(e.prev):
		return "DELETED", withMeta(e.res, e.prev, e.rv, e.prev), true
	}
	return "", nil, false
}

// eventLine is `{"type":T,"object":O}` and its newline, the fields in the
// order the real server writes them (kind and apiVersion first).
func eventLine(typ string, o object) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, `{"type":%q,"object":`, typ)
	b.Write(encodeObject(o))
	b.WriteString("}\n")
	return b.Bytes()
}

func encodeObject(o object) []byte {
	rest := object{}
	for k, v := range o {
		if k != "kind" && k != "apiVersion" {
			rest[k] = v
		}
	}
	body, _ := json.Marshal(rest)
	kind, _ := json.Marshal(o["kind"])
	apiVersion, _ := json.Marshal(o["apiVersion"])
	head := fmt.Sprintf(`{"kind":%s,"apiVersion":%s`, kind, apiVersion)
	if len(body) > 2 {
		head += ","
	}
	return append([]byte(head), body[1:]...)
}

// bookmarkLine: an empty object of the collection's kind at `rv`, as the
// real server encodes one.
func bookmarkLine(res string, rv int64) []byte {
	kind, apiVersion := kindOf(res)
	o := object{"kind": kind, "apiVersion": apiVersion,
		"metadata": object{"resourceVersion": strconv.FormatInt(rv, 10), "creationTimestamp": nil}}
	switch kind {
	case "Service":
		o["spec"] = object{}
		o["status"] = object{"loadBalancer": object{}}
	case "Lease":
		o["spec"] = object{}
	}
	return eventLine("BOOKMARK", o)
}

// expired is the ERROR event of a watch from a compacted resourceVersion.
func expired(from, now int64) []byte {
	return eventLine("ERROR", object{
		"kind": "Status", "apiVersion": "v1", "metadata": object{}, "status": "Failure",
		"message": fmt.Sprintf("too old resource version: %d (%d)", from, now),
		"reason":  "Expired", "code": 410,
	})
}

// lines writes a watch's lines: a burst in one flush, or (mode Split)
// each line in small pieces, each flushed as its own chunk.
type lines struct {
	w       http.ResponseWriter
	flusher http.Flusher
	m       mode
	p       *peer
	ri      *reqInfo
	rng     *rand.Rand
}

func (l *lines) send(batch [][]byte, events, bookmarks int) error {
	if len(batch) == 0 {
		return nil
	}
	chunks := 0
	for _, line := range batch {
		for len(line) > 0 {
			n := len(line)
			if l.m.Split > 0 && n > 1 {
				if k := 1 + l.rng.Intn(l.m.Split); k < n {
					n = k
				}
			}
			if _, err := l.w.Write(line[:n]); err != nil {
				return err
			}
			line = line[n:]
			if l.m.Split > 0 {
				l.flusher.Flush()
				chunks++
				time.Sleep(time.Duration(l.m.SplitDelayMs) * time.Millisecond)
			}
		}
	}
	if l.m.Split <= 0 {
		l.flusher.Flush()
		chunks++
	}
	l.p.note(l.ri, func() {
		l.ri.Events += events
		l.ri.Bookmarks += bookmarks
		l.ri.Chunks += chunks
	})
	return nil
}
