package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	inspectv1 "github.com/coordino/coordino/proto/inspect/v1"
)

var commands []command

func init() {
	commands = []command{
		{name: "status", summary: "daemon health with a verdict line", args: exactArgs(0, ""), run: runStatus},
		{name: "endpoints", summary: "list pod attachments", args: exactArgs(0, ""), run: runEndpoints},
		{name: "endpoint get", summary: "one attachment by pod (namespace/name, name) or container ID", args: exactArgs(1, "a pod or container ID"), run: runEndpointGet},
		{name: "identities", summary: "security identities of this node", args: exactArgs(0, ""), run: runIdentities},
		{name: "ipam", summary: "address blocks, usage and allocations", args: exactArgs(0, ""), run: runIPAM},
		{name: "policy explain", summary: "why a flow is allowed or denied (--from, --to, --port P/proto)", flags: explainFlags, args: exactArgs(0, ""), run: runExplain},
		{name: "flows", summary: "dropped (and, with --follow, allowed) flows, filtered", flags: flowFlags, args: exactArgs(0, ""), run: runFlows},
		{name: "bugtool", summary: "write a bug-report tarball (secrets removed)", flags: bugtoolFlags, args: exactArgs(0, ""), run: runBugtool},
		{name: "version", summary: "coordinoctl and daemon versions", args: exactArgs(0, ""), run: runVersion},
		{name: "completion", summary: "print a shell completion script (bash)", args: exactArgs(1, "a shell: bash"), run: runCompletion},
	}
}

func runStatus(ctx context.Context, c *client, _ []string) error {
	ctx, cancel := c.rpcContext(ctx)
	defer cancel()
	st, err := c.inspect.GetStatus(ctx, &inspectv1.GetStatusRequest{})
	if err != nil {
		return err
	}
	return c.print(st, func(w io.Writer) {
		row(w, "Node:", fmt.Sprintf("%s (%s mode, control plane %s)", st.NodeName, st.Mode, st.ControlPlane))
		row(w, "Version:", st.Version)
		row(w, "Up since:", time.Unix(st.StartedUnix, 0).UTC().Format(time.RFC3339))
		datapathRows(w, st)
		row(w, "Endpoints:", fmt.Sprintf("%d primary, %d chained", st.PrimaryEndpoints, st.ChainedEndpoints))
		row(w, "Identities:", st.Identities)
		row(w, "Policy revision:", fmt.Sprintf("%d (%d invalid policies)", st.PolicyRevision, st.InvalidPolicies))
		if len(st.Blocks) == 0 {
			row(w, "IP blocks:", "none (chained attachments only)")
		}
		for i, b := range st.Blocks {
			label := " "
			if i == 0 {
				label = "IP blocks:"
			}
			row(w, label, fmt.Sprintf("%s  %d/%d used (%s), %d free%s", b.Cidr, b.Used, b.Size, percent(b.Used, b.Size), b.Free, capNote(b.Cidr)))
		}
		crossNode(w, st.CrossNode, time.Now())
		masquerade(w, st.Masquerade)
		for i, m := range st.Maps {
			label := " "
			if i == 0 {
				label = "BPF maps:"
			}
			line := fmt.Sprintf("%-14s %d/%d (%s)", m.Name, m.Entries, m.Capacity, percent(m.Entries, m.Capacity))
			if m.UpdateFailures > 0 {
				line += fmt.Sprintf(", %d refused writes", m.UpdateFailures)
			}
			if m.Refusing {
				line += ", REFUSING UPDATES"
			}
			row(w, label, line)
		}
		row(w, "Delete queue:", fmt.Sprintf("%d pending", st.DeleteQueue))
		kernelFeatures(w, st.KernelFeatures)
		for _, p := range st.Problems {
			row(w, "Problem:", p)
		}
		row(w, "Verdict:", strings.ToUpper(st.Verdict))
	})
}

func runEndpoints(ctx context.Context, c *client, _ []string) error {
	ctx, cancel := c.rpcContext(ctx)
	defer cancel()
	resp, err := c.inspect.ListEndpoints(ctx, &inspectv1.ListEndpointsRequest{})
	if err != nil {
		return err
	}
	return c.print(resp, func(w io.Writer) {
		row(w, "POD", "CONTAINER", "IFNAME", "MODE", "IPS", "HOST IF", "IDENTITY", "ISOLATED", "ATTACH")
		for _, e := range resp.Endpoints {
			row(w, podOf(e), short(e.ContainerId), e.Ifname, e.Mode, strings.Join(e.Ips, ","), e.HostInterface, e.Identity, isolation(e), e.AttachMode)
		}
	})
}

func runEndpointGet(ctx context.Context, c *client, args []string) error {
	ctx, cancel := c.rpcContext(ctx)
	defer cancel()
	e, err := c.inspect.GetEndpoint(ctx, &inspectv1.GetEndpointRequest{Query: args[0]})
	if err != nil {
		return err
	}
	return c.print(e, func(w io.Writer) {
		row(w, "Key:", e.Key)
		row(w, "Pod:", podOf(e))
		row(w, "Pod UID:", e.PodUid)
		row(w, "Container:", e.ContainerId)
		row(w, "Interface:", e.Ifname)
		row(w, "Mode:", e.Mode)
		row(w, "Addresses:", strings.Join(e.Ips, ", "))
		row(w, "Host interface:", fmt.Sprintf("%s (ifindex %d)", e.HostInterface, e.HostIfindex))
		row(w, "Netns:", e.Netns)
		row(w, "Identity:", e.Identity)
		row(w, "Labels:", labels(e.Labels))
		row(w, "Isolated:", isolation(e))
		row(w, "Attach mode:", e.AttachMode)
		row(w, "Created:", time.Unix(e.CreatedUnix, 0).UTC().Format(time.RFC3339))
	})
}

func runIdentities(ctx context.Context, c *client, _ []string) error {
	ctx, cancel := c.rpcContext(ctx)
	defer cancel()
	resp, err := c.inspect.ListIdentities(ctx, &inspectv1.ListIdentitiesRequest{})
	if err != nil {
		return err
	}
	return c.print(resp, func(w io.Writer) {
		row(w, "ID", "NAMESPACE", "LABELS", "ENDPOINTS")
		for _, id := range resp.Identities {
			row(w, id.Id, id.Namespace, labels(id.Labels), id.Endpoints)
		}
	})
}

func runIPAM(ctx context.Context, c *client, _ []string) error {
	ctx, cancel := c.rpcContext(ctx)
	defer cancel()
	resp, err := c.inspect.GetIPAM(ctx, &inspectv1.GetIPAMRequest{})
	if err != nil {
		return err
	}
	return c.print(resp, func(w io.Writer) {
		row(w, "BLOCK", "SIZE", "USED", "FREE", "USAGE")
		for _, b := range resp.Blocks {
			row(w, b.Cidr, b.Size, b.Used, b.Free, percent(b.Used, b.Size)+capNote(b.Cidr))
		}
		fmt.Fprintln(w)
		row(w, "ADDRESS", "POD", "ENDPOINT")
		for _, a := range resp.Allocations {
			row(w, a.Ip, a.Pod, a.Endpoint)
		}
	})
}

func runVersion(ctx context.Context, c *client, _ []string) error {
	fmt.Fprintln(c.out, "coordinoctl:", clientVersion())
	ctx, cancel := c.rpcContext(ctx)
	defer cancel()
	st, err := c.inspect.GetStatus(ctx, &inspectv1.GetStatusRequest{})
	if err != nil {
		return err
	}
	fmt.Fprintln(c.out, "daemon:     ", st.Version)
	return nil
}

// capNote explains a block's size when the allocator's cap, not the CIDR,
// sets it: an IPv6 /64 hands out its first 65,536 addresses only.
func capNote(cidr string) string {
	p, err := netip.ParsePrefix(cidr)
	if err != nil || p.Addr().BitLen()-p.Bits() <= 16 {
		return ""
	}
	return " (a block hands out its first 65,536 addresses only)"
}

// crossNode shows how pods of other nodes are reached, and each peer's
// WireGuard handshake age.
func crossNode(w io.Writer, x *inspectv1.CrossNode, now time.Time) {
	if x == nil {
		return
	}
	row(w, "Cross-node:", fmt.Sprintf("routing %s, encryption %s", x.Routing, x.Encryption))
	if x.Encryption == "wireguard" {
		row(w, "WireGuard:", fmt.Sprintf("%s device, public key %s", x.WireguardDevice, x.PublicKey))
	}
	for i, n := range x.BgpNeighbors {
		label := " "
		if i == 0 {
			label = "BGP:"
		}
		line := fmt.Sprintf("%s  AS %d  %s  %d received, %d accepted, %d sent", orDash(n.Address), n.Asn, orDash(n.State), n.Received, n.Accepted, n.Sent)
		if n.Problem != "" {
			line += "  (" + n.Problem + ")"
		}
		row(w, label, line)
	}
	if x.Routing == "bgp" {
		// Other nodes' blocks come from the fabric, not from a peer set.
		return
	}
	if len(x.Peers) == 0 {
		row(w, "Peers:", "none")
	}
	for i, p := range x.Peers {
		label := " "
		if i == 0 {
			label = "Peers:"
		}
		line := fmt.Sprintf("%s  %s  blocks %s", p.Name, orDash(strings.Join(p.Addresses, ",")), orDash(strings.Join(p.Blocks, ",")))
		if x.Encryption == "wireguard" && p.Problem == "" {
			hs := "no handshake yet"
			if p.LastHandshakeUnix > 0 {
				hs = "handshake " + now.Sub(time.Unix(p.LastHandshakeUnix, 0)).Round(time.Second).String() + " ago"
			}
			line += fmt.Sprintf("  %s (endpoint %s, %d B in, %d B out)", hs, orDash(p.Endpoint), p.RxBytes, p.TxBytes)
		}
		if p.Problem != "" {
			line += "  " + strings.ToUpper(p.Problem[:1]) + p.Problem[1:]
		}
		row(w, label, line)
	}
}

// masquerade shows the NAT of traffic leaving the cluster and what it
// counted, with the conntrack failures that port exhaustion shows as.
func masquerade(w io.Writer, m *inspectv1.Masquerade) {
	if m == nil {
		return
	}
	if !m.Enabled {
		row(w, "Masquerade:", "off (pods leave the cluster with their own address)")
		return
	}
	row(w, "Masquerade:", fmt.Sprintf("on: %d IPv4, %d IPv6 connections; conntrack insert failures %d, drops %d",
		m.ConnectionsIpv4, m.ConnectionsIpv6, m.ConntrackInsertFailed, m.ConntrackDrop))
	row(w, " ", "sources "+orDash(strings.Join(m.Sources, ",")))
	if len(m.Exempt) > 0 {
		row(w, " ", "exempt (natOutgoing false) "+strings.Join(m.Exempt, ","))
	}
	row(w, " ", "Service ranges "+orDash(strings.Join(m.ServiceCidrs, ",")))
	row(w, " ", "non-masquerade "+orDash(strings.Join(m.NonMasqueradeCidrs, ",")))
}

// kernelFeatures shows the daemon's kernel feature table, and for each
// missing feature what the daemon does instead.
func kernelFeatures(w io.Writer, fs []*inspectv1.KernelFeature) {
	for i, f := range fs {
		label := " "
		if i == 0 {
			label = "Kernel features:"
		}
		cells := []any{label, f.Name, "yes", f.Detail}
		if !f.Available {
			cells[2] = "no"
			cells = append(cells, f.Effect)
		}
		row(w, cells...)
	}
}

func podOf(e *inspectv1.Endpoint) string {
	if e.PodName == "" {
		return ""
	}
	return e.PodNamespace + "/" + e.PodName
}

func short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

func isolation(e *inspectv1.Endpoint) string {
	var s []string
	if e.IngressIsolated {
		s = append(s, "ingress")
	}
	if e.EgressIsolated {
		s = append(s, "egress")
	}
	return strings.Join(s, "+")
}

func sortedKeys(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }

// datapathRows says what enforces policy and, when --datapath=auto fell
// back to nftables, why.
func datapathRows(w io.Writer, st *inspectv1.Status) {
	switch st.Datapath {
	case "", "ebpf":
		row(w, "Datapath:", "eBPF, attach mode "+st.AttachMode)
	default:
		row(w, "Datapath:", st.Datapath)
	}
	if st.DatapathFallback != "" {
		row(w, "Fallback:", "--datapath=auto could not load eBPF: "+st.DatapathFallback)
	}
}
