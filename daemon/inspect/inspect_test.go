package inspect

import (
	"context"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/coordino/coordino/daemon/datapath"
	"github.com/coordino/coordino/daemon/ipam"
	"github.com/coordino/coordino/daemon/store"
	inspectv1 "github.com/coordino/coordino/proto/inspect/v1"
)

func TestFindEndpoint(t *testing.T) {
	eps := []*inspectv1.Endpoint{
		{Key: "n/c0ffee11/eth0", ContainerId: "c0ffee11", PodNamespace: "default", PodName: "web"},
		{Key: "n/c0ffee22/eth0", ContainerId: "c0ffee22", PodNamespace: "prod", PodName: "web"},
		{Key: "n/deadbeef/eth0", ContainerId: "deadbeef", PodNamespace: "default", PodName: "db"},
	}
	for q, want := range map[string]string{
		"db": "deadbeef", "default/web": "c0ffee11", "prod/web": "c0ffee22", "c0ffee22": "c0ffee22",
		"dead": "deadbeef", "n/c0ffee11/eth0": "c0ffee11",
	} {
		e, err := findEndpoint(eps, q)
		if err != nil || e.ContainerId != want {
			t.Errorf("findEndpoint(%q) = %v, %v; want %s", q, e, err, want)
		}
	}
	for q, code := range map[string]codes.Code{
		"web": codes.FailedPrecondition, "c0ffee": codes.FailedPrecondition, "dea": codes.NotFound,
		"nosuch": codes.NotFound, "": codes.InvalidArgument,
	} {
		if _, err := findEndpoint(eps, q); status.Code(err) != code {
			t.Errorf("findEndpoint(%q): %v, want %v", q, err, code)
		}
	}
}

func TestHistoryKeepsNewestInOrder(t *testing.T) {
	h := newHistory(4)
	t0 := time.Unix(1000, 0)
	for i := range 6 {
		h.add(datapath.Flow{Time: t0.Add(time.Duration(i) * time.Second), DstPort: uint16(i)})
	}
	got := h.since(0)
	if len(got) != 4 || got[0].DstPort != 2 || got[3].DstPort != 5 {
		t.Fatalf("history = %v", got)
	}
	if got := h.since(t0.Add(4 * time.Second).UnixNano()); len(got) != 2 || got[0].DstPort != 4 {
		t.Fatalf("since = %v", got)
	}
}

func TestStatusVerdictForAStuckDeleteQueue(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "state"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	pool, err := ipam.NewPool([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")})
	if err != nil {
		t.Fatal(err)
	}
	queue := filepath.Join(dir, "delete-queue")
	os.MkdirAll(queue, 0o700)
	s := New(Config{Standalone: true, AttachMode: "tc", RunDir: dir, QueueDir: queue, Store: st, Pool: pool})
	status := func() *inspectv1.Status {
		t.Helper()
		got, err := s.GetStatus(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	// Without a datapath the node is degraded already; a fresh queue entry adds nothing.
	entry := filepath.Join(queue, "00000000000000000001-x.del")
	os.WriteFile(entry, []byte("x"), 0o600)
	os.WriteFile(filepath.Join(queue, "00000000000000000000-y.del.bad"), []byte("x"), 0o600)
	if got := status(); got.DeleteQueue != 1 || len(got.Problems) != 1 || got.Verdict != "degraded" {
		t.Fatalf("fresh entry: %v", got)
	}
	old := time.Now().Add(-2 * queueStuckAfter)
	os.Chtimes(entry, old, old)
	got := status()
	if got.DeleteQueue != 1 || len(got.Problems) != 2 || !strings.Contains(got.Problems[1], "delete queue not draining") {
		t.Fatalf("stuck entry: %v", got)
	}
}

func TestLogRingKeepsNewestLinesWithinBound(t *testing.T) {
	base, _ := zap.NewDevelopment(zap.IncreaseLevel(zap.InfoLevel), zap.ErrorOutput(zapcore.AddSync(io.Discard)))
	log, ring := RecordLogs(base.WithOptions(zap.WrapCore(func(zapcore.Core) zapcore.Core {
		return zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(io.Discard), zap.InfoLevel)
	})))
	log.Debug("hidden")
	big := strings.Repeat("x", 4096)
	for i := range 400 {
		log.Info("line", zap.Int("i", i), zap.String("pad", big))
	}
	out := string(ring.Bytes())
	if strings.Contains(out, "hidden") || !strings.Contains(out, `"i":399`) || strings.Contains(out, `"i":0,`) || len(out) > logRingBytes {
		t.Fatalf("ring holds %d bytes, newest kept: %t", len(out), strings.Contains(out, `"i":399`))
	}
}

// Address pressure is judged per family over all its blocks: a full block
// beside one with room is normal; a family with nothing left fails in
// standalone mode and is degraded in Kubernetes mode, where a new block is
// on its way.
func TestAddressPressurePerFamily(t *testing.T) {
	full := ipam.Usage{Prefix: netip.MustParsePrefix("10.1.0.0/30"), Size: 2, Used: 2}
	room := ipam.Usage{Prefix: netip.MustParsePrefix("10.1.1.0/26"), Size: 62, Used: 3}
	v6 := ipam.Usage{Prefix: netip.MustParsePrefix("fd00::/122"), Size: 64, Used: 1}
	for _, tc := range []struct {
		name               string
		standalone         bool
		usage              []ipam.Usage
		failures, problems int
	}{
		{"full block beside one with room", false, []ipam.Usage{full, room, v6}, 0, 0},
		{"family full, kubernetes", false, []ipam.Usage{full, v6}, 0, 1},
		{"family full, standalone", true, []ipam.Usage{full, v6}, 1, 0},
	} {
		s := &Service{cfg: Config{Standalone: tc.standalone}}
		f, p := s.addressPressure(tc.usage, nil, nil)
		if len(f) != tc.failures || len(p) != tc.problems {
			t.Errorf("%s: failures %q, problems %q", tc.name, f, p)
		}
	}
}

// A bug report's status.json is what `coordinoctl status -o json` prints:
// zero values included, so a reader can tell "0" from "not reported".
func TestDiagnosticsStatusKeepsZeroValues(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "state"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	pool, err := ipam.NewPool([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")})
	if err != nil {
		t.Fatal(err)
	}
	queue := filepath.Join(dir, "delete-queue")
	os.MkdirAll(queue, 0o700)
	s := New(Config{Standalone: true, RunDir: dir, QueueDir: queue, Store: st, Pool: pool})
	diag, err := s.CollectDiagnostics(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range diag.Files {
		if f.Name != "status.json" {
			continue
		}
		for _, want := range []string{`"deleteQueue": 0,`, `"invalidPolicies": 0,`, `"chainedEndpoints": 0,`, `"maps": [],`} {
			if !strings.Contains(string(f.Content), want) {
				t.Errorf("status.json lacks %s:\n%s", want, f.Content)
			}
		}
		return
	}
	t.Fatal("no status.json in the diagnostics")
}

// The kernel feature table and the cross-node state come from the daemon
// through the config's hooks; a peer that cannot be reached is a problem.
func TestStatusReportsKernelFeaturesAndCrossNode(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "state"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	pool, err := ipam.NewPool([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")})
	if err != nil {
		t.Fatal(err)
	}
	queue := filepath.Join(dir, "delete-queue")
	os.MkdirAll(queue, 0o700)
	cfg := Config{Standalone: true, RunDir: dir, QueueDir: queue, Store: st, Pool: pool}
	got, err := New(cfg).GetStatus(context.Background(), nil)
	if err != nil || len(got.KernelFeatures) != 0 || got.CrossNode != nil {
		t.Fatalf("without hooks: %v %v", got, err)
	}
	cfg.KernelFeatures = func() []*inspectv1.KernelFeature {
		return []*inspectv1.KernelFeature{{Name: "netkit", Available: false, Detail: "not built", Effect: "veth pairs"}}
	}
	cfg.CrossNode = func() *inspectv1.CrossNode {
		return &inspectv1.CrossNode{Routing: "vxlan", Encryption: "none", Peers: []*inspectv1.Peer{
			{Name: "b", Addresses: []string{"192.168.0.2"}}, {Name: "c", Problem: "no address published yet"}}}
	}
	got, err = New(cfg).GetStatus(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.KernelFeatures) != 1 || got.KernelFeatures[0].Effect != "veth pairs" || got.CrossNode.GetRouting() != "vxlan" || len(got.CrossNode.Peers) != 2 {
		t.Fatalf("status = %v", got)
	}
	if !slices.Contains(got.Problems, "peer node c: no address published yet") {
		t.Fatalf("unreachable peer not a problem: %q", got.Problems)
	}
}
