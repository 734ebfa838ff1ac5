package chaining

import (
	"net"
	"net/netip"
	"reflect"
	"testing"

	current "github.com/containernetworking/cni/pkg/types/100"
)

func ipc(iface *int, cidr string) *current.IPConfig {
	ip, n, _ := net.ParseCIDR(cidr)
	n.IP = ip
	return &current.IPConfig{Interface: iface, Address: *n}
}

func TestPodInterfaceAndAddresses(t *testing.T) {
	const sandbox = "/var/run/netns/p"
	host := &current.Interface{Name: "cali0123"}
	pod := &current.Interface{Name: "eth0", Sandbox: sandbox}
	pfx := netip.MustParsePrefix
	cases := []struct {
		name    string
		res     *current.Result
		onPod   []netip.Addr
		wantIdx int
		want    []netip.Prefix
	}{
		{"named: its IPs and unbound ones",
			&current.Result{Interfaces: []*current.Interface{host, pod}, IPs: []*current.IPConfig{
				ipc(current.Int(1), "10.0.0.5/24"), ipc(current.Int(0), "10.0.0.1/24"), ipc(nil, "fd00::5/64")}},
			nil, 1, []netip.Prefix{pfx("10.0.0.5/32"), pfx("fd00::5/128")}},
		{"host side only (Calico): the kernel picks",
			&current.Result{Interfaces: []*current.Interface{host}, IPs: []*current.IPConfig{ipc(nil, "10.0.0.5/32"), ipc(nil, "10.0.0.9/32")}},
			[]netip.Addr{netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("fe80::1")}, -1, []netip.Prefix{pfx("10.0.0.5/32")}},
		{"pod interface without sandbox",
			&current.Result{Interfaces: []*current.Interface{host, {Name: "eth0"}}, IPs: []*current.IPConfig{ipc(current.Int(1), "10.0.0.5/32")}},
			[]netip.Addr{netip.MustParseAddr("10.0.0.5")}, -1, []netip.Prefix{pfx("10.0.0.5/32")}},
		{"nothing of prevResult on the pod",
			&current.Result{Interfaces: []*current.Interface{host}, IPs: []*current.IPConfig{ipc(nil, "10.0.0.5/32")}},
			[]netip.Addr{netip.MustParseAddr("10.0.0.6")}, -1, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			idx := PodInterface(tc.res, sandbox, "eth0")
			if idx != tc.wantIdx {
				t.Fatalf("PodInterface = %d, want %d", idx, tc.wantIdx)
			}
			if got := PodAddresses(tc.res, idx, tc.onPod); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("PodAddresses = %v, want %v", got, tc.want)
			}
		})
	}
}

// PodNetworks keeps prevResult's prefix length; a mask of no prefix shape
// gives the host prefix.
func TestPodNetworks(t *testing.T) {
	pod := &current.Interface{Name: "eth0", Sandbox: "/ns"}
	odd := ipc(nil, "10.0.0.7/32")
	odd.Address.Mask = net.IPMask{255, 0, 255, 0}
	v4in16 := ipc(nil, "10.0.0.8/32")
	v4in16.Address.Mask = net.CIDRMask(96+20, 128)
	res := &current.Result{Interfaces: []*current.Interface{pod}, IPs: []*current.IPConfig{
		ipc(current.Int(0), "10.22.0.5/16"), ipc(nil, "fd00:22::5/64"), odd, v4in16}}
	want := []netip.Prefix{netip.MustParsePrefix("10.22.0.5/16"), netip.MustParsePrefix("fd00:22::5/64"),
		netip.MustParsePrefix("10.0.0.7/32"), netip.MustParsePrefix("10.0.0.8/20")}
	if got := PodNetworks(res, 0, nil); !reflect.DeepEqual(got, want) {
		t.Fatalf("PodNetworks = %v, want %v", got, want)
	}
}
