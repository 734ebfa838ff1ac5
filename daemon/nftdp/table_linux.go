package nftdp

import (
	"fmt"

	"github.com/google/nftables"

	"github.com/coordino/coordino/daemon/policy"
)

// TableName is the datapath's table, in the inet family.
const TableName = "coordino-policy"

// Set names.
const (
	setIpcache4   = "ipcache4"
	setIpcache6   = "ipcache6"
	setCIDR4      = "cidr4"
	setCIDR6      = "cidr6"
	setSrc4       = "src4"
	setSrc6       = "src6"
	setPortProtos = "port-protos"
)

// Hook chains. Filter priority, like kube-proxy's and iptables' filter
// tables: they all see the packet after DNAT (prerouting, -100); any drop
// is final and an accept lets the next one decide, so their order among
// each other does not change a verdict.
const (
	chainForward = "forward"
	chainInput   = "input"
)

func allowSet(dir policy.Direction) string {
	if dir == policy.Egress {
		return "allow-out"
	}
	return "allow-in"
}

func epsSet(dir policy.Direction) string {
	if dir == policy.Egress {
		return "eps-out"
	}
	return "eps-in"
}

// endpointChain names the chain of the pod interface ifname for dir.
func endpointChain(ifname string, dir policy.Direction) string {
	if dir == policy.Egress {
		return "out-" + ifname
	}
	return "in-" + ifname
}

var (
	typeAllow = nftables.MustConcatSetType(nftables.TypeInteger, nftables.TypeInteger, nftables.TypeInetProto, nftables.TypeInetService)
	typeCIDR4 = nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInteger)
	typeCIDR6 = nftables.MustConcatSetType(nftables.TypeIP6Addr, nftables.TypeInteger)
	typeSrc4  = nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeIPAddr)
	typeSrc6  = nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeIP6Addr)
)

// layout is the table's fixed part: its sets and hook chains.
type layout struct {
	table *nftables.Table
	sets  map[string]*nftables.Set
	hooks []*nftables.Chain
}

func newLayout() *layout {
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName}
	l := &layout{table: t, sets: map[string]*nftables.Set{}}
	add := func(s *nftables.Set) { s.Table = t; l.sets[s.Name] = s }
	add(&nftables.Set{Name: setIpcache4, IsMap: true, KeyType: nftables.TypeIPAddr, DataType: nftables.TypeInteger})
	add(&nftables.Set{Name: setIpcache6, IsMap: true, KeyType: nftables.TypeIP6Addr, DataType: nftables.TypeInteger})
	add(&nftables.Set{Name: setCIDR4, IsMap: true, Interval: true, Concatenation: true, KeyType: typeCIDR4, DataType: nftables.TypeInteger})
	add(&nftables.Set{Name: setCIDR6, IsMap: true, Interval: true, Concatenation: true, KeyType: typeCIDR6, DataType: nftables.TypeInteger})
	add(&nftables.Set{Name: setSrc4, Concatenation: true, KeyType: typeSrc4})
	add(&nftables.Set{Name: setSrc6, Concatenation: true, KeyType: typeSrc6})
	add(&nftables.Set{Name: setPortProtos, KeyType: nftables.TypeInetProto})
	for _, dir := range []policy.Direction{policy.Ingress, policy.Egress} {
		add(&nftables.Set{Name: allowSet(dir), Interval: true, Concatenation: true, KeyType: typeAllow})
		add(&nftables.Set{Name: epsSet(dir), IsMap: true, KeyType: nftables.TypeIFName, DataType: nftables.TypeVerdict})
	}
	accept := nftables.ChainPolicyAccept
	for _, h := range []struct {
		name string
		hook *nftables.ChainHook
	}{{chainForward, nftables.ChainHookForward}, {chainInput, nftables.ChainHookInput}} {
		l.hooks = append(l.hooks, &nftables.Chain{Name: h.name, Table: t, Type: nftables.ChainTypeFilter,
			Hooknum: h.hook, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	}
	return l
}

// ensure queues what creates the table and its fixed part, or re-asserts
// it over an existing table without touching set contents: a restart
// keeps what is in force.
func (l *layout) ensure(c *nftables.Conn) error {
	c.AddTable(l.table)
	for _, s := range l.sets {
		var elems []nftables.SetElement
		if s.Name == setPortProtos {
			elems = []nftables.SetElement{{Key: []byte{6}}, {Key: []byte{17}}, {Key: []byte{132}}}
		}
		if err := c.AddSet(s, elems); err != nil {
			return fmt.Errorf("nftables datapath: set %s: %w", s.Name, err)
		}
	}
	for _, ch := range l.hooks {
		c.AddChain(ch)
		// The dispatch is replaced in the same transaction: no packet
		// passes between the flush and the new rules.
		c.FlushChain(ch)
		for _, e := range dispatchRules(ch.Hooknum) {
			c.AddRule(&nftables.Rule{Table: l.table, Chain: ch, Exprs: e})
		}
	}
	return nil
}

