package postdnat

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
	"golang.org/x/sys/unix"
)

// TableName names the stage's table in the ip and ip6 families.
const TableName = "coordino-services"

const chainName = "post-dnat"

// priority is NF_IP_PRI_NAT_DST + 1: right after kube-proxy's DNAT (its
// iptables nat PREROUTING, or its nftables "dstnat" chains), before
// filtering and routing.
const priority = -100 + 1

// xtBPFInfo is the kernel's struct xt_bpf_info_v1: mode, program length,
// fd, a 512-byte union (bytecode or pinned path) and a kernel-only pointer.
const (
	xtBPFInfoSize = 528
	xtBPFModeFD   = 2 // XT_BPF_MODE_FD_ELF: the program by file descriptor
)

// Install makes the stage run the socket filter program prog (a file
// descriptor) for packets whose connection was first addressed to one of
// cidrs or to one of nodePorts, in both families, and clear marks after it:
// one transaction that creates or replaces everything of the stage. The
// kernel takes its own reference on prog; the caller may close it
// afterwards.
func Install(prog int, cidrs []netip.Prefix, nodePorts []NodePort, marks uint32) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("post-DNAT stage: nftables: %w", err)
	}
	for _, fam := range []nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyIPv6} {
		t := c.AddTable(&nftables.Table{Family: fam, Name: TableName})
		set := nodePortSet(t)
		if err := c.AddSet(set, nil); err != nil {
			return fmt.Errorf("post-DNAT stage: set %s: %w", set.Name, err)
		}
		c.FlushSet(set)
		if elems := nodePortElements(fam, nodePorts); len(elems) > 0 {
			if err := c.SetAddElements(set, elems); err != nil {
				return fmt.Errorf("post-DNAT stage: fill set %s: %w", set.Name, err)
			}
		}
		accept := nftables.ChainPolicyAccept
		ch := c.AddChain(&nftables.Chain{
			Name: chainName, Table: t, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRef(priority), Policy: &accept,
		})
		c.FlushChain(ch)
		for _, p := range cidrs {
			if p.Addr().Is4() != (fam == nftables.TableFamilyIPv4) {
				continue
			}
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: decideRule(p.Masked(), prog)})
		}
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: nodePortRule(fam, set, prog)})
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: clearMarks(marks)})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("post-DNAT stage: install nftables chains (needs nf_tables, nft_compat and xt_bpf): %w", err)
	}
	return nil
}

// Remove deletes the stage's tables; absent ones are fine.
func Remove() error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("post-DNAT stage: nftables: %w", err)
	}
	tables, err := c.ListTables()
	if err != nil {
		return fmt.Errorf("post-DNAT stage: list nftables tables: %w", err)
	}
	found := false
	for _, t := range tables {
		if t.Name == TableName && (t.Family == nftables.TableFamilyIPv4 || t.Family == nftables.TableFamilyIPv6) {
			c.DelTable(t)
			found = true
		}
	}
	if !found {
		return nil
	}
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("post-DNAT stage: remove nftables tables: %w", err)
	}
	return nil
}

// Installed reports whether the stage's IPv4 table exists.
func Installed() (bool, error) {
	c, err := nftables.New()
	if err != nil {
		return false, err
	}
	_, err = c.ListTableOfFamily(TableName, nftables.TableFamilyIPv4)
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	return err == nil, err
}

// decideRule: a packet in its connection's original direction, first
// addressed to p, that prog matches, is dropped.
func decideRule(p netip.Prefix, prog int) []expr.Any {
	addr := p.Addr().AsSlice()
	mask := make([]byte, len(addr))
	for i := range p.Bits() {
		mask[i/8] |= 0x80 >> (i % 8)
	}
	return append([]expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeyDIRECTION},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0}}, // IP_CT_DIR_ORIGINAL
		&expr.Ct{Register: 1, Key: expr.CtKeyDST, Direction: 0},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: uint32(len(addr)), Mask: mask, Xor: make([]byte, len(addr))},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: addr},
	}, matchDrop(prog)...)
}

// matchDrop: prog matches, the packet is dropped.
func matchDrop(prog int) []expr.Any {
	return []expr.Any{
		&expr.Match{Name: "bpf", Rev: 1, Info: xtBPFInfo(prog)},
		&expr.Counter{},
		&expr.Verdict{Kind: expr.VerdictDrop},
	}
}

// xtBPFInfo is xt_bpf_info_v1 naming prog by file descriptor.
func xtBPFInfo(prog int) *xt.Unknown {
	info := make(xt.Unknown, xtBPFInfoSize)
	binary.NativeEndian.PutUint16(info[0:], xtBPFModeFD)
	binary.NativeEndian.PutUint32(info[4:], uint32(prog))
	return &info
}

// clearMarks: the marks the tc program set for the stage do not leave it.
func clearMarks(marks uint32) []expr.Any {
	mask := make([]byte, 4)
	binary.NativeEndian.PutUint32(mask, ^marks)
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1},
	}
}
