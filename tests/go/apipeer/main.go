// Command apipeer is a Kubernetes-API-like server for arp-guard's tests,
// built from Go's standard library only: kube-apiserver is Go's net/http,
// and this peer serves a watch the way net/http does (chunked JSON lines
// flushed as they come, the end of a watch by the server, keep-alive
// between requests, TLS offering h2 and http/1.1 by ALPN, 1xx responses).
//
// It serves lists (with selectors and pages), single GETs and watches of an
// in-memory store (store.go, api.go, watch.go) that the test changes through
// stdin, one JSON command a line, each answered by one JSON line on stdout
// (control.go). It prints its listening address as its first line on stdout
// and exits when stdin closes, so that it never outlives the test.
//
//	apipeer -listen 203.0.113.1:6443 [-cert server.crt -key server.key]
package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"sync"
	"time"
)

// connInfo is what the peer records of one accepted connection.
type connInfo struct {
	ID     int64  `json:"id"`
	Remote string `json:"remote"`
	// ALPN is the protocol TLS negotiated ("" when the client offered none).
	ALPN string `json:"alpn"`
	// Proto is the HTTP version of its requests ("HTTP/1.1", "HTTP/2.0").
	Proto    string `json:"proto"`
	Requests int    `json:"requests"`
	Watches  int    `json:"watches"`
	// ClosedByServer: closed by the peer after a watch (closeAfterWatch).
	ClosedByServer bool `json:"closedByServer"`
	Closed         bool `json:"closed"`

	closeOnIdle bool
	conn        net.Conn
}

type ctxKey struct{}

// peer is the whole server: its store, its behaviours and its records.
type peer struct {
	store *store

	mu       sync.Mutex
	mode     mode
	conns    map[net.Conn]*connInfo
	order    []*connInfo
	requests []*reqInfo
	start    time.Time
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on")
	cert := flag.String("cert", "", "server certificate (PEM); empty: plain HTTP")
	key := flag.String("key", "", "server key (PEM)")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("apipeer: ")

	p := &peer{
		store: newStore(),
		mode:  defaultMode(),
		conns: map[net.Conn]*connInfo{},
		start: time.Now(),
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatalf("listen: %v", err)
	}
	srv := &http.Server{
		Handler: p,
		// As kube-apiserver's secure serving sets them.
		ReadHeaderTimeout: 32 * time.Second,
		IdleTimeout:       90 * time.Second,
		MaxHeaderBytes:    1 << 20,
		ConnContext:       p.connContext,
		ConnState:         p.connState,
	}
	fmt.Println(ln.Addr().String())
	go func() {
		if *cert == "" {
			err = srv.Serve(ln)
		} else {
			// Offered in this order, as kube-apiserver offers them: a client
			// that offers h2 gets HTTP/2 (net/http configures it itself).
			srv.TLSConfig = &tls.Config{NextProtos: []string{"h2", "http/1.1"}}
			err = srv.ServeTLS(ln, *cert, *key)
		}
		if err != http.ErrServerClosed {
			log.Fatalf("serve: %v", err)
		}
	}()
	p.control(os.Stdin, os.Stdout)
	// stdin closed: the test is over.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = srv.Shutdown(ctx)
}

// connContext records a new connection and hands its record to its requests.
func (p *peer) connContext(ctx context.Context, c net.Conn) context.Context {
	p.mu.Lock()
	defer p.mu.Unlock()
	info := &connInfo{ID: int64(len(p.order)), Remote: c.RemoteAddr().String(), conn: c}
	p.conns[c] = info
	p.order = append(p.order, info)
	return context.WithValue(ctx, ctxKey{}, info)
}

// connState closes a connection marked to close once its watch is over
// (the server closing an idle keep-alive connection between two watches),
// and notes closed ones.
func (p *peer) connState(c net.Conn, s http.ConnState) {
	p.mu.Lock()
	defer p.mu.Unlock()
	info := p.conns[c]
	if info == nil {
		return
	}
	switch s {
	case http.StateIdle:
		if info.closeOnIdle {
			info.ClosedByServer = true
			_ = c.Close()
		}
	case http.StateClosed, http.StateHijacked:
		info.Closed = true
		delete(p.conns, c)
	}
}

// closeAll closes every open connection (the server restarting, say).
func (p *peer) closeAll() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for c, info := range p.conns {
		info.ClosedByServer = true
		_ = c.Close()
		n++
	}
	return n
}

// ServeHTTP records the request on its connection and routes it (api.go).
func (p *peer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	info, _ := r.Context().Value(ctxKey{}).(*connInfo)
	ri := &reqInfo{Method: r.Method, URI: r.URL.RequestURI(), Proto: r.Proto, StartMs: p.ms()}
	p.mu.Lock()
	if info != nil {
		info.Requests++
		info.Proto = r.Proto
		if r.TLS != nil {
			info.ALPN = r.TLS.NegotiatedProtocol
		}
		ri.Conn = info.ID
	}
	p.requests = append(p.requests, ri)
	m := p.mode
	p.mu.Unlock()
	p.serve(w, r, ri, info, m)
	p.mu.Lock()
	ri.EndMs = p.ms()
	p.mu.Unlock()
}

func (p *peer) ms() int64 {
	return time.Since(p.start).Milliseconds()
}
