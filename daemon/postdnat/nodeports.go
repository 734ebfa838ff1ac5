package postdnat

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strconv"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// NodePort is one of this node's addresses on a Service's NodePort port
// and protocol (6 TCP, 17 UDP, 132 SCTP): kube-proxy translates it as it
// does a ClusterIP.
type NodePort struct {
	Addr  netip.Addr
	Proto uint8
	Port  uint16
}

// Canonical is np with an IPv4-mapped address unmapped.
func (np NodePort) Canonical() NodePort {
	np.Addr = np.Addr.Unmap()
	return np
}

// Valid says what is wrong with np, naming the field.
func (np NodePort) Valid() error {
	switch {
	case !np.Addr.IsValid():
		return errors.New("addr: not an address")
	case np.Proto != 6 && np.Proto != 17 && np.Proto != 132:
		return fmt.Errorf("proto: %d is not TCP, UDP or SCTP", np.Proto)
	case np.Port == 0:
		return errors.New("port: 0")
	}
	return nil
}

func (np NodePort) String() string {
	name := map[uint8]string{6: "tcp", 17: "udp", 132: "sctp"}[np.Proto]
	if name == "" {
		name = strconv.Itoa(int(np.Proto))
	}
	return netip.AddrPortFrom(np.Addr, np.Port).String() + "/" + name
}

// nodePortSetName names the set of deferred node ports in each family's table.
const nodePortSetName = "nodeports"

// The set's key: address . protocol . port, each padded to 4 bytes (the
// register size), as nftables concatenations are.
var nodePortKeyTypes = map[nftables.TableFamily]nftables.SetDatatype{
	nftables.TableFamilyIPv4: nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeInetService),
	nftables.TableFamilyIPv6: nftables.MustConcatSetType(nftables.TypeIP6Addr, nftables.TypeInetProto, nftables.TypeInetService),
}

func nodePortSet(t *nftables.Table) *nftables.Set {
	return &nftables.Set{Table: t, Name: nodePortSetName, KeyType: nodePortKeyTypes[t.Family], Concatenation: true}
}

// nodePortElements are the set elements of nps in family fam.
func nodePortElements(fam nftables.TableFamily, nps []NodePort) []nftables.SetElement {
	var out []nftables.SetElement
	for _, np := range nps {
		np = np.Canonical()
		if np.Addr.Is4() != (fam == nftables.TableFamilyIPv4) {
			continue
		}
		key := append([]byte{}, np.Addr.AsSlice()...)
		key = append(key, np.Proto, 0, 0, 0)
		key = binary.BigEndian.AppendUint16(key, np.Port)
		key = append(key, 0, 0)
		out = append(out, nftables.SetElement{Key: key})
	}
	return out
}

// nft's 32-bit registers (NFT_REG32_00 and on): a concatenation is loaded
// into consecutive ones.
const reg32 = 8

// nodePortRule: a packet in its connection's original direction, first
// addressed to a node port of the set, that prog matches, is dropped. The
// protocol is the packet's (DNAT keeps it); address and port are the
// connection's original ones.
func nodePortRule(fam nftables.TableFamily, set *nftables.Set, prog int) []expr.Any {
	addrRegs := uint32(1)
	if fam == nftables.TableFamilyIPv6 {
		addrRegs = 4
	}
	return append([]expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeyDIRECTION},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0}}, // IP_CT_DIR_ORIGINAL
		&expr.Ct{Register: reg32, Key: expr.CtKeyDST, Direction: 0},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg32 + addrRegs},
		&expr.Ct{Register: reg32 + addrRegs + 1, Key: expr.CtKeyPROTODST, Direction: 0},
		&expr.Lookup{SourceRegister: reg32, SetName: set.Name, SetID: set.ID},
	}, matchDrop(prog)...)
}

// UpdateNodePorts adds and removes node ports in the installed stage's
// sets, in one transaction.
func UpdateNodePorts(add, del []NodePort) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("post-DNAT stage: nftables: %w", err)
	}
	for _, fam := range []nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyIPv6} {
		set := nodePortSet(&nftables.Table{Family: fam, Name: TableName})
		if elems := nodePortElements(fam, del); len(elems) > 0 {
			if err := c.SetDeleteElements(set, elems); err != nil {
				return fmt.Errorf("post-DNAT stage: delete from set %s: %w", set.Name, err)
			}
		}
		if elems := nodePortElements(fam, add); len(elems) > 0 {
			if err := c.SetAddElements(set, elems); err != nil {
				return fmt.Errorf("post-DNAT stage: add to set %s: %w", set.Name, err)
			}
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("post-DNAT stage: update node ports: %w", err)
	}
	return nil
}
