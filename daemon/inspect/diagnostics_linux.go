package inspect

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"

	"github.com/vishvananda/netlink"
	"google.golang.org/protobuf/proto"

	inspectv1 "github.com/coordino/coordino/proto/inspect/v1"
)

// maxConntrackDump bounds the conntrack entries in a bug report.
const maxConntrackDump = 10000

// CollectDiagnostics implements Inspector.CollectDiagnostics. The daemon
// reads no key or token files for it, and every file still passes through
// inspectv1.Redact. A part that cannot be collected becomes an .error file
// rather than failing the whole report.
func (s *Service) CollectDiagnostics(ctx context.Context, _ *inspectv1.CollectDiagnosticsRequest) (*inspectv1.Diagnostics, error) {
	out := &inspectv1.Diagnostics{}
	add := func(name string, data []byte, err error) {
		if err != nil {
			name, data = name+".error", []byte(err.Error()+"\n")
		}
		out.Files = append(out.Files, &inspectv1.DiagnosticFile{Name: name, Content: inspectv1.Redact(data)})
	}
	addProto := func(name string, m proto.Message, err error) {
		if err != nil {
			add(name, nil, err)
			return
		}
		b, err := inspectv1.JSON(m, "  ") // what coordinoctl -o json prints
		add(name, b, err)
	}
	add("version.txt", []byte(Version()+"\n"), nil)
	if s.cfg.Logs != nil {
		add("daemon.log", s.cfg.Logs.Bytes(), nil)
	}
	cfg, err := json.MarshalIndent(s.cfg.Options, "", "  ")
	add("config.json", cfg, err)
	st, err := s.GetStatus(ctx, nil)
	addProto("status.json", st, err)
	stored, err := s.cfg.Store.List("")
	if err == nil {
		b, jerr := json.MarshalIndent(stored, "", "  ")
		add("store/endpoints.json", b, jerr)
	} else {
		add("store/endpoints.json", nil, err)
	}
	eps, err := s.ListEndpoints(ctx, nil)
	addProto("endpoints.json", eps, err)
	ids, err := s.ListIdentities(ctx, nil)
	addProto("identities.json", ids, err)
	ipam, err := s.GetIPAM(ctx, nil)
	addProto("ipam.json", ipam, err)
	drops, err := s.ListRecentFlows(ctx, &inspectv1.ListRecentFlowsRequest{})
	addProto("recent-drops.json", drops, err)
	if s.cfg.Datapath != nil {
		var b bytes.Buffer
		err := s.cfg.Datapath.DumpMaps(&b, maxConntrackDump)
		add("bpf/maps.json", b.Bytes(), err)
	}
	for _, f := range netlinkDump() {
		add(f.name, f.data, f.err)
	}
	return out, nil
}

type dumpFile struct {
	name string
	data []byte
	err  error
}

// netlinkDump lists links, addresses, routes, neighbours, qdiscs and tc
// filters of the daemon's network namespace, over netlink.
func netlinkDump() []dumpFile {
	var files []dumpFile
	links, err := netlink.LinkList()
	if err != nil {
		return []dumpFile{{name: "net/links.txt", err: fmt.Errorf("list links: %w", err)}}
	}
	var l, a, q, f bytes.Buffer
	for _, link := range links {
		at := link.Attrs()
		fmt.Fprintf(&l, "%d: %s type=%s mtu=%d state=%s flags=%s master=%d parent=%d netnsid=%d mac=%s\n",
			at.Index, at.Name, link.Type(), at.MTU, at.OperState, at.Flags, at.MasterIndex, at.ParentIndex, at.NetNsID, at.HardwareAddr)
		addrs, _ := netlink.AddrList(link, netlink.FAMILY_ALL)
		for _, ad := range addrs {
			fmt.Fprintf(&a, "%s: %s scope=%d flags=%d\n", at.Name, ad.IPNet, ad.Scope, ad.Flags)
		}
		qdiscs, _ := netlink.QdiscList(link)
		for _, qd := range qdiscs {
			fmt.Fprintf(&q, "%s: %s %s\n", at.Name, qd.Type(), qd.Attrs())
		}
		for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
			filters, _ := netlink.FilterList(link, parent)
			for _, fl := range filters {
				fmt.Fprintf(&f, "%s parent %x: %s", at.Name, parent, fl.Type())
				if b, ok := fl.(*netlink.BpfFilter); ok {
					fmt.Fprintf(&f, " name=%s id=%d direct-action=%t", b.Name, b.Id, b.DirectAction)
				}
				fmt.Fprintln(&f)
			}
		}
	}
	files = append(files, dumpFile{name: "net/links.txt", data: l.Bytes()}, dumpFile{name: "net/addresses.txt", data: a.Bytes()},
		dumpFile{name: "net/qdiscs.txt", data: q.Bytes()}, dumpFile{name: "net/filters.txt", data: f.Bytes()})
	var r bytes.Buffer
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: 0}, 0)
	for _, rt := range routes {
		fmt.Fprintln(&r, rt.String())
	}
	files = append(files, dumpFile{name: "net/routes.txt", data: r.Bytes(), err: err})
	var n bytes.Buffer
	neighs, err := netlink.NeighList(0, netlink.FAMILY_ALL)
	for _, ne := range neighs {
		fmt.Fprintf(&n, "ifindex=%d %s lladdr=%s state=%#x flags=%#x\n", ne.LinkIndex, ne.IP, ne.HardwareAddr, ne.State, ne.Flags)
	}
	return append(files, dumpFile{name: "net/neighbors.txt", data: n.Bytes(), err: err})
}
