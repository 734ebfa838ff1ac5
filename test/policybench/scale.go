package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/coordino/coordino/test/harness"
)

// The -scale mode: what the number of NetworkPolicies costs the control
// plane. ADD latency (libcni, as a runtime calls it) with 0, 1,000 and
// 10,000 policies loaded through --policy-dir, every pod a new label set
// that one policy selects and another names as a peer, sequentially and
// with 16 ADDs in flight; and the time from a policy file change to the
// changed verdict on the wire at the largest size. Each datapath
// (--datapath=ebpf, nftables) has a node of its own, measured in turn
// within every round, so the ratios between them come from one run. With
// ClusterPolicies, one more configuration adds that many
// ClusterNetworkPolicies of both tiers to the largest size, many of them
// selecting the new pods.

// ScaleParams shape a -scale run.
type ScaleParams struct {
	// Sizes are the policy counts; the first is the reference of the ratios.
	Sizes []int `json:"sizes"`
	// Pods is the number of measured ADDs per size and mode.
	Pods int `json:"pods"`
	// Concurrency is the number of ADDs in flight in the concurrent mode.
	Concurrency int `json:"concurrency"`
	// Rounds: each loads every size once (order rotated) and measures
	// Pods/Rounds ADDs per mode, so drift on a shared machine hits all sizes.
	Rounds int `json:"rounds"`
	// Changes is the number of policy changes timed at the largest size.
	Changes int `json:"changes"`
	// Datapaths are the daemons' --datapath values, one node each; the
	// first is the reference of the ratios between them.
	Datapaths []string `json:"datapaths"`
	// ClusterPolicies, when > 0, adds a configuration: the largest size
	// plus this many ClusterNetworkPolicies.
	ClusterPolicies int       `json:"clusterPolicies"`
	Progress        io.Writer `json:"-"`
}

// DefaultScaleParams is the run recorded in docs/benchmarks.md.
func DefaultScaleParams() ScaleParams {
	return ScaleParams{Sizes: []int{0, 1000, 10000}, Pods: 160, Concurrency: 16, Rounds: 4, Changes: 20,
		Datapaths: []string{"ebpf", "nftables"}, ClusterPolicies: 1000}
}

// QuickScaleParams exercise every code path in seconds.
func QuickScaleParams() ScaleParams {
	return ScaleParams{Sizes: []int{0, 100}, Pods: 4, Concurrency: 4, Rounds: 1, Changes: 2,
		Datapaths: []string{"ebpf", "nftables"}, ClusterPolicies: 10}
}

// ScaleReport is the outcome of a -scale run.
type ScaleReport struct {
	Date     string      `json:"date"`
	Machine  Machine     `json:"machine"`
	Params   ScaleParams `json:"params"`
	Duration string      `json:"duration"`
	Rows     []ScaleRow  `json:"rows"`
	// Datapaths are the per-node figures, in Params.Datapaths order.
	Datapaths []DatapathScale `json:"datapaths"`
}

// DatapathScale is what one datapath's node measured besides ADD.
type DatapathScale struct {
	Datapath string `json:"datapath"`
	// LoadSeconds is how long each configuration took to load, write to
	// enforced, by policyLoad.String().
	LoadSeconds map[string]float64 `json:"loadSeconds"`
	Change      ChangeRow          `json:"change"`
	// Cut is the time from a policy file write that revokes an allowed
	// flow to the first lost exchange of an established connection on it.
	Cut ChangeRow `json:"establishedCut"`
	// Verdicts are the on-the-wire checks after ADD/DEL churn at the
	// largest size (verdicts.go).
	Verdicts VerdictRow `json:"verdicts"`
}

// ScaleRow is one (mode, policy count): ADD latency and its ratio to the
// reference size in the same mode.
type ScaleRow struct {
	Datapath string `json:"datapath"`
	Mode     string `json:"mode"`
	Policies int    `json:"policies"`
	// ClusterPolicies are the ClusterNetworkPolicies loaded besides.
	ClusterPolicies int     `json:"clusterPolicies,omitempty"`
	N               int     `json:"n"`
	Errors          int     `json:"errors"`
	P50             float64 `json:"p50_ms"`
	P99             float64 `json:"p99_ms"`
	RatioP50        float64 `json:"ratio_p50"`
	RatioP99        float64 `json:"ratio_p99"`
	// RatioDatapath is P50 over the first datapath's at the same mode
	// and configuration.
	RatioDatapath float64 `json:"ratio_p50_datapath"`
	// Daemon* are coordino-daemon's own time per ADD (its "took" log field).
	DaemonP50 float64 `json:"daemon_p50_ms"`
	DaemonP99 float64 `json:"daemon_p99_ms"`
	samples   []time.Duration
}

// ChangeRow is the time from a policy file write to the new verdict.
type ChangeRow struct {
	Policies int     `json:"policies"`
	N        int     `json:"n"`
	Errors   int     `json:"errors"`
	P50      float64 `json:"p50_ms"`
	P99      float64 `json:"p99_ms"`
}

const (
	scaleNamespace = "bench"
	scaleCIDR      = "10.194.0.0/16"
	chunkPolicies  = 500
	togglePort     = 7070
	toggleFile     = "zz-toggle.yaml"
)

// scaleBed is the node and the pod namespaces the ADDs reuse.
type scaleBed struct {
	p         ScaleParams
	datapath  string
	node      *harness.Node
	dir       string
	policyDir string
	conflist  []byte
	slots     []*harness.Pod
	seq       int
	loaded    policyLoad // policies in the files now
	// rowOf maps a measured ADD's container ID to its row.
	rowOf map[string]string
}

// policyLoad is one configuration: NetworkPolicies and
// ClusterNetworkPolicies in the policy directory.
type policyLoad struct{ NP, CNP int }

func (l policyLoad) String() string {
	if l.CNP == 0 {
		return fmt.Sprint(l.NP)
	}
	return fmt.Sprintf("%d+%d cluster", l.NP, l.CNP)
}

// RunScale runs the -scale mode and tears everything down.
func RunScale(ctx context.Context, p ScaleParams) (*ScaleReport, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("needs root (network namespaces, BPF)")
	}
	if err := harness.RequireBinaries(); err != nil {
		return nil, err
	}
	if len(p.Sizes) == 0 || p.Pods < 1 || p.Concurrency < 1 || p.Rounds < 1 || p.Changes < 0 || p.ClusterPolicies < 0 {
		return nil, fmt.Errorf("bad parameters %+v", p)
	}
	if len(p.Datapaths) == 0 {
		p.Datapaths = []string{"ebpf"}
	}
	started := time.Now()
	dir, err := os.MkdirTemp("", "policyscale-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	var beds []*scaleBed
	defer func() {
		for _, b := range beds {
			b.close()
		}
	}()
	for _, dp := range p.Datapaths {
		sub := filepath.Join(dir, dp)
		b := &scaleBed{p: p, datapath: dp, dir: sub, policyDir: filepath.Join(sub, "policies"), rowOf: map[string]string{}}
		beds = append(beds, b)
		if err := b.setup(); err != nil {
			return nil, fmt.Errorf("%s node: %w", dp, err)
		}
	}
	r := &ScaleReport{Date: started.UTC().Format(time.RFC3339), Machine: machine(), Params: p}
	for _, b := range beds {
		r.Datapaths = append(r.Datapaths, DatapathScale{Datapath: b.datapath, LoadSeconds: map[string]float64{}})
	}
	largest := slices.Max(p.Sizes)
	var loads []policyLoad
	for _, size := range p.Sizes {
		loads = append(loads, policyLoad{NP: size})
	}
	if p.ClusterPolicies > 0 {
		loads = append(loads, policyLoad{NP: largest, CNP: p.ClusterPolicies})
	}
	modes := []struct {
		name    string
		workers int
	}{{"sequential", 1}, {fmt.Sprintf("concurrent-%d", p.Concurrency), p.Concurrency}}
	rows := map[string]*ScaleRow{}
	row := func(dp, mode string, l policyLoad) *ScaleRow {
		k := fmt.Sprint(dp, mode, l)
		if rows[k] == nil {
			rows[k] = &ScaleRow{Datapath: dp, Mode: mode, Policies: l.NP, ClusterPolicies: l.CNP}
		}
		return rows[k]
	}
	perRound := max(1, p.Pods/p.Rounds)
	for round := range p.Rounds {
		for k := range loads {
			l := loads[(k+round)%len(loads)]
			for i, b := range beds {
				took, err := b.load(ctx, l)
				if err != nil {
					return nil, fmt.Errorf("%s: load %s policies: %w", b.datapath, l, err)
				}
				r.Datapaths[i].LoadSeconds[l.String()] = max(r.Datapaths[i].LoadSeconds[l.String()], took.Seconds())
			}
			for _, m := range modes {
				// The datapaths alternate mode by mode, so drift on a
				// shared machine hits both.
				for _, b := range beds {
					if err := ctx.Err(); err != nil {
						return nil, err
					}
					d, errs := b.adds(ctx, fmt.Sprint(m.name, l), l.NP, perRound, m.workers)
					x := row(b.datapath, m.name, l)
					x.samples = append(x.samples, d...)
					x.Errors += errs
					p.progress("round %d/%d  %-8s %-14s %6s policies  %d ADDs  p50 %.1f ms", round+1, p.Rounds, b.datapath, m.name, l,
						len(d), ms(percentile(d, 50)))
				}
			}
		}
	}
	for _, b := range beds {
		daemon := b.daemonTimes()
		for _, m := range modes {
			ref := row(b.datapath, m.name, loads[0])
			refP50, refP99 := ms(percentile(ref.samples, 50)), ms(percentile(ref.samples, 99))
			for _, l := range loads {
				x := row(b.datapath, m.name, l)
				x.N, x.P50, x.P99 = len(x.samples), ms(percentile(x.samples, 50)), ms(percentile(x.samples, 99))
				dt := daemon[fmt.Sprint(m.name, l)]
				x.DaemonP50, x.DaemonP99 = ms(percentile(dt, 50)), ms(percentile(dt, 99))
				if refP50 > 0 && refP99 > 0 {
					x.RatioP50, x.RatioP99 = x.P50/refP50, x.P99/refP99
				}
				if first := ms(percentile(row(p.Datapaths[0], m.name, l).samples, 50)); first > 0 {
					x.RatioDatapath = x.P50 / first
				}
				r.Rows = append(r.Rows, *x)
			}
		}
	}
	for i, b := range beds {
		if b.loaded != (policyLoad{NP: largest}) {
			if _, err := b.load(ctx, policyLoad{NP: largest}); err != nil {
				return nil, err
			}
		}
		if p.Changes > 0 {
			c, cut, err := b.changes(ctx, largest)
			if err != nil {
				return nil, fmt.Errorf("%s: policy change latency: %w", b.datapath, err)
			}
			r.Datapaths[i].Change, r.Datapaths[i].Cut = c, cut
		}
		v, err := b.verdicts(ctx, largest)
		if err != nil {
			return nil, fmt.Errorf("%s: verdicts after churn: %w", b.datapath, err)
		}
		r.Datapaths[i].Verdicts = v
	}
	r.Duration = time.Since(started).Round(time.Second).String()
	return r, nil
}

func (p ScaleParams) progress(format string, args ...any) {
	if p.Progress != nil {
		fmt.Fprintf(p.Progress, format+"\n", args...)
	}
}

func (b *scaleBed) setup() error {
	if err := os.MkdirAll(b.policyDir, 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(b.policyDir, "00-namespaces.yaml"), []byte(scaleNamespaces()), 0o600); err != nil {
		return err
	}
	n, err := harness.NewNode(filepath.Join(b.dir, "node"), "scale-"+harness.RandomSuffix(6),
		harness.NodeOptions{PodCIDRs: []string{scaleCIDR}, ExtraArgs: []string{"--policy-dir", b.policyDir, "--datapath=" + b.datapath}})
	if err != nil {
		return err
	}
	b.node = n
	if err := n.StartDaemon(); err != nil {
		return err
	}
	b.conflist = n.PrimaryConflist("scale", "1.1.0")
	slots := max(b.p.Pods/b.p.Rounds, b.p.Concurrency)
	for i := range slots {
		pod, err := harness.NewPod(fmt.Sprintf("scale-%s-%d", b.datapath, i))
		if err != nil {
			return err
		}
		b.slots = append(b.slots, pod)
	}
	return nil
}

func (b *scaleBed) close() {
	for _, pod := range b.slots {
		pod.Close()
	}
	if b.node != nil {
		b.node.Close()
	}
}

// scaleNamespaces: the pods' namespace and 50 team namespaces the
// namespaceSelector peers pick.
func scaleNamespaces() string {
	var s strings.Builder
	fmt.Fprintf(&s, "apiVersion: v1\nkind: Namespace\nmetadata: {name: %s, labels: {team: t0}}\n", scaleNamespace)
	for i := range 50 {
		fmt.Fprintf(&s, "---\napiVersion: v1\nkind: Namespace\nmetadata: {name: team-%d, labels: {team: t%d}}\n", i, i)
	}
	return s.String()
}

// scalePolicy is policy i of n: it selects app=svc-i, allows ingress from
// app=svc-(i+1) on one port, every tenth also from a team namespace; every
// other one isolates egress too, allowing DNS to a /24.
func scalePolicy(i, n int) string {
	var s strings.Builder
	fmt.Fprintf(&s, `---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p%d, namespace: %s}
spec:
  podSelector: {matchLabels: {app: svc-%d}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: svc-%d}}}]
    ports: [{port: %d}]
`, i, scaleNamespace, i, (i+1)%n, 8000+i%1000)
	if i%10 == 0 {
		fmt.Fprintf(&s, "  - from: [{namespaceSelector: {matchLabels: {team: t%d}}}]\n", i%50)
	}
	if i%2 == 0 {
		fmt.Fprintf(&s, "  egress:\n  - to: [{ipBlock: {cidr: 10.%d.%d.0/24}}]\n    ports: [{protocol: UDP, port: 53}]\n", 100+i/256%100, i%256)
		s.WriteString("  policyTypes: [Ingress, Egress]\n")
	}
	return s.String()
}

// clusterPolicy is ClusterNetworkPolicy i of n (sized against np
// NetworkPolicies): Admin and Baseline in turn, every priority in use;
// every 20th selects every pod, the others the pods of one app in a
// team's namespaces (team t0 is the measured pods'); an ingress rule
// accepting, denying or passing one app on one port, and an egress deny
// of a /24 on port 25.
func clusterPolicy(i, np int) string {
	tier := []string{"Admin", "Baseline"}[i%2]
	subject := fmt.Sprintf("pods: {namespaceSelector: {matchLabels: {team: t%d}}, podSelector: {matchLabels: {app: svc-%d}}}",
		i%50, i*7%max(np, 1))
	if i%20 == 0 {
		subject = "namespaces: {}"
	}
	return fmt.Sprintf(`---
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: c%d}
spec:
  tier: %s
  priority: %d
  subject: {%s}
  ingress:
  - action: %s
    from: [{pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: svc-%d}}}}]
    protocols: [{tcp: {destinationPort: {number: %d}}}]
  egress:
  - action: Deny
    to: [{networks: [10.%d.%d.0/24]}]
    protocols: [{tcp: {destinationPort: {number: 25}}}]
`, i, tier, i%(1001), subject, []string{"Accept", "Deny", "Pass"}[i%3], (i*7+1)%max(np, 1), 9000+i%1000, 150+i/256%50, i%256)
}

// load replaces the policy files with l's policies and waits until the
// daemon has applied them (coordino_policies counts both kinds). When l
// is in force already (the next round starting where the last ended) it
// writes nothing: rewriting the files would have the daemon reload them
// while the count it waits for already reads right, and the ADDs then
// measured would race that reload.
func (b *scaleBed) load(ctx context.Context, l policyLoad) (time.Duration, error) {
	if l == b.loaded {
		return 0, nil
	}
	old, _ := filepath.Glob(filepath.Join(b.policyDir, "policies-*.yaml"))
	oldCluster, _ := filepath.Glob(filepath.Join(b.policyDir, "cluster-*.yaml"))
	old = append(old, oldCluster...)
	n := l.NP
	start := time.Now()
	for _, f := range old {
		if err := os.Remove(f); err != nil {
			return 0, err
		}
	}
	for c := 0; c*chunkPolicies < n; c++ {
		var s strings.Builder
		for i := c * chunkPolicies; i < min(n, (c+1)*chunkPolicies); i++ {
			s.WriteString(scalePolicy(i, n))
		}
		if err := b.writeFile(fmt.Sprintf("policies-%03d.yaml", c), s.String()); err != nil {
			return 0, err
		}
	}
	for c := 0; c*chunkPolicies < l.CNP; c++ {
		var s strings.Builder
		for i := c * chunkPolicies; i < min(l.CNP, (c+1)*chunkPolicies); i++ {
			s.WriteString(clusterPolicy(i, n))
		}
		if err := b.writeFile(fmt.Sprintf("cluster-%03d.yaml", c), s.String()); err != nil {
			return 0, err
		}
	}
	b.loaded = l
	want := n + l.CNP
	if _, err := os.Stat(filepath.Join(b.policyDir, toggleFile)); err == nil {
		want++
	}
	if err := b.waitPolicies(ctx, want); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// waitPolicies waits until the daemon has applied want valid policies.
func (b *scaleBed) waitPolicies(ctx context.Context, want int) error {
	start := time.Now()
	for {
		got, err := b.node.Metric("coordino_policies")
		if err == nil && got == float64(want) {
			if inv, _ := b.node.Metric("coordino_policy_files_invalid"); inv != 0 {
				return fmt.Errorf("%v policy files invalid:\n%s", inv, b.node.LogTail(5))
			}
			return nil
		}
		if time.Since(start) > 5*time.Minute {
			return fmt.Errorf("coordino_policies = %v (%v), want %v after 5 minutes", got, err, want)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// daemonTimes reads the daemon's own time of every measured ADD from its
// log (the harness runs it at debug level, which logs each request).
func (b *scaleBed) daemonTimes() map[string][]time.Duration {
	out := map[string][]time.Duration{}
	sc := bufio.NewScanner(strings.NewReader(b.node.LogTail(1 << 30)))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e struct {
			Msg, Verb, ContainerID string
			Took                   float64 // seconds
		}
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Msg != "CNI request done" || e.Verb != "ADD" {
			continue
		}
		if row, ok := b.rowOf[e.ContainerID]; ok {
			out[row] = append(out[row], time.Duration(e.Took*float64(time.Second)))
		}
	}
	return out
}

// writeFile puts a file into the policy dir in one rename.
func (b *scaleBed) writeFile(name, data string) error {
	tmp := filepath.Join(b.dir, ".tmp-"+name)
	if err := os.WriteFile(tmp, []byte(data), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(b.policyDir, name))
}

// adds runs n ADDs with workers in flight, each pod a new label set, then
// DELs them all (untimed).
func (b *scaleBed) adds(ctx context.Context, row string, size, n, workers int) ([]time.Duration, int) {
	type job struct {
		pod *harness.Pod
		cni *harness.CNI
		rt  *libcni.RuntimeConf
		err error
		d   time.Duration
	}
	n = min(n, len(b.slots)) // one slot holds one pod at a time
	jobs := make([]*job, n)
	for i := range jobs {
		b.seq++
		app := fmt.Sprintf("svc-%d", b.seq)
		if size > 0 {
			app = fmt.Sprintf("svc-%d", b.seq%size)
		}
		conf, err := harness.WithPodLabels(b.conflist, map[string]string{"app": app, "pod": fmt.Sprint("p", b.seq)})
		j := &job{pod: b.slots[i], err: err}
		if err == nil {
			j.cni, j.err = b.node.NewCNI(conf)
		}
		j.rt = harness.RuntimeConfIn(j.pod, "eth0", scaleNamespace)
		j.rt.ContainerID = "c" + harness.RandomSuffix(31)
		b.rowOf[j.rt.ContainerID] = row
		jobs[i] = j
	}
	var wg sync.WaitGroup
	next := make(chan *job)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range next {
				if j.err != nil {
					continue
				}
				c, cancel := context.WithTimeout(ctx, time.Minute)
				start := time.Now()
				_, j.err = j.cni.Add(c, j.rt)
				j.d = time.Since(start)
				cancel()
			}
		}()
	}
	for _, j := range jobs {
		next <- j
	}
	close(next)
	wg.Wait()
	var out []time.Duration
	errs := 0
	for _, j := range jobs {
		if j.err != nil {
			errs++
			b.p.progress("ADD failed: %v", j.err)
		} else {
			out = append(out, j.d)
		}
		if j.cni != nil {
			c, cancel := context.WithTimeout(context.Background(), time.Minute)
			if err := j.cni.Del(c, j.rt); err != nil {
				errs++
				b.p.progress("DEL failed: %v", err)
			}
			cancel()
		}
	}
	return out, errs
}

// toggle is the policy flipped by the change measurement: the server
// accepts the client on togglePort or not (it stays isolated either way).
func toggle(allow bool) string {
	port := togglePort
	if !allow {
		port = togglePort + 1
	}
	return fmt.Sprintf(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: toggle, namespace: %s}
spec:
  podSelector: {matchLabels: {app: toggle-server}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: toggle-client}}}]
    ports: [{port: %d}]
`, scaleNamespace, port)
}

// changes times policy changes at size policies: each rewrites the toggle
// file and probes client→server until the verdict flips. A new probe
// starts every 5 ms; the latency is the start of the first probe that saw
// the new verdict. Each change to deny also has a connection opened while
// allowed exchange a message every 5 ms, and times its first loss (cut).
func (b *scaleBed) changes(ctx context.Context, size int) (ChangeRow, ChangeRow, error) {
	row, cutRow := ChangeRow{Policies: size}, ChangeRow{Policies: size}
	client, server := b.slots[0], b.slots[1]
	var added []func()
	defer func() {
		for _, f := range slices.Backward(added) {
			f()
		}
	}()
	var err error
	ips := map[string]netip.Addr{}
	for name, pod := range map[string]*harness.Pod{"toggle-client": client, "toggle-server": server} {
		addr, detach, err := b.attach(ctx, pod, map[string]string{"app": name})
		if err != nil {
			return row, cutRow, err
		}
		added = append(added, detach)
		ips[name] = addr
	}
	stop, err := harness.ServeTCPEcho(server.NS, ips["toggle-server"], togglePort)
	if err != nil {
		return row, cutRow, err
	}
	added = append(added, stop)
	if err := b.writeFile(toggleFile, toggle(false)); err != nil {
		return row, cutRow, err
	}
	defer os.Remove(filepath.Join(b.policyDir, toggleFile))
	if err := b.waitPolicies(ctx, size+1); err != nil {
		return row, cutRow, err
	}
	probe := func() bool {
		c, err := harness.DialFrom(client.NS, "tcp", ips["toggle-server"], togglePort, 300*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err == nil
	}
	var samples, cuts []time.Duration
	allow := false
	for i := range b.p.Changes {
		allow = !allow
		time.Sleep(300 * time.Millisecond) // let the previous change settle
		var est *establishedFlow
		if !allow {
			est, err = openEstablished(client, ips["toggle-server"])
			if err != nil {
				return row, cutRow, fmt.Errorf("established connection before change %d: %w", i+1, err)
			}
		}
		written := time.Now()
		if err := b.writeFile(toggleFile, toggle(allow)); err != nil {
			return row, cutRow, err
		}
		d, ok := flipTime(ctx, written, allow, probe)
		if est != nil {
			cut, cutOK := est.cutAfter(written)
			if cutOK {
				cuts = append(cuts, cut)
			} else {
				cutRow.Errors++
			}
		}
		if !ok {
			row.Errors++
			b.p.progress("change %d: verdict did not flip to allow=%v within 10 s", i+1, allow)
			continue
		}
		samples = append(samples, d)
		b.p.progress("change %d/%d at %d policies: allow=%v after %.0f ms", i+1, b.p.Changes, size, allow, ms(d))
	}
	row.N, row.P50, row.P99 = len(samples), ms(percentile(samples, 50)), ms(percentile(samples, 99))
	cutRow.N, cutRow.P50, cutRow.P99 = len(cuts), ms(percentile(cuts, 50)), ms(percentile(cuts, 99))
	return row, cutRow, nil
}

// establishedFlow is a TCP connection exchanging a message every 5 ms.
type establishedFlow struct {
	conn  net.Conn
	stop  chan struct{}
	done  chan struct{}
	first time.Time // start of the first failed exchange
}

func openEstablished(client *harness.Pod, server netip.Addr) (*establishedFlow, error) {
	c, err := harness.DialFrom(client.NS, "tcp", server, togglePort, time.Second)
	if err != nil {
		return nil, err
	}
	f := &establishedFlow{conn: c, stop: make(chan struct{}), done: make(chan struct{})}
	if !f.exchange() {
		c.Close()
		return nil, errors.New("first exchange failed")
	}
	go f.run()
	return f, nil
}

func (f *establishedFlow) exchange() bool {
	msg, buf := []byte("ping5678"), make([]byte, 8)
	_ = f.conn.SetDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := f.conn.Write(msg); err != nil {
		return false
	}
	_, err := io.ReadFull(f.conn, buf)
	return err == nil
}

func (f *establishedFlow) run() {
	defer close(f.done)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-f.stop:
			return
		case <-tick.C:
		}
		start := time.Now()
		if !f.exchange() {
			f.first = start
			return
		}
	}
}

// cutAfter waits (up to 10 s) for the flow to break and closes it.
func (f *establishedFlow) cutAfter(since time.Time) (time.Duration, bool) {
	select {
	case <-f.done:
	case <-time.After(10 * time.Second):
		close(f.stop)
		<-f.done
	}
	f.conn.Close()
	if f.first.IsZero() {
		return 0, false
	}
	return f.first.Sub(since), true
}

// flipTime launches a probe every 5 ms until one returns want, and returns
// the earliest start among probes that returned want.
func flipTime(ctx context.Context, since time.Time, want bool, probe func() bool) (time.Duration, bool) {
	type result struct {
		start time.Time
		ok    bool
	}
	results := make(chan result, 4096)
	deadline := time.After(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	var first time.Time
	inFlight := 0
	for {
		select {
		case <-ctx.Done():
			return 0, false
		case <-deadline:
			return 0, false
		case r := <-results:
			inFlight--
			if r.ok == want && (first.IsZero() || r.start.Before(first)) {
				first = r.start
			}
			// Probes started earlier may still be out; once none is, the
			// earliest success is final.
			if !first.IsZero() && inFlight == 0 {
				return first.Sub(since), true
			}
		case <-tick.C:
			if !first.IsZero() {
				continue
			}
			inFlight++
			wg.Add(1)
			go func(start time.Time) {
				defer wg.Done()
				results <- result{start, probe()}
			}(time.Now())
		}
	}
}

// percentile is the nearest-rank percentile: with few samples, an
// observed value rather than an interpolation.
func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// WriteTable prints the report.
func (r *ScaleReport) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "Policy scale: %s, %d CPUs, kernel %s, %s (took %s)\n\n", r.Machine.Model, r.Machine.CPUs, r.Machine.Kernel, r.Date, r.Duration)
	fmt.Fprintf(w, "%-9s %-14s %16s %5s %6s %9s %9s %9s %9s %9s %11s %11s\n", "datapath", "ADD", "policies", "n", "errors", "p50 ms", "p99 ms",
		"p50 ×ref", "p99 ×ref", "p50 ×dp0", "daemon p50", "daemon p99")
	for _, x := range r.Rows {
		fmt.Fprintf(w, "%-9s %-14s %16s %5d %6d %9.1f %9.1f %9.2f %9.2f %9.2f %11.2f %11.2f\n", x.Datapath, x.Mode, policyLoad{x.Policies, x.ClusterPolicies},
			x.N, x.Errors, x.P50, x.P99, x.RatioP50, x.RatioP99, x.RatioDatapath, x.DaemonP50, x.DaemonP99)
	}
	fmt.Fprintln(w, "(×ref: over 0 policies on the same datapath; ×dp0: over the first datapath in the same configuration)")
	for _, d := range r.Datapaths {
		fmt.Fprintf(w, "\n%s:\n", d.Datapath)
		for _, l := range slices.Sorted(maps.Keys(d.LoadSeconds)) {
			fmt.Fprintf(w, "load %s policies from files to enforced: %.1f s (slowest round)\n", l, d.LoadSeconds[l])
		}
		if d.Change.N > 0 || d.Change.Errors > 0 {
			fmt.Fprintf(w, "policy change to enforcement at %d policies: p50 %.0f ms, p99 %.0f ms (n=%d, %d errors; includes the 250 ms file debounce)\n",
				d.Change.Policies, d.Change.P50, d.Change.P99, d.Change.N, d.Change.Errors)
			fmt.Fprintf(w, "established connection cut by a revoking change at %d policies: p50 %.0f ms, p99 %.0f ms (n=%d, %d errors)\n",
				d.Cut.Policies, d.Cut.P50, d.Cut.P99, d.Cut.N, d.Cut.Errors)
		}
		fmt.Fprintf(w, "verdicts on the wire after ADD/DEL churn at %d policies: %d checked, %d wrong\n", d.Verdicts.Policies, d.Verdicts.Checked, len(d.Verdicts.Wrong))
		for _, x := range d.Verdicts.Wrong {
			fmt.Fprintf(w, "  wrong: %s\n", x)
		}
	}
}
