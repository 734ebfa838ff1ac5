package nftdp

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"

	"github.com/coordino/coordino/daemon/identity"

	"github.com/google/nftables"

	"github.com/coordino/coordino/daemon/policy"
)

// TableName is the datapath's table, in the inet family.
const TableName = "coordino-policy"

// Set names.
const (
	setHost4 = "host4" // this node's addresses
	setHost6 = "host6"
	setSrc4  = "src4" // ifname . address a pod interface may send from
	setSrc6  = "src6"
	// setPodIfs holds the pod interfaces, the keys of the endpoint
	// verdict maps, for rules that only ask whether an interface is a
	// pod's: kernels such as 6.1 refuse a lookup in a map without a
	// destination register (the verdict).
	setPodIfs = "pod-ifs"
)

// Named counters of the drops of all endpoints, "<direction>-<reason>",
// with the eBPF datapath's reason names (metrics).
const (
	dropsSpoofed = "egress-spoofed"
	reasonDenied = "policy-denied"
	// A packet of a connection a policy allowed when it began and no
	// longer allows.
	reasonRevoked = "policy-revoked"
	// A ClusterNetworkPolicy Deny of the Admin or the Baseline tier.
	reasonAdminDeny    = "admin-deny"
	reasonBaselineDeny = "baseline-deny"
)

func dropCounter(dir policy.Direction, reason string) string {
	if dir == policy.Egress {
		return "egress-" + reason
	}
	return "ingress-" + reason
}

// dropCounters are the names of all drop counters.
func dropCounters() []string {
	out := []string{dropsSpoofed}
	for _, dir := range []policy.Direction{policy.Ingress, policy.Egress} {
		out = append(out, dropCounter(dir, reasonDenied), dropCounter(dir, reasonRevoked),
			dropCounter(dir, reasonAdminDeny), dropCounter(dir, reasonBaselineDeny))
	}
	return append(out, dropCounter(policy.Egress, reasonNodeIsolated), dropCounter(policy.Ingress, reasonNodeDenied))
}

// Hook chains, all at filter priority like kube-proxy's and iptables'
// filter tables: they see the packet after DNAT (prerouting, -100). Any
// drop is final and an accept only ends the chain it is in, so their order
// among each other does not change a verdict; a packet between two pods
// passes the sender's egress chain and the receiver's ingress chain.
const (
	chainEgress  = "egress"  // forward: from a pod
	chainIngress = "ingress" // forward: to a pod
	chainInput   = "input"   // input: from a pod to the node
	// Allowed-flow chains, after the policy chains (filter+10): a packet
	// reaching them passed its pods' chains. Empty unless allowed flows
	// are wanted.
	chainAllowedFwd = "allowed-forward"
	chainAllowedIn  = "allowed-input"
	// Flows the node opens to its pods never reach the forward hook.
	chainAllowedOut = "allowed-output"
)

func dirName(dir policy.Direction) string {
	if dir == policy.Egress {
		return "out"
	}
	return "in"
}

func epsSet(dir policy.Direction) string { return "eps-" + dirName(dir) }

// endpointChain names the chain of the pod interface ifname for dir.
func endpointChain(ifname string, dir policy.Direction) string {
	return dirName(dir) + "-" + ifname
}

// parseEndpointChain reads back the interface of an endpoint chain.
func parseEndpointChain(name string) (ifname string, ok bool) {
	for _, dir := range []policy.Direction{policy.Ingress, policy.Egress} {
		if ifname, ok := strings.CutPrefix(name, dirName(dir)+"-"); ok && ifname != "" {
			return ifname, true
		}
	}
	return "", false
}

// podsSet names local's verdict map in dir from a peer's address to the
// chain of its identity's pair; cidrsSet the one from address ranges (and
// any protocol) to the chain of the CIDR identity's pair.
func podsSet(local identity.ID, dir policy.Direction, v6 bool) string {
	return fmt.Sprintf("pods%s-%d-%s", famSuffix(v6), local, dirName(dir))
}

func cidrsSet(local identity.ID, dir policy.Direction, v6 bool) string {
	return fmt.Sprintf("cidrs%s-%d-%s", famSuffix(v6), local, dirName(dir))
}

func famSuffix(v6 bool) string {
	if v6 {
		return "6"
	}
	return "4"
}

// localSets are the four verdict maps of local in dir, created and
// removed together.
func localSets(t *nftables.Table, local identity.ID, dir policy.Direction) []*nftables.Set {
	return verdictMaps(t, func(v6 bool) string { return podsSet(local, dir, v6) },
		func(v6 bool) string { return cidrsSet(local, dir, v6) })
}

// verdictMaps are, for both families, a map from a peer's address and one
// from address ranges (and any protocol) to a chain.
func verdictMaps(t *nftables.Table, pods, cidrs func(v6 bool) string) []*nftables.Set {
	var out []*nftables.Set
	for _, v6 := range []bool{false, true} {
		addr, cidr := nftables.TypeIPAddr, typeCIDR4
		if v6 {
			addr, cidr = nftables.TypeIP6Addr, typeCIDR6
		}
		out = append(out,
			&nftables.Set{Table: t, Name: pods(v6), IsMap: true, KeyType: addr, DataType: nftables.TypeVerdict},
			&nftables.Set{Table: t, Name: cidrs(v6), IsMap: true, Interval: true, Concatenation: true,
				KeyType: cidr, DataType: nftables.TypeVerdict})
	}
	return out
}

// parseLocalSet reads back the names of localSets (adoption at start).
func parseLocalSet(name string) (local identity.ID, dir policy.Direction, v6, cidr, ok bool) {
	kind, rest, found := strings.Cut(name, "-")
	if !found {
		return 0, 0, false, false, false
	}
	switch kind {
	case "pods4", "pods6", "cidrs4", "cidrs6":
	default:
		return 0, 0, false, false, false
	}
	v6, cidr = strings.HasSuffix(kind, "6"), strings.HasPrefix(kind, "cidrs")
	num, d, _ := strings.Cut(rest, "-")
	n, err := strconv.ParseUint(num, 10, 32)
	if err != nil || (d != "in" && d != "out") {
		return 0, 0, false, false, false
	}
	dir = policy.Ingress
	if d == "out" {
		dir = policy.Egress
	}
	return identity.ID(n), dir, v6, cidr, true
}

// pairChain names the chain of what g allows.
func pairChain(g group) string {
	return fmt.Sprintf("p-%d-%d-%s", g.local, g.remote, dirName(g.dir))
}

// parsePairChain reads back pairChain's names (adoption at start).
func parsePairChain(name string) (group, bool) {
	var local, remote uint32
	var dir string
	if n, err := fmt.Sscanf(name, "p-%d-%d-%s", &local, &remote, &dir); err != nil || n != 3 || (dir != "in" && dir != "out") {
		return group{}, false
	}
	g := group{local: identity.ID(local), remote: identity.ID(remote), dir: policy.Ingress}
	if dir == "out" {
		g.dir = policy.Egress
	}
	return g, pairChain(g) == name
}

var (
	// An address range and any protocol: the kernel's interval maps of
	// more than one field take ranges with both ends, whatever the family.
	typeCIDR4 = nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto)
	typeCIDR6 = nftables.MustConcatSetType(nftables.TypeIP6Addr, nftables.TypeInetProto)
	typeSrc4  = nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeIPAddr)
	typeSrc6  = nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeIP6Addr)
)

// layout is the table's fixed part: its sets and hook chains.
type layout struct {
	table   *nftables.Table
	sets    map[string]*nftables.Set
	hooks   []hookChain
	allowed []*nftables.Chain
	limits  []*nftables.NamedObj
	// isoChains are node isolation's chains, by name (nodeiso_linux.go).
	isoChains map[string]*nftables.Chain
}

type hookChain struct {
	dir   policy.Direction
	chain *nftables.Chain
}

func newLayout() *layout {
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName}
	l := &layout{table: t, sets: map[string]*nftables.Set{}}
	add := func(s *nftables.Set) { s.Table = t; l.sets[s.Name] = s }
	add(&nftables.Set{Name: setHost4, KeyType: nftables.TypeIPAddr})
	add(&nftables.Set{Name: setHost6, KeyType: nftables.TypeIP6Addr})
	add(&nftables.Set{Name: setSrc4, Concatenation: true, KeyType: typeSrc4})
	add(&nftables.Set{Name: setSrc6, Concatenation: true, KeyType: typeSrc6})
	add(&nftables.Set{Name: setPodIfs, KeyType: nftables.TypeIFName, KeyByteOrder: binaryutil.NativeEndian})
	l.addNodeIsoLayout()
	for _, dir := range []policy.Direction{policy.Ingress, policy.Egress} {
		add(&nftables.Set{Name: epsSet(dir), IsMap: true, KeyType: nftables.TypeIFName, DataType: nftables.TypeVerdict,
			KeyByteOrder: binaryutil.NativeEndian})
	}
	accept := nftables.ChainPolicyAccept
	for _, h := range []struct {
		name string
		hook *nftables.ChainHook
		prio int32
		dir  policy.Direction
	}{
		{chainEgress, nftables.ChainHookForward, 0, policy.Egress},
		{chainIngress, nftables.ChainHookForward, 1, policy.Ingress},
		{chainInput, nftables.ChainHookInput, 0, policy.Egress},
	} {
		l.hooks = append(l.hooks, hookChain{dir: h.dir, chain: &nftables.Chain{Name: h.name, Table: t, Type: nftables.ChainTypeFilter,
			Hooknum: h.hook, Priority: nftables.ChainPriorityRef(*nftables.ChainPriorityFilter + nftables.ChainPriority(h.prio)), Policy: &accept}})
	}
	for _, h := range []struct {
		name string
		hook *nftables.ChainHook
	}{{chainAllowedFwd, nftables.ChainHookForward}, {chainAllowedIn, nftables.ChainHookInput},
		{chainAllowedOut, nftables.ChainHookOutput}} {
		l.allowed = append(l.allowed, &nftables.Chain{Name: h.name, Table: t, Type: nftables.ChainTypeFilter,
			Hooknum: h.hook, Priority: nftables.ChainPriorityRef(*nftables.ChainPriorityFilter + 10), Policy: &accept})
	}
	for _, lim := range []struct {
		name        string
		rate, burst uint32
	}{{limitDropLog, dropLogNodeRate, dropLogNodeBurst}, {limitAllowedLog, allowedLogNodeRate, allowedLogNodeBurst}} {
		l.limits = append(l.limits, &nftables.NamedObj{Table: t, Name: lim.name, Type: nftables.ObjTypeLimit,
			Obj: &expr.Limit{Type: expr.LimitTypePkts, Rate: uint64(lim.rate), Unit: expr.LimitTimeSecond, Burst: lim.burst}})
	}
	return l
}

// setAllowed queues the allowed-flow chains' content: their rules when
// on, nothing when off.
func (l *layout) setAllowed(c *nftables.Conn, on bool) {
	for _, ch := range l.allowed {
		c.AddChain(ch)
		c.FlushChain(ch)
		if on {
			for _, e := range allowedRules(ch.Name) {
				c.AddRule(&nftables.Rule{Table: l.table, Chain: ch, Exprs: e})
			}
		}
	}
}

// ensure queues what creates the table and its fixed part, or re-asserts
// it over an existing table without touching set contents: a restart
// keeps what is in force.
func (l *layout) ensure(c *nftables.Conn) error {
	c.AddTable(l.table)
	for _, s := range l.sets {
		if err := c.AddSet(s, nil); err != nil {
			return fmt.Errorf("nftables datapath: set %s: %w", s.Name, err)
		}
	}
	for _, name := range dropCounters() {
		c.AddObj(&nftables.CounterObj{Table: l.table, Name: name})
	}
	for _, o := range l.limits {
		c.AddObj(o)
	}
	// Their content stays: an adopted table's isolation is in force until
	// the first flush rewrites it.
	for _, name := range []string{chainIsoPod, chainIsoNode} {
		c.AddChain(l.isoChains[name])
	}
	for _, h := range l.hooks {
		c.AddChain(h.chain)
		// The dispatch is replaced in the same transaction: no packet
		// passes between the flush and the new rule.
		c.FlushChain(h.chain)
		for _, e := range append(isoHookRules(h.chain.Name), dispatchRule(h.dir)) {
			c.AddRule(&nftables.Rule{Table: l.table, Chain: h.chain, Exprs: e})
		}
	}
	// Allowed flows are off until a reader asks for them.
	l.setAllowed(c, false)
	return nil
}
