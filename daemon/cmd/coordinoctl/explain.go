package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	inspectv1 "github.com/coordino/coordino/proto/inspect/v1"
)

var explainOpts struct{ from, to, port string }

func explainFlags(fs *flag.FlagSet) {
	fs.StringVar(&explainOpts.from, "from", "", "source: a pod (namespace/name, name or container ID), an address or a CIDR")
	fs.StringVar(&explainOpts.to, "to", "", "destination: a pod, an address or a CIDR")
	fs.StringVar(&explainOpts.port, "port", "", "destination port and protocol, e.g. 80/TCP, 53/udp, 0/ICMP (protocol defaults to TCP)")
}

// parsePort reads "P/proto" or "P".
func parsePort(s string) (uint32, string, error) {
	p, proto, _ := strings.Cut(s, "/")
	if proto == "" {
		proto = "TCP"
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil {
		return 0, "", fmt.Errorf("%w: --port %q: want PORT/PROTOCOL, e.g. 80/TCP", errUsage, s)
	}
	return uint32(n), strings.ToUpper(proto), nil
}

func runExplain(ctx context.Context, c *client, _ []string) error {
	if explainOpts.from == "" || explainOpts.to == "" || explainOpts.port == "" {
		return fmt.Errorf("%w: --from, --to and --port are required", errUsage)
	}
	port, proto, err := parsePort(explainOpts.port)
	if err != nil {
		return err
	}
	ctx, cancel := c.rpcContext(ctx)
	defer cancel()
	ex, err := c.inspect.ExplainPolicy(ctx, &inspectv1.ExplainPolicyRequest{From: explainOpts.from, To: explainOpts.to, Protocol: proto, Port: port})
	if err != nil {
		return err
	}
	return c.print(ex, func(w io.Writer) {
		row(w, "Flow:", fmt.Sprintf("%s -> %s %d/%s", ex.Src, ex.Dst, port, proto))
		for _, st := range ex.Steps {
			fmt.Fprintln(w)
			row(w, strings.ToUpper(st.Direction[:1])+st.Direction[1:]+":", fmt.Sprintf("%s (%s)", strings.ToUpper(st.Verdict), orDash(st.Reason)))
			if st.Endpoint != "" {
				row(w, "  at:", fmt.Sprintf("%s (identity %d)", st.Endpoint, st.LocalIdentity))
				row(w, "  peer:", st.RemoteDescription)
			}
			if len(st.SelectedBy) > 0 {
				row(w, "  selected by:", strings.Join(st.SelectedBy, ", "))
			}
			if st.DecidedBy != "" {
				row(w, "  decided by:", st.DecidedBy)
			}
			if len(st.AllowedBy) > 0 {
				row(w, "  allowed by:", strings.Join(st.AllowedBy, ", "))
			}
			row(w, "  why:", st.Detail)
		}
		fmt.Fprintln(w)
		row(w, "Verdict:", strings.ToUpper(ex.Verdict))
	})
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
