package chaining

import (
	"net/netip"
	"testing"

	current "github.com/containernetworking/cni/pkg/types/100"
)

// FuzzPodAddresses: whatever a primary plugin puts in prevResult, finding the
// pod interface and its addresses never panics and only ever returns host
// prefixes of addresses prevResult lists, and their networks are those
// addresses with a length valid for their family.
func FuzzPodAddresses(f *testing.F) {
	f.Add([]byte(`{"cniVersion":"1.0.0","interfaces":[{"name":"cali1"}],"ips":[{"address":"10.0.0.5/32"}]}`), "10.0.0.5")
	f.Add([]byte(`{"cniVersion":"1.0.0","interfaces":[{"name":"eni1"},{"name":"eth0","sandbox":"/ns"},{"name":"dummy","mac":"0","sandbox":"0"}],"ips":[{"interface":1,"address":"10.0.0.6/32"}]}`), "")
	f.Add([]byte(`{"cniVersion":"1.0.0","interfaces":[null],"ips":[{"interface":-3,"address":"fd00::1/64"},{"interface":7,"address":"10.0.0.1/8"}]}`), "fd00::1")
	f.Add([]byte(`{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/ns"}],"ips":[{"interface":0,"address":"10.22.0.5/16"},{"address":"0.0.0.1/0"}]}`), "")
	f.Fuzz(func(t *testing.T, prev []byte, onPod string) {
		res, err := current.NewResult(prev)
		if err != nil {
			return
		}
		r, err := current.NewResultFromResult(res)
		if err != nil {
			return
		}
		var addrs []netip.Addr
		if a, err := netip.ParseAddr(onPod); err == nil {
			addrs = append(addrs, a)
		}
		idx := PodInterface(r, "/ns", "eth0")
		listed := map[netip.Addr]bool{}
		for _, ip := range r.IPs {
			if a, ok := netip.AddrFromSlice(ip.Address.IP); ok {
				listed[a.Unmap()] = true
			}
		}
		for _, p := range PodAddresses(r, idx, addrs) {
			if !listed[p.Addr()] || p.Bits() != p.Addr().BitLen() {
				t.Fatalf("PodAddresses returned %v, not a host prefix of a listed address", p)
			}
		}
		for _, p := range PodNetworks(r, idx, addrs) {
			if !listed[p.Addr()] || !p.IsValid() {
				t.Fatalf("PodNetworks returned %v, not a network of a listed address", p)
			}
		}
	})
}
