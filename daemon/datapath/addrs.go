package datapath

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/coordino/coordino/bpf"
	"go.uber.org/zap"
)

// The programs drop every packet a pod sends from an address that is not
// one of its own (anti-spoofing). Its addresses are written here, from the
// attach path, before its programs are attached, and removed on detach.

func epAddrKey(ifindex int, ip netip.Addr) bpf.CoordinoEpAddrKey {
	k := bpf.CoordinoEpAddrKey{Ifindex: uint32(ifindex)}
	k.Family, k.Addr = packetAddr(ip)
	return k
}

// packetAddr is ip as the programs parse it from a packet: family 4 with
// the address in the first four bytes and the rest zero, or family 6.
func packetAddr(ip netip.Addr) (family uint8, b [16]byte) {
	ip = ip.Unmap()
	if ip.Is4() {
		a := ip.As4()
		copy(b[:], a[:])
		return 4, b
	}
	return 6, ip.As16()
}

// writeAddrs allows r's addresses as sources on its host interface; on
// failure none of those it wrote stays, but the ones old (the key's
// previous attachment, or nil) still uses.
func (e *endpoints) writeAddrs(r, old *record) error {
	for i, ip := range r.IPs {
		k := epAddrKey(r.HostIfIndex, ip)
		if err := e.addrs.Update(&k, uint32(0), ebpf.UpdateAny); err != nil {
			err = e.health.refused(e.addrs, bpf.CoordinoMapCdoEpAddrs, err)
			written := *r
			written.IPs = r.IPs[:i]
			if derr := e.deleteAddrs(&written, old); derr != nil {
				e.log.Warn("source addresses left after a refused write", zap.String("endpoint", r.Key), zap.Error(derr))
			}
			return fmt.Errorf("endpoint %q: allow source %s: %w", r.Key, ip, err)
		}
	}
	if len(r.IPs) > 0 {
		e.health.accepted(bpf.CoordinoMapCdoEpAddrs)
	}
	return nil
}

// deleteAddrs removes the addresses of old that keep stays without; keep
// may be nil (the endpoint is gone).
func (e *endpoints) deleteAddrs(old, keep *record) error {
	kept := map[bpf.CoordinoEpAddrKey]bool{}
	if keep != nil {
		for _, ip := range keep.IPs {
			kept[epAddrKey(keep.HostIfIndex, ip)] = true
		}
	}
	var errs []error
	for _, ip := range old.IPs {
		k := epAddrKey(old.HostIfIndex, ip)
		if kept[k] {
			continue
		}
		if err := deleteKey(e.addrs, &k); err != nil {
			errs = append(errs, fmt.Errorf("endpoint %q: remove source %s: %w", old.Key, ip, err))
		}
	}
	return errors.Join(errs...)
}
