package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// mode is what the test chose of the peer's behaviours (control.go).
type mode struct {
	// Informational: a 103 Early Hints before every answer's final status.
	Informational bool `json:"informational"`
	// Split: each watch line written in pieces of 1..Split bytes, each
	// flushed (its own chunk) and followed by SplitDelayMs. 0: a line
	// whole, the lines of one burst in one flush (as kube-apiserver does).
	Split        int `json:"split"`
	SplitDelayMs int `json:"splitDelayMs"`
	// CloseAfterWatch: a connection whose watch the server ended is closed
	// once idle (without a `Connection: close`: the client finds it closed
	// when it sends its next request).
	CloseAfterWatch bool `json:"closeAfterWatch"`
	// BookmarkMs: a bookmark this often on a watch that allows them (the
	// real server: about every minute, and one 2 s before the watch's end).
	BookmarkMs int `json:"bookmarkMs"`
}

func defaultMode() mode {
	return mode{BookmarkMs: 60_000}
}

// reqInfo is what the peer records of one request.
type reqInfo struct {
	Conn     int64  `json:"conn"`
	Method   string `json:"method"`
	URI      string `json:"uri"`
	Proto    string `json:"proto"`
	Resource string `json:"resource"`
	// Name: the object's, for a GET of one (else "": a list or watch).
	Name    string `json:"name"`
	Watch   bool   `json:"watch"`
	Status  int    `json:"status"`
	StartMs int64  `json:"startMs"`
	EndMs   int64  `json:"endMs"`
	// End: how a watch ended: "timeout" (the server, at timeoutSeconds),
	// "client" (the client went away), "gone" (410), "" while it runs.
	End       string `json:"end"`
	Events    int    `json:"events"`
	Bookmarks int    `json:"bookmarks"`
	// Chunks: flushes of its body (each one chunk on the wire).
	Chunks int `json:"chunks"`
}

// path is a request's collection (or object) as the API lays them out.
type path struct {
	res, ns, name string
}

// parsePath reads /api/v1[/namespaces/NS]/RES[/NAME] and the same under
// /apis/GROUP/VERSION.
func parsePath(p string) (path, bool) {
	var rest string
	switch {
	case strings.HasPrefix(p, "/api/v1/"):
		rest = p[len("/api/v1/"):]
	case strings.HasPrefix(p, "/apis/"):
		parts := strings.SplitN(p[len("/apis/"):], "/", 3)
		if len(parts) < 3 {
			return path{}, false
		}
		rest = parts[2]
	default:
		return path{}, false
	}
	parts := strings.Split(rest, "/")
	switch {
	case len(parts) == 1:
		return path{res: parts[0]}, true
	case len(parts) == 3 && parts[0] == "namespaces":
		return path{ns: parts[1], res: parts[2]}, true
	case len(parts) == 4 && parts[0] == "namespaces":
		return path{ns: parts[1], res: parts[2], name: parts[3]}, true
	case len(parts) == 2:
		return path{res: parts[0], name: parts[1]}, true
	}
	return path{}, false
}

// status writes a Kubernetes Status with `code`.
func status(w http.ResponseWriter, code int, reason, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(object{
		"kind": "Status", "apiVersion": "v1", "metadata": object{},
		"status": "Failure", "message": message, "reason": reason, "code": code,
	})
}

// serve answers one request: the headers kube-apiserver sends, a 1xx first
// when asked, then a list, an object or a watch.
func (p *peer) serve(w http.ResponseWriter, r *http.Request, ri *reqInfo, info *connInfo, m mode) {
	h := w.Header()
	h.Set("Audit-Id", fmt.Sprintf("a-%d-%d", ri.Conn, ri.StartMs))
	h.Set("Cache-Control", "no-cache, private")
	h.Set("X-Kubernetes-Pf-Flowschema-Uid", "5f6a2cd1-0000-4000-8000-000000000001")
	h.Set("X-Kubernetes-Pf-Prioritylevel-Uid", "5f6a2cd1-0000-4000-8000-000000000002")
	if m.Informational {
		h.Set("Link", "</openapi/v3>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
	}
	pa, ok := parsePath(r.URL.Path)
	p.note(ri, func() { ri.Resource, ri.Name = pa.res, pa.name })
	q := r.URL.Query()
	switch {
	case !ok:
		p.answer(w, ri, http.StatusNotFound, "NotFound", "the server could not find the requested resource")
	case r.Method != http.MethodGet:
		p.answer(w, ri, http.StatusMethodNotAllowed, "MethodNotAllowed",
			fmt.Sprintf("the peer serves only GET (asked %s)", r.Method))
	case pa.name != "":
		p.getOne(w, ri, pa)
	case q.Get("watch") == "true" || q.Get("watch") == "1":
		p.note(ri, func() { ri.Watch = true })
		if info != nil {
			p.note(ri, func() { info.Watches++ })
		}
		p.watch(w, r, ri, info, pa, m)
	default:
		p.list(w, r, ri, pa)
	}
}

// note changes the records under the peer's lock.
func (p *peer) note(_ *reqInfo, f func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f()
}

func (p *peer) answer(w http.ResponseWriter, ri *reqInfo, code int, reason, message string) {
	p.note(ri, func() { ri.Status = code })
	status(w, code, reason, message)
}

func (p *peer) getOne(w http.ResponseWriter, ri *reqInfo, pa path) {
	o, ok := p.store.get(pa.res, pa.ns, pa.name)
	if !ok {
		_, apiVersion := kindOf(pa.res)
		what := pa.res
		if group, _, grouped := strings.Cut(apiVersion, "/"); grouped {
			what += "." + group
		}
		p.answer(w, ri, http.StatusNotFound, "NotFound", fmt.Sprintf("%s %q not found", what, pa.name))
		return
	}
	p.note(ri, func() { ri.Status = http.StatusOK })
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(o)
}

// filter is what a list or watch covers: its selectors (400 when one does
// not parse or selects on a field the server does not have).
func (p *peer) filter(w http.ResponseWriter, r *http.Request, ri *reqInfo) (func(object) bool, bool) {
	q := r.URL.Query()
	labels, err := parseSelector(q.Get("labelSelector"))
	if err != nil {
		p.answer(w, ri, http.StatusBadRequest, "BadRequest", err.Error())
		return nil, false
	}
	fields, err := parseSelector(q.Get("fieldSelector"))
	if err == nil {
		err = checkFields(fields)
	}
	if err != nil {
		p.answer(w, ri, http.StatusBadRequest, "BadRequest", err.Error())
		return nil, false
	}
	return func(o object) bool {
		return labels.matches(labelValue(o)) && fields.matches(fieldValue(o))
	}, true
}

// list answers one page: `limit` objects from the `continue` token on.
func (p *peer) list(w http.ResponseWriter, r *http.Request, ri *reqInfo, pa path) {
	keep, ok := p.filter(w, r, ri)
	if !ok {
		return
	}
	q := r.URL.Query()
	items, rv := p.store.list(pa.res, pa.ns, keep)
	from := 0
	if c := q.Get("continue"); c != "" {
		raw, err := base64.RawURLEncoding.DecodeString(c)
		n, err2 := strconv.Atoi(string(raw))
		if err != nil || err2 != nil || n < 0 || n > len(items) {
			p.answer(w, ri, http.StatusBadRequest, "BadRequest", "invalid continue token")
			return
		}
		from = n
	}
	items = items[from:]
	lm := object{"resourceVersion": strconv.FormatInt(rv, 10)}
	if limit, err := strconv.Atoi(q.Get("limit")); err == nil && limit > 0 && limit < len(items) {
		lm["continue"] = base64.RawURLEncoding.EncodeToString([]byte(strconv.Itoa(from + limit)))
		lm["remainingItemCount"] = len(items) - limit
		items = items[:limit]
	}
	// Items of a list carry no kind or apiVersion (the list's say them).
	out := make([]object, 0, len(items))
	for _, o := range items {
		c := object{}
		for k, v := range o {
			if k != "kind" && k != "apiVersion" {
				c[k] = v
			}
		}
		out = append(out, c)
	}
	kind, apiVersion := kindOf(pa.res)
	p.note(ri, func() { ri.Status = http.StatusOK })
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(object{
		"kind": kind + "List", "apiVersion": apiVersion, "metadata": lm, "items": out,
	})
}
