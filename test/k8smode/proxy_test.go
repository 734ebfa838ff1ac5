package k8smode

import (
	"io"
	"net"
	"sync"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
)

// apiProxy makes the API server, listening on the host's loopback, reachable
// from inside a node netns (whose loopback is its own) at the same
// 127.0.0.1 address the server's certificate names. Cut and Restore make
// the API server unreachable for that node and reachable again: open
// connections are reset and new ones refused, as when the server is down.
type apiProxy struct {
	nodeNS ns.NetNS
	target string // host-side address
	addr   string // node-side address

	mu    sync.Mutex
	l     net.Listener
	conns map[net.Conn]bool
}

func newAPIProxy(t testing.TB, nodeNS ns.NetNS, target string) *apiProxy {
	t.Helper()
	p := &apiProxy{nodeNS: nodeNS, target: target, conns: map[net.Conn]bool{}}
	if err := p.listen("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	p.addr = p.l.Addr().String()
	t.Cleanup(p.Cut)
	return p
}

func (p *apiProxy) listen(addr string) error {
	var l net.Listener
	if err := p.nodeNS.Do(func(ns.NetNS) error {
		var err error
		l, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		return err
	}
	p.mu.Lock()
	p.l = l
	p.mu.Unlock()
	go p.serve(l)
	return nil
}

func (p *apiProxy) serve(l net.Listener) {
	for {
		in, err := l.Accept()
		if err != nil {
			return
		}
		// This goroutine's thread is in the host netns: the dial reaches
		// the server on the host's loopback.
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			in.Close()
			continue
		}
		p.mu.Lock()
		p.conns[in], p.conns[out] = true, true
		p.mu.Unlock()
		pipe := func(a, b net.Conn) {
			_, _ = io.Copy(a, b)
			a.Close()
			b.Close()
		}
		go pipe(in, out)
		go pipe(out, in)
	}
}

// Cut closes the listener and every proxied connection.
func (p *apiProxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.l != nil {
		p.l.Close()
		p.l = nil
	}
	for c := range p.conns {
		c.Close()
	}
	p.conns = map[net.Conn]bool{}
}

// Restore listens again on the same node-side address.
func (p *apiProxy) Restore(t testing.TB) {
	t.Helper()
	if err := p.listen(p.addr); err != nil {
		t.Fatal(err)
	}
}
