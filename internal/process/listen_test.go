package process

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
)

func TestValidateAddr(t *testing.T) {
	for addr, ok := range map[string]bool{
		"127.0.0.1:9962": true, "0.0.0.0:9190": true, "[::1]:0": true, ":9190": true,
		"unix:/run/coordino/metrics.sock": true,
		"unix:relative.sock":              false, "127.0.0.1": false, "": false,
	} {
		if err := ValidateAddr(addr); (err == nil) != ok {
			t.Errorf("ValidateAddr(%q) = %v, want ok=%v", addr, err, ok)
		}
	}
}

// TestServeOnUnixSocket: metrics can be kept off the network entirely, on a
// root-only socket, replacing a stale socket but never another file.
func TestServeOnUnixSocket(t *testing.T) {
	m := NewServer("starting")
	sock := filepath.Join(t.TempDir(), "run", "metrics.sock")
	if err := os.MkdirAll(filepath.Dir(sock), 0o700); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, err := m.Serve(ctx, UnixPrefix+sock)
	if err != nil {
		t.Fatal(err)
	}
	if got := AddrString(addr); got != UnixPrefix+sock {
		t.Fatalf("AddrString = %q", got)
	}
	fi, err := os.Stat(sock)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v (%v), want 0600", fi.Mode(), err)
	}
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	resp, err := client.Get("http://metrics/healthz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "ok\n" {
		t.Fatalf("/healthz over the socket: %d %q", resp.StatusCode, body)
	}

	// A second daemon start finds the old socket file and replaces it.
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	if _, err := NewServer("starting").Serve(ctx2, UnixPrefix+sock); err != nil {
		t.Fatalf("replacing a stale socket: %v", err)
	}
	// Never anything that is not a socket.
	file := filepath.Join(t.TempDir(), "precious")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := NewServer("starting").Serve(ctx2, UnixPrefix+file); err == nil {
		t.Fatal("metrics listener replaced a regular file")
	}
	if b, _ := os.ReadFile(file); string(b) != "x" {
		t.Fatal("regular file was touched")
	}
}

// TestReadyz: /readyz says why it is not ready until SetReady(true), and
// /metrics serves the registry.
func TestReadyz(t *testing.T) {
	s := NewServer("restoring state")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, err := s.Serve(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + addr.String() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, body := get("/readyz"); code != http.StatusServiceUnavailable || body != "not ready: restoring state\n" {
		t.Fatalf("/readyz before ready: %d %q", code, body)
	}
	s.SetReady(true)
	if code, body := get("/readyz"); code != 200 || body != "ok\n" {
		t.Fatalf("/readyz when ready: %d %q", code, body)
	}
	if code, _ := get("/metrics"); code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
}
