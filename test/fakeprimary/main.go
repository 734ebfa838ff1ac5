package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/containernetworking/plugins/pkg/ip"
	"github.com/containernetworking/plugins/pkg/ipam"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
)

type conf struct {
	types.NetConf
	Shape    string         `json:"shape"`
	Delegate map[string]any `json:"delegate,omitempty"`
}

// gateway is the link-local next hop the routed shapes give pods; the host
// veth answers ARP for it (proxy ARP), as routed primaries do.
var gateway = net.IPv4(169, 254, 1, 1)

func main() {
	skel.PluginMainFuncs(skel.CNIFuncs{Add: cmdAdd, Del: cmdDel, Check: func(*skel.CmdArgs) error { return nil }},
		version.All, "fakeprimary (test only)")
}

func load(stdin []byte) (*conf, error) {
	var c conf
	if err := json.Unmarshal(stdin, &c); err != nil {
		return nil, err
	}
	switch c.Shape {
	case "calico", "aws-vpc", "aws-legacy", "no-sandbox", "flannel":
	default:
		return nil, fmt.Errorf("shape %q unknown", c.Shape)
	}
	return &c, nil
}

// hostVeth names the host side from the attachment, as routed primaries do.
func hostVeth(prefix string, args *skel.CmdArgs) string {
	sum := sha256.Sum256([]byte(args.ContainerID + "/" + args.IfName))
	return prefix + hex.EncodeToString(sum[:])[:15-len(prefix)]
}

func prefixFor(shape string) string {
	if shape == "calico" {
		return "cali"
	}
	return "eni"
}

// flannelDelegate is the delegate's config: ours minus the shape, plus the
// delegate's own keys, carrying our ipam section verbatim, as Flannel does.
func flannelDelegate(c *conf, stdin []byte) (string, []byte) {
	var raw map[string]any
	_ = json.Unmarshal(stdin, &raw)
	d := map[string]any{"name": c.Name, "cniVersion": c.CNIVersion, "ipam": raw["ipam"]}
	for k, v := range c.Delegate {
		d[k] = v
	}
	typ, _ := d["type"].(string)
	return typ, mustJSON(d)
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

func cmdAdd(args *skel.CmdArgs) error {
	c, err := load(args.StdinData)
	if err != nil {
		return err
	}
	if c.Shape == "flannel" {
		typ, d := flannelDelegate(c, args.StdinData)
		res, err := invoke.DelegateAdd(context.Background(), typ, d, nil)
		if err != nil {
			return err
		}
		return types.PrintResult(res, c.CNIVersion)
	}

	ipamRes, err := ipam.ExecAdd(c.IPAM.Type, args.StdinData)
	if err != nil {
		return fmt.Errorf("ipam: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			_ = ipam.ExecDel(c.IPAM.Type, args.StdinData)
		}
	}()
	res, err := current.NewResultFromResult(ipamRes)
	if err != nil || len(res.IPs) == 0 {
		return fmt.Errorf("ipam returned no address: %v", err)
	}
	podAddr := net.IPNet{IP: res.IPs[0].Address.IP, Mask: net.CIDRMask(32, 32)}
	hostName := hostVeth(prefixFor(c.Shape), args)

	podNS, err := ns.GetNS(args.Netns)
	if err != nil {
		return err
	}
	defer podNS.Close()
	hostNS, err := ns.GetCurrentNS()
	if err != nil {
		return err
	}
	defer hostNS.Close()
	if err := podNS.Do(func(ns.NetNS) error {
		if _, _, err := ip.SetupVethWithName(args.IfName, hostName, 1500, "", hostNS); err != nil {
			return err
		}
		l, err := netlink.LinkByName(args.IfName)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &podAddr}); err != nil {
			return err
		}
		gw := &net.IPNet{IP: gateway, Mask: net.CIDRMask(32, 32)}
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: gw, Scope: netlink.SCOPE_LINK}); err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: gateway})
	}); err != nil {
		return fmt.Errorf("pod side: %w", err)
	}
	host, err := netlink.LinkByName(hostName)
	if err != nil {
		return err
	}
	// Proxy ARP for the gateway, answered at once (the default delay is up to 0.8 s).
	for f, v := range map[string]string{"conf/" + hostName + "/proxy_arp": "1", "neigh/" + hostName + "/proxy_delay": "0"} {
		if err := os.WriteFile("/proc/sys/net/ipv4/"+f, []byte(v), 0o644); err != nil {
			return err
		}
	}
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: host.Attrs().Index, Dst: &podAddr, Scope: netlink.SCOPE_LINK}); err != nil {
		return err
	}

	out := &current.Result{CNIVersion: current.ImplementedSpecVersion}
	hostIf := &current.Interface{Name: hostName}
	switch c.Shape {
	case "calico", "aws-legacy":
		out.Interfaces = []*current.Interface{hostIf}
		out.IPs = []*current.IPConfig{{Address: podAddr}}
	case "aws-vpc":
		sum := sha256.Sum256([]byte(args.ContainerID))
		out.Interfaces = []*current.Interface{hostIf, {Name: args.IfName, Sandbox: args.Netns},
			{Name: "dummy" + hex.EncodeToString(sum[:5]), Mac: "0", Sandbox: "0"}}
		out.IPs = []*current.IPConfig{{Interface: current.Int(1), Address: podAddr, Gateway: gateway}}
	case "no-sandbox":
		out.Interfaces = []*current.Interface{hostIf, {Name: args.IfName}}
		out.IPs = []*current.IPConfig{{Interface: current.Int(1), Address: podAddr}}
	}
	ok = true
	return types.PrintResult(out, c.CNIVersion)
}

func cmdDel(args *skel.CmdArgs) error {
	c, err := load(args.StdinData)
	if err != nil {
		return err
	}
	if c.Shape == "flannel" {
		typ, d := flannelDelegate(c, args.StdinData)
		return invoke.DelegateDel(context.Background(), typ, d, nil)
	}
	if l, err := netlink.LinkByName(hostVeth(prefixFor(c.Shape), args)); err == nil {
		if err := netlink.LinkDel(l); err != nil {
			return err
		}
	}
	return ipam.ExecDel(c.IPAM.Type, args.StdinData)
}
