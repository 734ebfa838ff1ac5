package main

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	cnpv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	"sigs.k8s.io/yaml"

	"github.com/coordino/coordino/api/policyir"
	"github.com/coordino/coordino/test/privileged"
)

// TestQuickRun keeps the benchmark from rotting: a quick run must measure
// every configuration with traffic actually flowing and compile exactly the
// rules it claims. It asserts nothing about speed.
func TestQuickRun(t *testing.T) {
	privileged.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := QuickParams()
	var progress strings.Builder
	p.Progress = &progress
	r, err := Run(ctx, p)
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	if want := 1 + 2*len(p.Sizes) + 1 + len(p.Sizes) + 1; len(r.Rows) != want { // the last with cluster policies
		t.Fatalf("%d rows, want %d", len(r.Rows), want)
	}
	for _, x := range r.Rows {
		if x.MedianGbps <= 0 || x.MedianConn <= 0 || x.ConnErrors > 0 {
			t.Errorf("%s %d rules: %.2f Gbit/s, %.0f conn/s, %d errors", x.Label, x.Rules, x.MedianGbps, x.MedianConn, x.ConnErrors)
		}
		if x.System == "coordino" && x.ClusterPolicies == 0 && x.PolicyEntries != 2*x.Rules {
			t.Errorf("Coordino %d rules/end: %d policy entries, want %d", x.Rules, x.PolicyEntries, 2*x.Rules)
		}
	}
	if last := r.Rows[len(r.Rows)-1]; last.ClusterPolicies != p.ClusterPolicies || last.PolicyEntries <= 2*last.Rules {
		t.Errorf("cluster policies' row %+v: want %d policies adding tier entries", last, p.ClusterPolicies)
	}
	if len(r.Targets) != 5 {
		t.Errorf("targets = %+v", r.Targets)
	}
	var table strings.Builder
	r.WriteTable(&table)
	t.Logf("\n%s", table.String())
}

func TestPortsAndRulesets(t *testing.T) {
	ports := benchPorts(10)
	if len(ports) != 10 || ports[8] != iperfPort || ports[9] != connPort {
		t.Fatalf("benchPorts(10) = %v", ports)
	}
	y := policyYAML(250)
	if got := strings.Count(y, "kind: NetworkPolicy"); got != 6 {
		t.Errorf("250 rules per end in %d policies, want 6 (3 per end)", got)
	}
	if got := strings.Count(y, "{protocol: TCP, port:"); got != 500 {
		t.Errorf("%d port entries, want 500", got)
	}
	cli, srv := &benchPod{hostIf: "cdoc"}, &benchPod{hostIf: "cdos"}
	rules := nftRuleset(false, 10, cli, srv)
	if got := strings.Count(rules, " return\n"); got != 20 {
		t.Errorf("%d nft rules, want 20:\n%s", got, rules)
	}
	if set := nftRuleset(true, 10, cli, srv); strings.Count(set, " return\n") != 2 || !strings.Contains(set, "5201, 8080 }") {
		t.Errorf("set ruleset:\n%s", set)
	}
}

// TestScaleQuickRun keeps the -scale mode from rotting: every row of both
// datapaths gets ADD samples without errors and the policy change is seen
// on the wire. It asserts nothing about speed.
func TestScaleQuickRun(t *testing.T) {
	privileged.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := QuickScaleParams()
	var progress strings.Builder
	p.Progress = &progress
	r, err := RunScale(ctx, p)
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	if want := 2 * (len(p.Sizes) + 1) * len(p.Datapaths); len(r.Rows) != want { // + the cluster policies' configuration
		t.Fatalf("%d rows, want %d", len(r.Rows), want)
	}
	for _, x := range r.Rows {
		if x.N == 0 || x.Errors > 0 || x.P50 <= 0 || x.RatioP50 <= 0 || x.RatioDatapath <= 0 {
			t.Errorf("%s %s %d+%d policies: n=%d errors=%d p50=%.1f ratio=%.2f ×dp0=%.2f", x.Datapath, x.Mode, x.Policies, x.ClusterPolicies,
				x.N, x.Errors, x.P50, x.RatioP50, x.RatioDatapath)
		}
	}
	if last := r.Rows[len(r.Rows)-1]; last.ClusterPolicies != p.ClusterPolicies || last.Policies != slices.Max(p.Sizes) {
		t.Errorf("last row %+v, want the largest size with %d cluster policies", last, p.ClusterPolicies)
	}
	if len(r.Datapaths) != len(p.Datapaths) {
		t.Fatalf("%d datapaths measured, want %v", len(r.Datapaths), p.Datapaths)
	}
	for _, d := range r.Datapaths {
		if d.Change.N != p.Changes || d.Change.Errors > 0 {
			t.Errorf("%s: policy changes: %+v, want %d seen", d.Datapath, d.Change, p.Changes)
		}
		if d.Cut.N != p.Changes/2 || d.Cut.Errors > 0 {
			t.Errorf("%s: established connections cut: %+v, want %d", d.Datapath, d.Cut, p.Changes/2)
		}
		if d.Verdicts.Checked != 3*verdictRounds || len(d.Verdicts.Wrong) > 0 {
			t.Errorf("%s: verdicts after churn: %d checked, wrong: %v", d.Datapath, d.Verdicts.Checked, d.Verdicts.Wrong)
		}
	}
	var table strings.Builder
	r.WriteTable(&table)
	t.Logf("\n%s", table.String())
}

// TestScaleClusterPolicies: the generated ClusterNetworkPolicies are valid
// for the normalizer the daemon loads them with, both tiers and all three
// actions occur, and every 20th selects every pod.
func TestScaleClusterPolicies(t *testing.T) {
	seen := map[string]bool{}
	for i := range 60 {
		cnp := &cnpv1beta1.ClusterNetworkPolicy{}
		if err := yaml.UnmarshalStrict([]byte(strings.TrimPrefix(clusterPolicy(i, 10000), "---\n")), cnp); err != nil {
			t.Fatalf("policy %d: %v", i, err)
		}
		p, err := policyir.NormalizeCluster(cnp)
		if err != nil || len(p.Warnings) > 0 {
			t.Fatalf("policy %d: %v %v", i, err, p)
		}
		seen[p.Tier.String()], seen[p.Rules[0].Action.String()] = true, true
		if all := p.NamespaceSelector.Empty() && p.PodSelector.Empty(); all != (i%20 == 0) {
			t.Errorf("policy %d selects every pod = %v", i, all)
		}
	}
	if len(seen) != 5 {
		t.Errorf("tiers and actions seen: %v", seen)
	}
}

func TestScalePolicies(t *testing.T) {
	y := scalePolicy(10, 100)
	for _, want := range []string{"name: p10,", "app: svc-10}", "app: svc-11}", "team: t10}", "cidr: 10.100.10.0/24"} {
		if !strings.Contains(y, want) {
			t.Errorf("policy 10 lacks %q:\n%s", want, y)
		}
	}
	if strings.Contains(scalePolicy(11, 100), "egress") {
		t.Error("odd policies isolate egress")
	}
}
