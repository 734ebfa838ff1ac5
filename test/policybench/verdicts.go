package main

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/coordino/coordino/test/harness"
)

// VerdictRow is the outcome of the verdict checks after ADD/DEL churn at
// the largest size: probes on the wire that must match what scalePolicy
// says, each round with freshly attached pods.
type VerdictRow struct {
	Policies int `json:"policies"`
	Checked  int `json:"checked"`
	// Wrong lists each probe whose outcome differed from the policy's.
	Wrong []string `json:"wrong,omitempty"`
}

// verdictRounds is how many rounds of (attach, probe, detach) run, with a
// burst of ADD/DEL churn between two rounds.
const verdictRounds = 3

// verdicts checks, at size policies, that the policies still decide right
// after churn: a server of app svc-k and two clients, svc-(k+1) (the peer
// policy k allows, on its port only) and svc-(k+3) (no policy lets it in),
// attached anew each round between bursts of ADDs and DELs of other pods.
// k is even and not a multiple of 10: policy k isolates the server's egress
// too (replies pass), the clients' egress stays open, and no team
// namespace peer widens it.
func (b *scaleBed) verdicts(ctx context.Context, size int) (VerdictRow, error) {
	row := VerdictRow{Policies: size}
	k := 42 + 100*(size/200)
	if k+3 >= size {
		return row, fmt.Errorf("%d policies: too few for the verdict check", size)
	}
	var pods [3]*harness.Pod
	for i := range pods {
		p, err := harness.NewPod(fmt.Sprintf("verdict-%d", i))
		if err != nil {
			return row, err
		}
		defer p.Close()
		pods[i] = p
	}
	for round := range verdictRounds {
		if round > 0 {
			// Churn: pods of new label sets come and go at full concurrency.
			if _, errs := b.adds(ctx, "churn", size, len(b.slots), b.p.Concurrency); errs > 0 {
				return row, fmt.Errorf("churn before verdict round %d: %d ADD/DEL errors", round+1, errs)
			}
		}
		if err := b.verdictRound(ctx, &row, round, k, pods); err != nil {
			return row, err
		}
	}
	return row, nil
}

// verdictRound attaches the three pods, probes, and detaches them.
func (b *scaleBed) verdictRound(ctx context.Context, row *VerdictRow, round, k int, pods [3]*harness.Pod) error {
	server, peer, other := pods[0], pods[1], pods[2]
	port := 8000 + k%1000
	var addrs [3]netip.Addr
	for i, app := range []int{k, k + 1, k + 3} {
		addr, detach, err := b.attach(ctx, pods[i], map[string]string{"app": fmt.Sprintf("svc-%d", app), "pod": fmt.Sprint("verdict", i)})
		if err != nil {
			return fmt.Errorf("verdict round %d: %w", round+1, err)
		}
		defer detach()
		addrs[i] = addr
	}
	for _, p := range []int{port, port + 1} {
		stop, err := harness.ServeTCPEcho(server.NS, addrs[0], p)
		if err != nil {
			return err
		}
		defer stop()
	}
	probes := []struct {
		name string
		p    harness.Probe
		want harness.Outcome
	}{
		{fmt.Sprintf("svc-%d → svc-%d tcp/%d (allowed by p%d)", k+1, k, port, k), harness.Probe{From: peer.NS, To: addrs[0], Port: port, Proto: "tcp"}, harness.Reached},
		{fmt.Sprintf("svc-%d → svc-%d tcp/%d (other port)", k+1, k, port+1), harness.Probe{From: peer.NS, To: addrs[0], Port: port + 1, Proto: "tcp"}, harness.Blocked},
		{fmt.Sprintf("svc-%d → svc-%d tcp/%d (not a peer)", k+3, k, port), harness.Probe{From: other.NS, To: addrs[0], Port: port, Proto: "tcp"}, harness.Blocked},
	}
	var list []harness.Probe
	for _, p := range probes {
		list = append(list, p.p)
	}
	got, err := harness.ProbeAll(list, time.Second)
	if err != nil {
		return err
	}
	for i, p := range probes {
		row.Checked++
		if got[i] != p.want {
			row.Wrong = append(row.Wrong, fmt.Sprintf("round %d: %s: %v, want %v", round+1, p.name, got[i], p.want))
		}
	}
	b.p.progress("verdict round %d/%d: %d probes, %d wrong so far", round+1, verdictRounds, row.Checked, len(row.Wrong))
	return nil
}

// attach ADDs pod with labels and returns its first address and its DEL.
func (b *scaleBed) attach(ctx context.Context, pod *harness.Pod, labels map[string]string) (netip.Addr, func(), error) {
	conf, err := harness.WithPodLabels(b.conflist, labels)
	if err != nil {
		return netip.Addr{}, nil, err
	}
	cni, err := b.node.NewCNI(conf)
	if err != nil {
		return netip.Addr{}, nil, err
	}
	rt := harness.RuntimeConfIn(pod, "eth0", scaleNamespace)
	rt.ContainerID = "c" + harness.RandomSuffix(31)
	res, err := cni.Add(ctx, rt)
	detach := func() { _ = cni.Del(context.Background(), rt) }
	if err != nil {
		detach()
		return netip.Addr{}, nil, err
	}
	addrs, err := harness.Addresses(res)
	if err != nil || len(addrs) == 0 {
		detach()
		return netip.Addr{}, nil, fmt.Errorf("addresses %v: %v", addrs, err)
	}
	return addrs[0], detach, nil
}
