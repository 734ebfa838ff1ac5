package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
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
	fs.StringVar(&flowOpts.verdict, "verdict", "", "allowed (with --follow only: only drops are remembered) or dropped")
	fs.StringVar(&flowOpts.reason, "reason", "", "a datapath reason, e.g. policy-denied")
	fs.UintVar(&flowOpts.port, "port", 0, "flows with this source or destination port")
	fs.StringVar(&flowOpts.proto, "protocol", "", "TCP, UDP, SCTP, ICMP or ICMPv6")
	fs.StringVar(&flowOpts.since, "since", "", "remembered drops since a duration ago (5m) or a time (RFC 3339)")
}

// flowFilter matches events against the command-line filters and names
// their endpoints. Pod and namespace filters match by address, so both ends
// of a flow count.
type flowFilter struct {
	c *client
	// names maps attachment keys to namespace/pod, for the table.
	names    map[string]string
	addrs    map[string]bool
	resolved time.Time
}

// needsEndpoints reports whether the endpoint list is needed at all.
func (f *flowFilter) needsEndpoints() bool {
	return flowOpts.pod != "" || flowOpts.namespace != "" || f.c.output == "table"
}

func (f *flowFilter) refresh(ctx context.Context) error {
	if !f.needsEndpoints() {
		return nil
	}
	ctx, cancel := f.c.rpcContext(ctx)
	defer cancel()
	resp, err := f.c.inspect.ListEndpoints(ctx, &inspectv1.ListEndpointsRequest{})
	if err != nil {
		return err
	}
	f.names = map[string]string{}
	filtered := flowOpts.pod != "" || flowOpts.namespace != ""
	if filtered {
		f.addrs = map[string]bool{}
	}
	for _, e := range resp.Endpoints {
		if e.PodName != "" {
			f.names[e.Key] = podOf(e)
		}
		if !filtered {
			continue
		}
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

// endpoint names a flow's endpoint by its pod, else by its attachment key
// (a pod the daemon knows no name of, or one gone since).
func (f *flowFilter) endpoint(ctx context.Context, key string) string {
	if name, ok := f.names[key]; ok {
		return name
	}
	if f.names != nil && time.Since(f.resolved) > time.Second {
		_ = f.refresh(ctx) // a pod created after we started
		if name, ok := f.names[key]; ok {
			return name
		}
	}
	return key
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
	if flowOpts.verdict == "allowed" && !flowOpts.follow {
		return fmt.Errorf("%w: --verdict allowed needs --follow: the daemon remembers dropped flows only (every allowed connection would cost an event)", errUsage)
	}
	since, err := parseSince(flowOpts.since)
	if err != nil {
		return err
	}
	f := &flowFilter{c: c}
	if err := f.refresh(ctx); err != nil {
		return err
	}
	p := newFlowPrinter(c, f)
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
				if err := p.print(ctx, ev); err != nil {
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
			if err := p.print(ctx, ev); err != nil {
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

// flowColumns are the table's columns and their widths: fixed, so rows
// printed one at a time while following line up with the header. A longer
// cell (a long pod name, an IPv6 address) pushes its row right until the
// slack of the next columns takes the excess up again.
var flowColumns = []struct {
	name  string
	width int
}{
	{"TIME", 24}, {"ENDPOINT", 40}, {"DIR", 7}, {"VERDICT", 7}, {"REASON", 16}, {"PROTO", 6},
	{"SOURCE", 21}, {"DESTINATION", 21}, {"IDENTITIES", 0},
}

// flowTime is how the table shows a flow's time: RFC 3339 in UTC with
// milliseconds, so it can be pasted into --since.
const flowTime = "2006-01-02T15:04:05.000Z07:00"

// flowPrinter writes one line per flow: a table row, or a JSON/YAML document.
type flowPrinter struct {
	c      *client
	f      *flowFilter
	w      *bufio.Writer
	header bool
}

func newFlowPrinter(c *client, f *flowFilter) *flowPrinter {
	return &flowPrinter{c: c, f: f, w: bufio.NewWriter(c.out)}
}

func (p *flowPrinter) print(ctx context.Context, ev *flowv1.FlowEvent) error {
	switch p.c.output {
	case "json":
		b, err := marshal(ev, "json", false)
		if err != nil {
			return err
		}
		_, err = p.w.Write(b)
		return err
	case "yaml":
		b, err := marshal(ev, "yaml", false)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(p.w, "---\n%s", b)
		return err
	}
	if !p.header {
		names := make([]string, len(flowColumns))
		for i, col := range flowColumns {
			names[i] = col.name
		}
		p.row(names...)
		p.header = true
	}
	from, to := localFirst(ev)
	p.row(time.Unix(0, ev.TimeUnixNano).UTC().Format(flowTime), p.f.endpoint(ctx, ev.Endpoint), ev.Direction, ev.Verdict, ev.Reason, ev.Protocol,
		hostPort(ev.Src, ev.SrcPort), hostPort(ev.Dst, ev.DstPort), fmt.Sprintf("%d->%d", from, to))
	return nil
}

// row starts each cell at its column, or two spaces after the previous
// cell when that one ran long.
func (p *flowPrinter) row(cells ...string) {
	var b strings.Builder
	col := 0 // where the current column starts
	for i, cell := range cells {
		if cell == "" {
			cell = "-"
		}
		if i > 0 {
			b.WriteString(strings.Repeat(" ", max(col-b.Len(), 2)))
		}
		b.WriteString(cell)
		col += flowColumns[i].width + 2
	}
	b.WriteByte('\n')
	_, _ = p.w.WriteString(b.String()) // a closed stdout ends the follow on the next read
}

func (p *flowPrinter) flush() { _ = p.w.Flush() }

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
