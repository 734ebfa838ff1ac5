package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	flowv1 "github.com/coordino/coordino/proto/flow/v1"
	inspectv1 "github.com/coordino/coordino/proto/inspect/v1"
)

var flowOpts struct {
	follow                                 bool
	pod, namespace, verdict, reason, proto string
	since                                  string
	identity, port                         uint
}

func flowFlags(fs *flag.FlagSet) {
	fs.BoolVar(&flowOpts.follow, "follow", false, "keep printing new flows (allowed ones too, unless --verdict dropped)")
	fs.BoolVar(&flowOpts.follow, "f", false, "short for --follow")
	fs.StringVar(&flowOpts.pod, "pod", "", "flows from or to this pod (namespace/name or name)")
	fs.StringVar(&flowOpts.namespace, "namespace", "", "flows from or to pods of this namespace")
	fs.UintVar(&flowOpts.identity, "identity", 0, "flows whose local or remote identity is this")
	fs.StringVar(&flowOpts.verdict, "verdict", "", "allowed or dropped")
	fs.StringVar(&flowOpts.reason, "reason", "", "a datapath reason, e.g. policy-denied")
	fs.UintVar(&flowOpts.port, "port", 0, "flows with this source or destination port")
	fs.StringVar(&flowOpts.proto, "protocol", "", "TCP, UDP, SCTP, ICMP or ICMPv6")
	fs.StringVar(&flowOpts.since, "since", "", "remembered drops since a duration ago (5m) or a time (RFC 3339)")
}

// flowFilter matches events against the command-line filters. Pod and
// namespace filters match by address, so both ends of a flow count.
type flowFilter struct {
	c        *client
	addrs    map[string]bool
	resolved time.Time
}

func (f *flowFilter) refresh(ctx context.Context) error {
	if flowOpts.pod == "" && flowOpts.namespace == "" {
		return nil
	}
	ctx, cancel := f.c.rpcContext(ctx)
	defer cancel()
	resp, err := f.c.inspect.ListEndpoints(ctx, &inspectv1.ListEndpointsRequest{})
	if err != nil {
		return err
	}
	f.addrs = map[string]bool{}
	for _, e := range resp.Endpoints {
		pod := e.PodNamespace + "/" + e.PodName
		if flowOpts.pod != "" && flowOpts.pod != pod && flowOpts.pod != e.PodName && flowOpts.pod != e.ContainerId {
			continue
		}
		if flowOpts.namespace != "" && flowOpts.namespace != e.PodNamespace {
			continue
		}
		for _, ip := range e.Ips {
			f.addrs[ip] = true
		}
	}
	f.resolved = time.Now()
	return nil
}

func (f *flowFilter) match(ctx context.Context, ev *flowv1.FlowEvent) bool {
	if flowOpts.verdict != "" && ev.Verdict != flowOpts.verdict {
		return false
	}
	if flowOpts.reason != "" && ev.Reason != flowOpts.reason {
		return false
	}
	if flowOpts.proto != "" && !strings.EqualFold(ev.Protocol, flowOpts.proto) {
		return false
	}
	if flowOpts.port != 0 && ev.SrcPort != uint32(flowOpts.port) && ev.DstPort != uint32(flowOpts.port) {
		return false
	}
	if flowOpts.identity != 0 && ev.LocalIdentity != uint32(flowOpts.identity) && ev.RemoteIdentity != uint32(flowOpts.identity) {
		return false
	}
	if f.addrs != nil {
		if !f.addrs[ev.Src] && !f.addrs[ev.Dst] && time.Since(f.resolved) > time.Second {
			// A pod created after we started: look again, at most once a second.
			_ = f.refresh(ctx)
		}
		return f.addrs[ev.Src] || f.addrs[ev.Dst]
	}
	return true
}

func parseSince(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		return time.Now().Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("%w: --since %q: want a duration (5m) or an RFC 3339 time", errUsage, s)
}

func runFlows(ctx context.Context, c *client, _ []string) error {
	if flowOpts.verdict != "" && flowOpts.verdict != "allowed" && flowOpts.verdict != "dropped" {
		return fmt.Errorf("%w: --verdict %q: must be allowed or dropped", errUsage, flowOpts.verdict)
	}
	since, err := parseSince(flowOpts.since)
	if err != nil {
		return err
	}
	f := &flowFilter{c: c}
	if err := f.refresh(ctx); err != nil {
		return err
	}
	p := newFlowPrinter(c)
	defer p.flush()
	// Subscribe before listing history, so nothing falls between the two.
	var stream flowv1.Observer_FollowFlowsClient
	if flowOpts.follow {
		if stream, err = c.follow(ctx, &flowv1.FollowFlowsRequest{DroppedOnly: flowOpts.verdict == "dropped"}); err != nil {
			return err
		}
	}
	if !flowOpts.follow || flowOpts.since != "" {
		rctx, cancel := c.rpcContext(ctx)
		recent, err := c.inspect.ListRecentFlows(rctx, &inspectv1.ListRecentFlowsRequest{SinceUnixNano: sinceNano(since)})
		cancel()
		if err != nil {
			return err
		}
		for _, ev := range recent.Flows {
			if f.match(ctx, ev) {
				if err := p.print(ev); err != nil {
					return err
				}
			}
		}
	}
	if stream == nil {
		return nil
	}
	p.flush()
	for {
		ev, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
				return nil
			}
			return err
		}
		if f.match(ctx, ev) {
			if err := p.print(ev); err != nil {
				return err
			}
			p.flush()
		}
	}
}

// follow opens a flow stream. --timeout bounds connecting and the opening
// (the daemon's headers say it has subscribed), not the healthy stream.
func (c *client) follow(ctx context.Context, req *flowv1.FollowFlowsRequest) (flowv1.Observer_FollowFlowsClient, error) {
	ctx, cancel := context.WithCancel(ctx)
	timer := time.AfterFunc(c.timeout, cancel)
	stream, err := c.flows.FollowFlows(ctx, req)
	if err == nil {
		_, err = stream.Header()
	}
	if !timer.Stop() {
		return nil, errNoAnswer
	}
	if err != nil {
		cancel()
		return nil, err
	}
	// The stream lives until the caller's ctx ends, which also releases ours.
	return stream, nil
}

func sinceNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// flowPrinter writes one line per flow: a table row, or a JSON/YAML document.
type flowPrinter struct {
	c      *client
	tw     *tabwriter.Writer
	header bool
}

func newFlowPrinter(c *client) *flowPrinter {
	return &flowPrinter{c: c, tw: tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)}
}

func (p *flowPrinter) print(ev *flowv1.FlowEvent) error {
	switch p.c.output {
	case "json":
		b, err := marshal(ev, "json", false)
		if err != nil {
			return err
		}
		_, err = p.c.out.Write(b)
		return err
	case "yaml":
		b, err := marshal(ev, "yaml", false)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(p.c.out, "---\n%s", b)
		return err
	}
	if !p.header {
		row(p.tw, "TIME", "ENDPOINT", "DIR", "VERDICT", "REASON", "PROTO", "SOURCE", "DESTINATION", "IDENTITIES")
		p.header = true
	}
	from, to := localFirst(ev)
	row(p.tw, time.Unix(0, ev.TimeUnixNano).UTC().Format("15:04:05.000"), ev.Endpoint, ev.Direction, ev.Verdict, ev.Reason, ev.Protocol,
		hostPort(ev.Src, ev.SrcPort), hostPort(ev.Dst, ev.DstPort), fmt.Sprintf("%d->%d", from, to))
	return nil
}

func (p *flowPrinter) flush() { _ = p.tw.Flush() }

func hostPort(addr string, port uint32) string {
	if port == 0 {
		return addr
	}
	if strings.Contains(addr, ":") {
		return "[" + addr + "]:" + strconv.Itoa(int(port))
	}
	return addr + ":" + strconv.Itoa(int(port))
}

// localFirst orders the identities as source and destination.
func localFirst(ev *flowv1.FlowEvent) (uint32, uint32) {
	if ev.Direction == "egress" {
		return ev.LocalIdentity, ev.RemoteIdentity
	}
	return ev.RemoteIdentity, ev.LocalIdentity
}
