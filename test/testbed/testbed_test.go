package testbed

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestUnescapeMount(t *testing.T) {
	for in, want := range map[string]string{
		`/run/a`:           "/run/a",
		`/run/with\040sp`:  "/run/with sp",
		`/x\011tab\134bsl`: "/x\ttab\\bsl",
	} {
		if got := unescapeMount(in); got != want {
			t.Errorf("unescapeMount(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestPKI checks the generated certificates chain to the CA and carry what
// the components check: SANs for 127.0.0.1 and the node group for kubelet.
func TestPKI(t *testing.T) {
	dir := t.TempDir()
	p, err := NewPKI(dir, "node-x")
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(p.Cert("ca"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	load := func(name string) *x509.Certificate {
		kp, err := tls.LoadX509KeyPair(p.Cert(name), p.Key(name))
		if err != nil {
			t.Fatal(err)
		}
		c, err := x509.ParseCertificate(kp.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	api := load("apiserver")
	if _, err := api.Verify(x509.VerifyOptions{Roots: pool, DNSName: "127.0.0.1"}); err != nil {
		t.Errorf("apiserver cert for 127.0.0.1: %v", err)
	}
	kc := load("kubelet-client")
	if kc.Subject.CommonName != "system:node:node-x" || len(kc.Subject.Organization) != 1 || kc.Subject.Organization[0] != "system:nodes" {
		t.Errorf("kubelet client subject %v", kc.Subject)
	}
	if _, err := kc.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("kubelet client cert: %v", err)
	}
	cfg, err := p.Kubeconfig("admin", "https://127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(cfg)
	if !strings.Contains(string(b), filepath.Join(dir, "admin.crt")) {
		t.Errorf("kubeconfig does not reference the admin cert:\n%s", b)
	}
}

func TestStopOrder(t *testing.T) {
	if stopOrder("/x/pids/kubelet.pid") >= stopOrder("/x/pids/containerd.pid") {
		t.Error("kubelet must stop before containerd")
	}
	if stopOrder("/x/pids/containerd.pid") >= stopOrder("/x/pids/coordino-daemon.pid") {
		t.Error("containerd (and its pods' DELs) must stop before the Coordino daemon")
	}
}
