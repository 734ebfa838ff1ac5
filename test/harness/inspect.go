package harness

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
)

// HostVeths lists the Coordino host-side veths ("cdo…") in the node netns.
func (n *Node) HostVeths() ([]string, error) {
	var out []string
	err := n.NS.Do(func(ns.NetNS) error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			if strings.HasPrefix(l.Attrs().Name, "cdo") {
				out = append(out, l.Attrs().Name)
			}
		}
		return nil
	})
	return out, err
}

// Pins lists the netns pins under the node's run dir.
func (n *Node) Pins() ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(n.RunDir, "netns"))
	if os.IsNotExist(err) {
		return nil, nil
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out, err
}

// Metric returns the sum of the samples of name whose labels contain every
// given `key="value"` pair, from the daemon's /metrics.
func (n *Node) Metric(name string, labels ...string) (float64, error) {
	code, body, err := n.HTTPGet("/metrics")
	if err != nil {
		return 0, err
	}
	if code != 200 {
		return 0, fmt.Errorf("/metrics answered %d", code)
	}
	return MetricIn(body, name, labels...)
}

// MetricIn sums the samples of metric name whose labels contain every one
// of labels in a Prometheus text exposition (any process's /metrics).
func MetricIn(body, name string, labels ...string) (float64, error) {
	sum, found := 0.0, false
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) || (len(line) > len(name) && line[len(name)] != '{' && line[len(name)] != ' ') {
			continue
		}
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(line, l)
		}
		if !ok {
			continue
		}
		fields := strings.Fields(line)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("metric line %q: %w", line, err)
		}
		sum, found = sum+v, true
	}
	if !found {
		return 0, fmt.Errorf("metric %s%v not found", name, labels)
	}
	return sum, nil
}

// Leaks describes Coordino state left on the node beyond want attachments:
// host veths, netns pins, used addresses and endpoint records.
func (n *Node) Leaks(want int) error {
	veths, err := n.HostVeths()
	if err != nil {
		return err
	}
	pins, err := n.Pins()
	if err != nil {
		return err
	}
	used, err := n.Metric("coordino_ipam_addresses", `state="used"`)
	if err != nil {
		return err
	}
	records, err := n.Metric("coordino_endpoints", `mode="primary"`)
	if err != nil {
		return err
	}
	if len(veths) != want || len(pins) != want || int(used) != want*n.families() || int(records) != want {
		return fmt.Errorf("want %d attachments; node has %d host veths %v, %d pins, %v used addresses, %v records",
			want, len(veths), veths, len(pins), used, records)
	}
	return nil
}

func (n *Node) families() int {
	v4, v6 := 0, 0
	for _, c := range n.PodCIDRs {
		if strings.Contains(c, ":") {
			v6 = 1
		} else {
			v4 = 1
		}
	}
	return v4 + v6
}

// BPFFilters counts the cls_bpf filters on a node interface's clsact hooks, ingress and egress.
func (n *Node) BPFFilters(ifname string) (ingress, egress int, err error) {
	err = n.NS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(ifname)
		if err != nil {
			return err
		}
		for _, dir := range []struct {
			parent uint32
			out    *int
		}{{netlink.HANDLE_MIN_INGRESS, &ingress}, {netlink.HANDLE_MIN_EGRESS, &egress}} {
			fs, err := netlink.FilterList(l, dir.parent)
			if err != nil {
				return fmt.Errorf("list filters on %s: %w", ifname, err)
			}
			for _, f := range fs {
				if _, ok := f.(*netlink.BpfFilter); ok {
					*dir.out++
				}
			}
		}
		return nil
	})
	return ingress, egress, err
}

// TCXPrograms counts the tcx programs attached to a node interface, ingress and egress.
func (n *Node) TCXPrograms(ifname string) (ingress, egress int, err error) {
	err = n.NS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(ifname)
		if err != nil {
			return err
		}
		for _, dir := range []struct {
			at  ebpf.AttachType
			out *int
		}{{ebpf.AttachTCXIngress, &ingress}, {ebpf.AttachTCXEgress, &egress}} {
			r, err := link.QueryPrograms(link.QueryOptions{Target: l.Attrs().Index, Attach: dir.at})
			if err != nil {
				return fmt.Errorf("query %v on %s: %w", dir.at, ifname, err)
			}
			*dir.out = len(r.Programs)
		}
		return nil
	})
	return ingress, egress, err
}
