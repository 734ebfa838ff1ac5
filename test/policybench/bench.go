package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/coordino/coordino/test/harness"
)

// Params shape a run.
type Params struct {
	// Sizes are the rule counts per end measured with Coordino and nftables.
	Sizes []int `json:"sizes"`
	// Rounds: every configuration is measured once per round, each round
	// starting at a different configuration, so drift and position effects
	// on a shared machine spread evenly; medians are reported.
	Rounds int `json:"rounds"`
	// IperfSeconds is the length of one iperf3 run (whole seconds: iperf3
	// reads a fraction as 0, which means forever).
	IperfSeconds int `json:"iperfSeconds"`
	// ConnDuration is the length of one connection-rate run.
	ConnDuration time.Duration `json:"connDuration"`
	// ConnWorkers dial in parallel.
	ConnWorkers int `json:"connWorkers"`
	// NftSets adds the set-lookup nftables variant.
	NftSets bool `json:"nftSets"`
	// ClusterPolicies, when > 0, adds a Coordino configuration with the
	// largest rule count plus this many ClusterNetworkPolicies, 50 of
	// them selecting both pods, none deciding the measured traffic (its
	// packets consult both tiers and fall through to NetworkPolicy).
	ClusterPolicies int `json:"clusterPolicies"`
	// Datapath is the Coordino node's --datapath (ebpf or nftables).
	Datapath string    `json:"datapath"`
	Progress io.Writer `json:"-"`
}

// DefaultParams is the full run recorded in docs/benchmarks.md.
func DefaultParams() Params {
	return Params{Sizes: []int{10, 1000, 10000}, Rounds: 5, IperfSeconds: 2, ConnDuration: 1500 * time.Millisecond,
		ConnWorkers: 2, NftSets: true, ClusterPolicies: 1000, Datapath: "ebpf"}
}

// QuickParams exercise every code path in seconds.
func QuickParams() Params {
	return Params{Sizes: []int{10, 100}, Rounds: 1, IperfSeconds: 1, ConnDuration: 300 * time.Millisecond,
		ConnWorkers: 2, NftSets: true, ClusterPolicies: 10, Datapath: "ebpf"}
}

// Ports the measurements use; they come last in every rule list.
const (
	iperfPort = 5201
	connPort  = 8080
)

// side is one node with a client and a server pod.
type side struct {
	node           *harness.Node
	policyDir      string
	client, server *benchPod
	iperf          *exec.Cmd
	iperfDone      chan struct{}
	stops          []func()
}

type benchPod struct {
	hp     *harness.Pod
	ip     netip.Addr
	hostIf string
	cni    *harness.CNI
	rt     *libcni.RuntimeConf
	added  bool
}

// config is one measured setup.
type config struct {
	System string `json:"system"` // bare, nft-rules, nft-set, coordino
	Rules  int    `json:"rulesPerEnd"`
	// ClusterPolicies are loaded besides the rules (coordino only).
	ClusterPolicies int `json:"clusterPolicies,omitempty"`
	// Datapath is the Coordino node's (coordino only).
	Datapath string `json:"datapath,omitempty"`
	side     *side
}

func (c config) label() string {
	switch c.System {
	case "bare":
		return "no policy, no eBPF (baseline)"
	case "coordino":
		name := "Coordino"
		if c.Datapath != "" && c.Datapath != "ebpf" {
			name += " (" + c.Datapath + ")"
		}
		if c.Rules == 0 {
			return name + ", no policy"
		}
		if c.ClusterPolicies > 0 {
			return fmt.Sprintf("%s + %d ClusterNetworkPolicies", name, c.ClusterPolicies)
		}
		return name
	case "nft-rules":
		return "nftables, rule per port"
	}
	return "nftables, set lookup"
}

func (p Params) progress(format string, args ...any) {
	if p.Progress != nil {
		fmt.Fprintf(p.Progress, format+"\n", args...)
	}
}

// Run sets up both nodes, measures every configuration in every round and
// tears everything down, also when ctx is cancelled.
func Run(ctx context.Context, p Params) (*Report, error) {
	if err := preflight(); err != nil {
		return nil, err
	}
	if len(p.Sizes) == 0 || slices.Min(p.Sizes) < 2 || p.Rounds < 1 || p.IperfSeconds < 1 || p.ConnWorkers < 1 {
		return nil, fmt.Errorf("bad parameters %+v", p)
	}
	started := time.Now()
	dir, err := os.MkdirTemp("", "policybench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)

	var sides []*side
	defer func() {
		for _, s := range sides {
			s.close()
		}
	}()
	bare, err := newSide(ctx, filepath.Join(dir, "bare"), "10.191.0.0/24", "--no-datapath")
	if bare != nil {
		sides = append(sides, bare)
	}
	if err != nil {
		return nil, fmt.Errorf("baseline node: %w", err)
	}
	policyDir := filepath.Join(dir, "policies")
	if err := os.MkdirAll(policyDir, 0o700); err != nil {
		return nil, err
	}
	cdo, err := newSide(ctx, filepath.Join(dir, "coordino"), "10.192.0.0/24", "--policy-dir", policyDir, "--datapath="+p.Datapath)
	if cdo != nil {
		sides = append(sides, cdo)
		cdo.policyDir = policyDir
	}
	if err != nil {
		return nil, fmt.Errorf("coordino node: %w", err)
	}

	configs := []config{{System: "bare", side: bare}}
	for _, n := range p.Sizes {
		configs = append(configs, config{System: "nft-rules", Rules: n, side: bare})
	}
	if p.NftSets {
		for _, n := range p.Sizes {
			configs = append(configs, config{System: "nft-set", Rules: n, side: bare})
		}
	}
	configs = append(configs, config{System: "coordino", Datapath: p.Datapath, side: cdo})
	for _, n := range p.Sizes {
		configs = append(configs, config{System: "coordino", Rules: n, Datapath: p.Datapath, side: cdo})
	}
	if p.ClusterPolicies > 0 {
		configs = append(configs, config{System: "coordino", Rules: slices.Max(p.Sizes), ClusterPolicies: p.ClusterPolicies,
			Datapath: p.Datapath, side: cdo})
	}

	r := &Report{Date: started.UTC().Format(time.RFC3339), Machine: machine(), Params: p}
	rows := make([]Row, len(configs))
	for i, c := range configs {
		rows[i] = Row{System: c.System, Label: c.label(), Rules: c.Rules, ClusterPolicies: c.ClusterPolicies}
	}
	// One unmeasured pass warms caches, ARP and the iperf3 servers.
	for _, s := range []*side{bare, cdo} {
		if _, err := s.throughput(ctx, 1); err != nil {
			return nil, fmt.Errorf("warm-up: %w", err)
		}
		if _, _, err := s.connRate(ctx, p.ConnDuration, p.ConnWorkers); err != nil {
			return nil, fmt.Errorf("warm-up: %w", err)
		}
	}
	for round := 1; round <= p.Rounds; round++ {
		first := (round - 1) * len(configs) / p.Rounds
		for k := range configs {
			i := (first + k) % len(configs)
			c := configs[i]
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			entries, err := c.apply()
			if err != nil {
				return nil, fmt.Errorf("%s %d rules: %w", c.System, c.Rules, err)
			}
			rows[i].PolicyEntries = entries
			gbps, err := c.side.throughput(ctx, p.IperfSeconds)
			if err != nil {
				return nil, fmt.Errorf("%s %d rules: throughput: %w", c.System, c.Rules, err)
			}
			rate, errs, err := c.side.connRate(ctx, p.ConnDuration, p.ConnWorkers)
			if err != nil {
				return nil, fmt.Errorf("%s %d rules: connection rate: %w", c.System, c.Rules, err)
			}
			rows[i].Gbps = append(rows[i].Gbps, gbps)
			rows[i].ConnPerSec = append(rows[i].ConnPerSec, rate)
			rows[i].ConnErrors += errs
			p.progress("round %d/%d  %-30s rules/end %-6d  %6.2f Gbit/s  %8.0f conn/s  (%d errors)",
				round, p.Rounds, c.label(), c.Rules, gbps, rate, errs)
		}
	}
	if _, err := configs[0].apply(); err != nil { // leave no nft table behind before teardown
		return nil, err
	}
	r.finish(rows, time.Since(started))
	return r, nil
}

func preflight() error {
	if os.Geteuid() != 0 {
		return errors.New("needs root (network namespaces, BPF, nftables)")
	}
	if err := harness.RequireBinaries(); err != nil {
		return err
	}
	for _, tool := range []string{"iperf3", "nft", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s not found (hack/deps.sh installs it): %w", tool, err)
		}
	}
	return nil
}

// newSide starts a node with extra daemon args and attaches the client and
// server pods; the server runs iperf3 and a connection sink.
func newSide(ctx context.Context, dir, cidr string, args ...string) (*side, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	n, err := harness.NewNode(dir, "bench-"+harness.RandomSuffix(6), harness.NodeOptions{PodCIDRs: []string{cidr}, ExtraArgs: args})
	if err != nil {
		return nil, err
	}
	s := &side{node: n}
	if err := n.StartDaemon(); err != nil {
		return s, err
	}
	if s.client, err = s.addPod(ctx, "client"); err != nil {
		return s, err
	}
	if s.server, err = s.addPod(ctx, "server"); err != nil {
		return s, err
	}
	stop, err := harness.Serve(s.server.hp.NS, s.server.ip, connPort, "sink")
	if err != nil {
		return s, err
	}
	s.stops = append(s.stops, stop)
	return s, s.startIperf()
}

func (s *side) addPod(ctx context.Context, role string) (*benchPod, error) {
	hp, err := harness.NewPod("bench-" + role)
	if err != nil {
		return nil, err
	}
	bp := &benchPod{hp: hp, rt: harness.RuntimeConfIn(hp, "eth0", "bench")}
	conf, err := harness.WithPodLabels(s.node.PrimaryConflist("bench", "1.1.0"), map[string]string{"role": role})
	if err != nil {
		hp.Close()
		return nil, err
	}
	if bp.cni, err = s.node.NewCNI(conf); err != nil {
		hp.Close()
		return nil, err
	}
	res, err := bp.cni.Add(ctx, bp.rt)
	bp.added = true // a failed ADD still owes a DEL
	if err != nil {
		return bp, fmt.Errorf("ADD %s: %w", role, err)
	}
	addrs, err := harness.Addresses(res)
	if err != nil || len(addrs) != 1 {
		return bp, fmt.Errorf("ADD %s: addresses %v %v", role, addrs, err)
	}
	bp.ip = addrs[0]
	cur, err := current.NewResultFromResult(res)
	if err != nil {
		return bp, err
	}
	for _, i := range cur.Interfaces {
		if i.Sandbox == "" {
			bp.hostIf = i.Name
		}
	}
	if bp.hostIf == "" {
		return bp, fmt.Errorf("ADD %s: no host interface in %s", role, harness.ResultJSON(res))
	}
	return bp, nil
}

func (s *side) startIperf() error {
	cmd := exec.Command("nsenter", "--net="+s.server.hp.NS.Path(), "--", "iperf3", "-s", "-B", s.server.ip.String(),
		"-p", fmt.Sprint(iperfPort))
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start iperf3 server: %w", err)
	}
	s.iperf, s.iperfDone = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); close(s.iperfDone) }()
	return nil
}

// close stops the servers, DELs the pods and removes the node.
func (s *side) close() {
	if s.iperf != nil {
		_ = s.iperf.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.iperfDone:
		case <-time.After(3 * time.Second):
			_ = s.iperf.Process.Kill()
			<-s.iperfDone
		}
	}
	for _, stop := range s.stops {
		stop()
	}
	for _, bp := range []*benchPod{s.client, s.server} {
		if bp == nil {
			continue
		}
		if bp.added {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			_ = bp.cni.Del(ctx, bp.rt)
			cancel()
		}
		bp.hp.Close()
	}
	s.node.Close()
}

// apply puts the configuration in place and returns the number of policy
// entries it compiled to (Coordino) or rules it loaded (nftables).
func (c config) apply() (int, error) {
	switch c.System {
	case "bare":
		return 0, c.side.nft(nftDelete)
	case "nft-rules", "nft-set":
		rs := nftRuleset(c.System == "nft-set", c.Rules, c.side.client, c.side.server)
		return 2 * c.Rules, c.side.nft(rs)
	}
	yaml := ""
	if c.Rules > 0 {
		yaml = policyYAML(c.Rules)
	}
	if c.ClusterPolicies > 0 {
		// The pods' namespace, for the cluster policies' namespace selectors.
		yaml += "---\napiVersion: v1\nkind: Namespace\nmetadata: {name: bench, labels: {team: t0}}\n"
		for i := range c.ClusterPolicies {
			yaml += clusterPolicy(i, 10000)
		}
	}
	s := c.side
	if err := s.node.WritePolicy(s.policyDir, "bench.yaml", []byte(yaml), 30*time.Second); err != nil {
		return 0, err
	}
	for _, m := range []string{"coordino_policy_files_invalid", "coordino_policy_invalid"} {
		if v, err := s.node.Metric(m); err != nil || v != 0 {
			return 0, fmt.Errorf("%s = %v (%v)", m, v, err)
		}
	}
	if c.Datapath == "nftables" {
		// No policy map: a pair's ports are one set; rules as written.
		return 2 * c.Rules, nil
	}
	entries, err := s.node.Metric("coordino_policy_map_entries")
	if err != nil {
		return 0, err
	}
	// Cluster policies add the tier entries of the pods they select.
	if want := 2 * c.Rules; int(entries) != want && (c.ClusterPolicies == 0 || int(entries) <= want) {
		return 0, fmt.Errorf("policy map has %v entries, want %d", entries, want)
	}
	return int(entries), nil
}

// nft loads a ruleset in the node netns.
func (s *side) nft(ruleset string) error {
	f, err := os.CreateTemp(s.node.Dir, "nft-*.conf")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.WriteString(ruleset); err != nil {
		f.Close()
		return err
	}
	f.Close()
	out, err := exec.Command("nsenter", "--net="+s.node.NS.Path(), "--", "nft", "-f", f.Name()).CombinedOutput()
	if err != nil {
		return fmt.Errorf("nft -f: %v: %s", err, out)
	}
	return nil
}

// benchPorts are the n ≥ 2 ports of a rule list: fillers (even ports from
// 20000, never adjacent, so nothing could merge them into a range) first,
// the measured ports last.
func benchPorts(n int) []int {
	var out []int
	for i := 0; len(out) < n-2; i++ {
		out = append(out, 20000+2*i)
	}
	return append(out, iperfPort, connPort)
}
