package harness

import (
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// APIProxy makes the API server, listening on the host's loopback, reachable
// from inside a node netns (whose loopback is its own) at the same
// 127.0.0.1 address the server's certificate names. Cut and Restore make
// the API server unreachable for that node and reachable again: open
// connections are reset and new ones refused, as when the server is down.
type APIProxy struct {
	nodeNS ns.NetNS
	target string // host-side address
	// Addr is the node-side address.
	Addr string

	mu    sync.Mutex
	l     net.Listener
	conns map[net.Conn]bool
}

// NewAPIProxy listens inside nodeNS and forwards to target (host:port on
// the host); it is cut when the test ends.
func NewAPIProxy(t testing.TB, nodeNS ns.NetNS, target string) *APIProxy {
	t.Helper()
	p := &APIProxy{nodeNS: nodeNS, target: target, conns: map[net.Conn]bool{}}
	if err := p.listen("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	p.Addr = p.l.Addr().String()
	t.Cleanup(p.Cut)
	return p
}

func (p *APIProxy) listen(addr string) error {
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

func (p *APIProxy) serve(l net.Listener) {
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
func (p *APIProxy) Cut() {
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
func (p *APIProxy) Restore(t testing.TB) {
	t.Helper()
	if err := p.listen(p.Addr); err != nil {
		t.Fatal(err)
	}
}

// APIHostPort is the API server's address from its rest.Config.
func APIHostPort(cfg *rest.Config) string {
	h := strings.TrimPrefix(strings.TrimPrefix(cfg.Host, "https://"), "http://")
	return strings.TrimSuffix(h, "/")
}

// WriteKubeconfig writes a kubeconfig reaching the API server at server
// (e.g. a node-side proxy address) with cfg's credentials.
func WriteKubeconfig(t testing.TB, cfg *rest.Config, server, path string) {
	t.Helper()
	read := func(data []byte, file string) []byte {
		if len(data) > 0 || file == "" {
			return data
		}
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: "https://" + server, CertificateAuthorityData: read(cfg.CAData, cfg.CAFile),
		TLSServerName: cfg.ServerName}
	kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken,
		ClientCertificateData: read(cfg.CertData, cfg.CertFile), ClientKeyData: read(cfg.KeyData, cfg.KeyFile)}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	kc.CurrentContext = "c"
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
}
