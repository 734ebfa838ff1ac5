package masquerade

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// TableName names the table (family inet).
const TableName = "coordino-nat"

const chainName = "postrouting"

// Config is what the masquerade matches. A connection is masqueraded when
// its source is in Sources and not in Exempt, and its destination (after
// any DNAT) is in none of Cluster.
type Config struct {
	// Sources are the pod CIDRs whose traffic leaving the cluster is
	// masqueraded: every node's pod blocks.
	Sources []netip.Prefix
	// Exempt are sources never masqueraded: IPPools with natOutgoing false.
	Exempt []netip.Prefix
	// Cluster are destinations never masqueraded: every pod CIDR, node
	// address and Service range, and the non-masquerade CIDRs.
	Cluster []netip.Prefix
}

// the sets, per family: what Config fills them with.
var setNames = [...]string{"sources", "exempt", "cluster"}

func (c Config) prefixes(set string) []netip.Prefix {
	switch set {
	case "sources":
		return c.Sources
	case "exempt":
		return c.Exempt
	}
	return c.Cluster
}

// family is one address family's shape in the inet table.
type family struct {
	suffix  string // of the set names
	nfproto byte
	keyType nftables.SetDatatype
	saddr   uint32 // network header offsets
	daddr   uint32
	alen    uint32
}

var families = [...]family{
	{"4", unix.NFPROTO_IPV4, nftables.TypeIPAddr, 12, 16, 4},
	{"6", unix.NFPROTO_IPV6, nftables.TypeIP6Addr, 8, 24, 16},
}

func (f family) v6() bool { return f.nfproto == unix.NFPROTO_IPV6 }

// Table is the masquerade's nftables table in one network namespace.
type Table struct {
	// NetNS, when not 0, is a file descriptor of the network namespace
	// the table lives in (tests); 0 is the daemon's own.
	NetNS int

	mu sync.Mutex
	// last is what the sets hold, by set name with family suffix; nil
	// until this process wrote the whole table (or after a failed write).
	last map[string][]span
}

func (t *Table) conn() (*nftables.Conn, error) {
	var opts []nftables.ConnOption
	if t.NetNS != 0 {
		opts = append(opts, nftables.WithNetNSFd(t.NetNS))
	}
	c, err := nftables.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("masquerade: nftables: %w", err)
	}
	return c, nil
}

// Apply makes the table masquerade what cfg says. The first call of a
// process writes the whole table in one transaction (a table left by an
// earlier run keeps masquerading until it commits); later calls add and
// delete only the set elements that changed.
func (t *Table) Apply(cfg Config) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	want := map[string][]span{}
	for _, f := range families {
		for _, s := range setNames {
			want[s+f.suffix] = spans(cfg.prefixes(s), f.v6())
		}
	}
	c, err := t.conn()
	if err != nil {
		return err
	}
	tbl := &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName}
	whole := t.last == nil
	if whole {
		if err := t.build(c, tbl, want); err != nil {
			return err
		}
	} else {
		for _, f := range families {
			for _, s := range setNames {
				name := s + f.suffix
				set := &nftables.Set{Table: tbl, Name: name, KeyType: f.keyType, Interval: true}
				if gone := diff(t.last[name], want[name]); len(gone) > 0 {
					if err := c.SetDeleteElements(set, elements(gone)); err != nil {
						return fmt.Errorf("masquerade: delete from set %s: %w", name, err)
					}
				}
				if added := diff(want[name], t.last[name]); len(added) > 0 {
					if err := c.SetAddElements(set, elements(added)); err != nil {
						return fmt.Errorf("masquerade: add to set %s: %w", name, err)
					}
				}
			}
		}
	}
	if err := c.Flush(); err != nil {
		// What the kernel holds is unknown now: the next call writes all.
		t.last = nil
		what := "update sets"
		if whole {
			what = "install table (needs nf_tables and nft_masq)"
		}
		return fmt.Errorf("masquerade: %s: %w", what, err)
	}
	t.last = want
	return nil
}

// build queues the whole table: sets emptied and refilled, the chain's
// rules replaced.
func (t *Table) build(c *nftables.Conn, tbl *nftables.Table, want map[string][]span) error {
	c.AddTable(tbl)
	sets := map[string]*nftables.Set{}
	for _, f := range families {
		for _, s := range setNames {
			name := s + f.suffix
			set := &nftables.Set{Table: tbl, Name: name, KeyType: f.keyType, Interval: true}
			if err := c.AddSet(set, nil); err != nil {
				return fmt.Errorf("masquerade: set %s: %w", name, err)
			}
			c.FlushSet(set)
			if len(want[name]) > 0 {
				if err := c.SetAddElements(set, elements(want[name])); err != nil {
					return fmt.Errorf("masquerade: fill set %s: %w", name, err)
				}
			}
			sets[name] = set
		}
	}
	accept := nftables.ChainPolicyAccept
	ch := c.AddChain(&nftables.Chain{
		Name: chainName, Table: tbl, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept,
	})
	c.FlushChain(ch)
	for _, f := range families {
		// A named counter outlives the rules that refer to it: a
		// restarted daemon's rewrite does not reset what was counted.
		c.AddObj(&nftables.NamedObj{Table: tbl, Name: counterName(f), Type: nftables.ObjTypeCounter, Obj: &expr.Counter{}})
		c.AddRule(&nftables.Rule{Table: tbl, Chain: ch, Exprs: masqueradeRule(f, sets), UserData: []byte(ruleTag(f))})
	}
	return nil
}

func ruleTag(f family) string { return "masquerade-ipv" + f.suffix }

func counterName(f family) string { return "masqueraded-ipv" + f.suffix }

// masqueradeRule: a connection of family f from sources (not exempt) to no
// cluster destination is counted and masqueraded. The NAT chain sees only
// a connection's first packet, so the counter counts connections.
func masqueradeRule(f family, sets map[string]*nftables.Set) []expr.Any {
	lookup := func(off uint32, set string, invert bool) []expr.Any {
		s := sets[set+f.suffix]
		return []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: f.alen},
			&expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID, Invert: invert},
		}
	}
	e := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{f.nfproto}},
	}
	e = append(e, lookup(f.saddr, "sources", false)...)
	e = append(e, lookup(f.saddr, "exempt", true)...)
	e = append(e, lookup(f.daddr, "cluster", true)...)
	// Fully random ports: racing connections of two pods do not pick the
	// same port and lose one at conntrack's insert (Calico and Cilium's
	// iptables mode do the same).
	return append(e, &expr.Objref{Type: int(nftables.ObjTypeCounter), Name: counterName(f)}, &expr.Masq{FullyRandom: true})
}

// elements are the interval set elements of ss: a start, and an end unless
// the span runs to the top of the address space.
func elements(ss []span) []nftables.SetElement {
	var out []nftables.SetElement
	for _, s := range ss {
		out = append(out, nftables.SetElement{Key: s.start.AsSlice()})
		if s.end.IsValid() {
			out = append(out, nftables.SetElement{Key: s.end.AsSlice(), IntervalEnd: true})
		}
	}
	return out
}

// Counters are what the masquerade counted since its table was made.
type Counters struct {
	// Connections masqueraded, per family ("ipv4", "ipv6").
	Connections map[string]uint64
}

// Counters reads the named counters; ok is false when there is no table.
func (t *Table) Counters() (cs Counters, ok bool, err error) {
	c, err := t.conn()
	if err != nil {
		return cs, false, err
	}
	tbl, err := c.ListTableOfFamily(TableName, nftables.TableFamilyINet)
	if errors.Is(err, unix.ENOENT) {
		return cs, false, nil
	}
	if err != nil {
		return cs, false, fmt.Errorf("masquerade: look up table %s: %w", TableName, err)
	}
	objs, err := c.GetNamedObjects(tbl)
	if err != nil {
		return cs, false, fmt.Errorf("masquerade: read counters: %w", err)
	}
	cs.Connections = map[string]uint64{}
	for _, o := range objs {
		no, isNamed := o.(*nftables.NamedObj)
		if !isNamed {
			continue
		}
		for _, f := range families {
			if ctr, isCounter := no.Obj.(*expr.Counter); isCounter && no.Name == counterName(f) {
				cs.Connections["ipv"+f.suffix] = ctr.Packets
			}
		}
	}
	return cs, true, nil
}

// Remove deletes the table (masquerade off, or uninstall); an absent one
// is fine.
func (t *Table) Remove() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.last = nil
	c, err := t.conn()
	if err != nil {
		return err
	}
	if _, err := c.ListTableOfFamily(TableName, nftables.TableFamilyINet); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("masquerade: look up table %s: %w", TableName, err)
	}
	c.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: TableName})
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("masquerade: remove table %s: %w", TableName, err)
	}
	return nil
}
