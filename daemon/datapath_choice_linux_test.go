package daemon

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/coordino/coordino/daemon/config"
	"github.com/coordino/coordino/daemon/datapath"
	"github.com/coordino/coordino/daemon/inspect"
	"github.com/coordino/coordino/daemon/internal/testnet"
	"github.com/coordino/coordino/daemon/nftdp"
	inspectv1 "github.com/coordino/coordino/proto/inspect/v1"
	"github.com/coordino/coordino/test/privileged"
)

// The daemon's tests run in a private node netns when root.
func TestMain(m *testing.M) { testnet.Main(m) }

const fallbackMessage = "the eBPF datapath cannot run on this node; enforcing NetworkPolicy with nftables (--datapath=auto)"

// TestAutoFallsBackToNFTables starts the daemon with --datapath=auto where
// the eBPF datapath cannot load, two ways: a BPF dir on no bpf filesystem
// (as on a host that mounts none), and the verifier refusing a program.
// The daemon comes up enforcing with nftables, says why once in its log,
// and shows it in status and in a metric.
func TestAutoFallsBackToNFTables(t *testing.T) {
	privileged.Require(t)
	t.Run("no bpffs", func(t *testing.T) {
		testFallback(t, nil, "is not on a bpf filesystem")
	})
	t.Run("verifier refusal", func(t *testing.T) {
		refuse := func(datapath.Config) (*datapath.Datapath, error) {
			// A real refusal: a program without an exit.
			prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SocketFilter, License: "GPL",
				Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0)}})
			if err == nil {
				prog.Close()
				t.Fatal("the verifier took a program without an exit")
			}
			return nil, &datapath.LoadError{Err: err}
		}
		testFallback(t, refuse, "load program")
	})
}

// TestEBPFDoesNotFallBack: --datapath=ebpf asks for eBPF only; where it
// cannot load, the daemon does not start.
func TestEBPFDoesNotFallBack(t *testing.T) {
	privileged.Require(t)
	dir := t.TempDir()
	o, err := config.Parse([]string{"--standalone", "--node-name", "n1", "--pod-cidr", "10.244.7.0/24", "--datapath", "ebpf",
		"--run-dir", filepath.Join(dir, "run"), "--state-dir", filepath.Join(dir, "state"),
		"--bpf-dir", filepath.Join(dir, "bpf"), "--metrics-addr", "127.0.0.1:0"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	p, err := start(context.Background(), o, zap.NewNop())
	defer p.stop()
	var refused *datapath.LoadError
	if !errors.As(err, &refused) {
		t.Fatalf("start = %v, want the eBPF load error", err)
	}
	if ok, _ := nftdp.Installed(); ok {
		t.Error("the nftables table was installed with --datapath=ebpf")
	}
}

func testFallback(t *testing.T, open func(datapath.Config) (*datapath.Datapath, error), reason string) {
	if open != nil {
		openEBPF = open
		t.Cleanup(func() { openEBPF = datapath.Open })
	}
	dir := t.TempDir()
	o, err := config.Parse([]string{"--standalone", "--node-name", "n1", "--pod-cidr", "10.244.7.0/24",
		"--run-dir", filepath.Join(dir, "run"), "--state-dir", filepath.Join(dir, "state"),
		"--bpf-dir", filepath.Join(dir, "bpf"), "--metrics-addr", "127.0.0.1:0"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.Datapath != "auto" {
		t.Fatalf("default --datapath = %q", o.Datapath)
	}
	core, logs := observer.New(zap.InfoLevel)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p, err := start(ctx, o, zap.New(core))
	defer p.stop()
	t.Cleanup(func() { _ = nftdp.Remove() })
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	if p.choice.kind != "nftables" || !strings.Contains(p.choice.fallback, reason) || p.dp != nil {
		t.Fatalf("choice %+v (eBPF %v), want nftables because %q", p.choice, p.dp, reason)
	}
	if ok, err := nftdp.Installed(); !ok || err != nil {
		t.Fatalf("nftables table installed = %v, %v", ok, err)
	}
	if n := logs.FilterMessage(fallbackMessage).Len(); n != 1 {
		t.Errorf("fallback logged %d times, want once", n)
	}
	// coordinoctl status reads this.
	conn, err := grpc.NewClient("unix://"+filepath.Join(o.RunDir, inspect.SocketName), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	st, err := inspectv1.NewInspectorClient(conn).GetStatus(ctx, &inspectv1.GetStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.Datapath != "nftables" || !strings.Contains(st.DatapathFallback, reason) || st.AttachMode != "nftables" || st.Verdict != "ok" {
		t.Errorf("status: datapath %q fallback %q attach %q verdict %q problems %v", st.Datapath, st.DatapathFallback, st.AttachMode, st.Verdict, st.Problems)
	}
	addr, err := os.ReadFile(filepath.Join(o.RunDir, MetricsAddrFile))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + strings.TrimSpace(string(addr)) + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(body), `coordino_datapath_info{datapath="nftables",fallback="true"} 1`) {
		t.Errorf("metrics lack the fallback:\n%s", grepLines(string(body), "coordino_datapath"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestEBPFRemovesLeftNFTablesTable: a node switched from nftables to eBPF
// must not keep enforcing the nftables run's policy beside the new one.
func TestEBPFRemovesLeftNFTablesTable(t *testing.T) {
	privileged.Require(t)
	dir := t.TempDir()
	args := func(datapath string, bpfDir string) *config.Options {
		o, err := config.Parse([]string{"--standalone", "--node-name", "n1", "--pod-cidr", "10.244.7.0/24", "--datapath", datapath,
			"--run-dir", filepath.Join(dir, "run"), "--state-dir", filepath.Join(dir, "state"),
			"--bpf-dir", bpfDir, "--metrics-addr", "127.0.0.1:0"}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	p, err := start(context.Background(), args("nftables", filepath.Join(dir, "bpf")), zap.NewNop())
	p.stop()
	if err != nil {
		t.Fatal(err)
	}
	if ok, _ := nftdp.Installed(); !ok {
		t.Fatal("no nftables table after an nftables run")
	}
	t.Cleanup(func() { _ = nftdp.Remove() })
	p, err = start(context.Background(), args("ebpf", testnet.BPFDir(t)), zap.NewNop())
	defer p.stop()
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := nftdp.Installed(); ok || err != nil {
		t.Errorf("nftables table still installed under eBPF (%v)", err)
	}
}
