package policy

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/coordino/coordino/test/harness"
)

// dualStack gives every pod an IPv4 and an IPv6 address. Its IPv4 range is
// distinct from the other modes' so a leftover route can never alias.
var dualStack = mode{name: "dual-stack", subnet: "10.184.0.0/24", subnet6: "fd00:184::/64"}

// dsCase is a dual-stack case: one policy, one truth table per family.
type dsCase struct {
	name         string
	policy       func(b *bed) string
	want4, want6 func() *truth
}

// dualStackShared names the cases whose policy has no address in it: both
// families must give exactly the same matrix as the single-stack modes.
var dualStackShared = []string{
	"default-deny-ingress",
	"pod-selector",
	"namespace-selector",
	"namespace-and-pod-one-peer",
	"endport-range",
	"default-deny-egress",
	"node-to-pod-always-allowed",
}

// hostPrefix is the single-address prefix of a (/32 or /128).
func hostPrefix(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }

var (
	yb, zc = peer{"y", "b"}, peer{"z", "c"}
	// dualStackOnly are ipBlock cases whose truth depends on the family:
	// an ipBlock names addresses of one family and must match only those.
	dualStackOnly = []dsCase{
		// An IPv6 CIDR with an except: over IPv6 every pod but the excepted
		// two reaches x/a; over IPv4 the block matches nothing, so x/a is
		// isolated with no allowed pod.
		{name: "ipblock-v6-except", policy: func(b *bed) string {
			return xaFrom("cidr6", fmt.Sprintf(`  - ipBlock: {cidr: "%s", except: ["%s", "%s"]}`,
				b.cidr6, hostPrefix(b.pod(yb).ip6), hostPrefix(b.pod(zc).ip6)))
		},
			want4: func() *truth { return allow().set(anyPod, xa, allSvc, false) },
			want6: func() *truth { return allow().set(or(yb.sel(), zc.sel()), xa, allSvc, false) }},
		// One block per family, each excepting a different pod: an except
		// cuts only its own family's address of that pod.
		{name: "ipblock-except-per-family", policy: func(b *bed) string {
			return xaFrom("cidr46", fmt.Sprintf(`  - ipBlock: {cidr: %s, except: [%s]}
  - ipBlock: {cidr: "%s", except: ["%s"]}`, b.cidr, hostPrefix(b.pod(yb).ip), b.cidr6, hostPrefix(b.pod(zc).ip6)))
		},
			want4: func() *truth { return allow().set(yb.sel(), xa, allSvc, false) },
			want6: func() *truth { return allow().set(zc.sel(), xa, allSvc, false) }},
		// Egress to ::/0 reaches every IPv6 pod and no IPv4 one: the family
		// is part of the ipcache key, so ::/0 must not match IPv4.
		{name: "ipblock-egress-v6-default-route", policy: static(np("x", "to-v6-world", `
podSelector: {matchLabels: {pod: a}}
policyTypes: [Egress]
egress:
- to: [{ipBlock: {cidr: "::/0"}}]`)),
			want4: func() *truth { return allow().set(xa, anyPod, allSvc, false) },
			want6: allow},
	}
)

// dualStackCases resolves the shared names and appends the family-specific cases.
func dualStackCases() ([]dsCase, error) {
	byName := map[string]policyCase{}
	for _, c := range cases {
		byName[c.name] = c
	}
	var out []dsCase
	for _, n := range dualStackShared {
		c, ok := byName[n]
		if !ok {
			return nil, fmt.Errorf("dual-stack case %q is not in cases", n)
		}
		out = append(out, dsCase{name: c.name, policy: c.policy, want4: c.want, want6: c.want})
	}
	return append(out, dualStackOnly...), nil
}

// TestDualStackCases keeps the dual-stack list in step with cases
// (unprivileged, so a rename fails even where the e2e tests skip).
func TestDualStackCases(t *testing.T) {
	cs, err := dualStackCases()
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) < 8 {
		t.Fatalf("%d dual-stack cases, want at least 8", len(cs))
	}
}

// TestDualStack runs the representative cases over IPv6 and IPv4 at once
// on one dual-stack node, then the first-packet check over IPv6.
func TestDualStack(t *testing.T) { runDualStack(t, dualStack) }

// TestDualStackNFTables is the same on --datapath=nftables.
func TestDualStackNFTables(t *testing.T) {
	runDualStack(t, mode{name: "dual-stack-nftables", nft: true, subnet: "10.185.0.0/24", subnet6: "fd00:185::/64"})
}

func runDualStack(t *testing.T, m mode) {
	cs, err := dualStackCases()
	if err != nil {
		t.Fatal(err)
	}
	b := newBed(t, m)
	b.checkAttachMode()
	t.Run("matrix", func(t *testing.T) {
		for _, c := range cs {
			t.Run(c.name, func(t *testing.T) {
				b.t = t
				docs := c.policy(b)
				if err := b.apply(docs); err != nil {
					t.Fatal(err)
				}
				if err := b.expectFamilies(c.want4(), c.want6()); err != nil {
					t.Fatalf("%v\npolicy:\n%s", err, docs)
				}
			})
		}
	})
	t.Run("new-pod-denied-from-first-packet-ipv6", func(t *testing.T) { b.newPodDenied(t, true) })
}

// probeFamilies probes the whole matrix over IPv4 and IPv6 in one round,
// so both families cost one timeout. IPv6 probes target the pod's IPv6
// address from its CNI result, checked to be IPv6 and in the IPv6 CIDR:
// an AF_INET6 socket to it cannot fall back to IPv4.
func (b *bed) probeFamilies(timeout time.Duration) (v4, v6 *observed, err error) {
	var probes []harness.Probe
	for _, six := range []bool{false, true} {
		for _, f := range sources {
			from := b.node.NS
			if f != nodePeer {
				from = b.pod(f).pod.NS
			}
			for _, d := range pods {
				to := b.pod(d).ip
				if six {
					to = b.pod(d).ip6
					if !to.Is6() || to.Is4In6() || !b.cidr6.Contains(to) {
						return nil, nil, fmt.Errorf("%s: IPv6 target %v is not in %v", d, to, b.cidr6)
					}
				} else if !to.Is4() {
					return nil, nil, fmt.Errorf("%s: IPv4 target %v", d, to)
				}
				for _, s := range services {
					probes = append(probes, harness.Probe{From: from, To: to, Port: s.port, Proto: s.proto})
				}
			}
		}
	}
	res, err := harness.ProbeAll(probes, timeout)
	if err != nil {
		return nil, nil, err
	}
	var o [2]observed
	n := 0
	for fam := range o {
		for i := range sources {
			for j := range pods {
				for k := range services {
					o[fam][i][j][k] = res[n]
					n++
				}
			}
		}
	}
	return &o[0], &o[1], nil
}

// expectFamilies is expectMatrix for both families at once: it probes
// until each family matches its truth or the deadline passes.
func (b *bed) expectFamilies(want4, want6 *truth) error {
	want4, want6 = want4.final(), want6.final()
	deadline := time.Now().Add(4 * time.Second)
	timeout := probeTimeout
	for attempt := 1; ; attempt++ {
		o4, o6, err := b.probeFamilies(timeout)
		if err != nil {
			return err
		}
		if o4.mismatches(want4) == 0 && o6.mismatches(want6) == 0 {
			if attempt > 1 {
				b.t.Logf("matrix matched on attempt %d", attempt)
			}
			return nil
		}
		if time.Now().After(deadline) {
			msg := ""
			if o4.mismatches(want4) > 0 {
				msg += "IPv4:\n" + o4.diff(want4)
			}
			if o6.mismatches(want6) > 0 {
				msg += "IPv6:\n" + o6.diff(want6)
			}
			return fmt.Errorf("reachability differs from the truth table after %d attempts (probe timeout %v):\n%s",
				attempt, timeout, msg)
		}
		timeout = min(2*timeout, time.Second)
	}
}
