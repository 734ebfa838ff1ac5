package netsetup

import (
	"net/netip"
	"strings"
	"testing"
)

func TestHostIfName(t *testing.T) {
	a := HostIfName("net", "c0ffee", "eth0")
	if len(a) != maxIfNameLen || !strings.HasPrefix(a, HostIfPrefix) {
		t.Fatalf("HostIfName = %q: want 15 chars starting with %q", a, HostIfPrefix)
	}
	if b := HostIfName("net", "c0ffee", "eth0"); a != b {
		t.Fatalf("HostIfName not deterministic: %q vs %q", a, b)
	}
	distinct := map[string][3]string{}
	for _, in := range [][3]string{
		{"net", "c0ffee", "eth0"},
		{"net", "c0ffee", "eth1"},
		{"net", "c0ffe", "eeth0"}, // same concatenation without separators
		{"net2", "c0ffee", "eth0"},
		{"", "", ""},
	} {
		name := HostIfName(in[0], in[1], in[2])
		if prev, dup := distinct[name]; dup {
			t.Errorf("HostIfName%v = HostIfName%v = %q", in, prev, name)
		}
		distinct[name] = in
	}
}

func FuzzHostIfName(f *testing.F) {
	f.Add("coordino", "0123456789abcdef", "eth0")
	f.Add("", "", "")
	f.Add("a\x00b", "/../", "\xa0 :")
	f.Fuzz(func(t *testing.T, network, containerID, ifname string) {
		name := HostIfName(network, containerID, ifname)
		if len(name) != maxIfNameLen || !strings.HasPrefix(name, HostIfPrefix) {
			t.Fatalf("HostIfName = %q: want %d chars starting with %q", name, maxIfNameLen, HostIfPrefix)
		}
		if err := validIfName("name", name); err != nil {
			t.Fatalf("HostIfName produced an invalid interface name: %v", err)
		}
		if again := HostIfName(network, containerID, ifname); again != name {
			t.Fatalf("not deterministic: %q then %q", name, again)
		}
	})
}

func FuzzValidIfName(f *testing.F) {
	for _, s := range []string{"eth0", "", ".", "..", "a/b", "a:b", "a b", "\xa0", "0123456789abcdef", "net1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		err := validIfName("IfName", name)
		if err != nil {
			if !strings.Contains(err.Error(), "IfName") {
				t.Fatalf("error %q does not name the field", err)
			}
			return
		}
		// Byte-wise on purpose: the kernel knows no UTF-8.
		if len(name) == 0 || len(name) > maxIfNameLen || name == "." || name == ".." ||
			hasForbiddenByte(name) {
			t.Fatalf("accepted invalid interface name %q", name)
		}
	})
}

func TestValidate(t *testing.T) {
	good := PodConfig{
		NetNSPath:  "/run/coordino/netns/x",
		IfName:     "eth0",
		HostIfName: HostIfName("n", "c", "eth0"),
		Addrs:      []netip.Prefix{netip.MustParsePrefix("10.0.0.5/32"), netip.MustParsePrefix("fd00::5/128")},
	}
	if err := good.validate(); err != nil {
		t.Fatalf("valid config rejected: %v", err)
	}
	cases := []struct {
		name   string
		mutate func(c *PodConfig)
		want   string
	}{
		{"no netns", func(c *PodConfig) { c.NetNSPath = "" }, "NetNSPath is empty"},
		{"no ifname", func(c *PodConfig) { c.IfName = "" }, "IfName is empty"},
		{"long ifname", func(c *PodConfig) { c.IfName = "0123456789abcdef" }, "IfName \"0123456789abcdef\" is 16 bytes"},
		{"slash ifname", func(c *PodConfig) { c.IfName = "a/b" }, "IfName \"a/b\" contains the invalid byte"},
		{"foreign host name", func(c *PodConfig) { c.HostIfName = "veth1234" }, "does not start with \"cdo\""},
		{"no addrs", func(c *PodConfig) { c.Addrs = nil }, "Addrs is empty"},
		{"v4 not /32", func(c *PodConfig) { c.Addrs[0] = netip.MustParsePrefix("10.0.0.5/24") }, "10.0.0.5/24 must be a /32"},
		{"v6 not /128", func(c *PodConfig) { c.Addrs[1] = netip.MustParsePrefix("fd00::5/64") }, "fd00::5/64 must be a /128"},
		{"mapped", func(c *PodConfig) { c.Addrs[0] = netip.MustParsePrefix("::ffff:10.0.0.5/128") }, "IPv4-mapped"},
		{"duplicate", func(c *PodConfig) { c.Addrs[1] = c.Addrs[0] }, "listed twice"},
		{"link-local", func(c *PodConfig) { c.Addrs[0] = netip.MustParsePrefix("169.254.1.1/32") }, "not a usable unicast"},
		{"invalid prefix", func(c *PodConfig) { c.Addrs[0] = netip.Prefix{} }, "invalid prefix"},
		{"small MTU v6", func(c *PodConfig) { c.MTU = 1000 }, "MTU 1000 is outside 1280..65535"},
		{"huge MTU", func(c *PodConfig) { c.MTU = 70000 }, "MTU 70000 is outside"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := good
			cfg.Addrs = append([]netip.Prefix(nil), good.Addrs...)
			c.mutate(&cfg)
			err := cfg.validate()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("validate() = %v, want %q", err, c.want)
			}
		})
	}
}

func TestRandomMAC(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		m := randomMAC()
		if !isLocalUnicast(m) {
			t.Fatalf("randomMAC() = %s: not locally administered unicast", m)
		}
		seen[m.String()] = true
	}
	if len(seen) < 99 {
		t.Fatalf("only %d distinct MACs in 100", len(seen))
	}
}

func hasForbiddenByte(s string) bool {
	for i := 0; i < len(s); i++ {
		if strings.IndexByte("/: \t\n\v\f\r\x00\xa0", s[i]) >= 0 {
			return true
		}
	}
	return false
}
