package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PodNetns opens the network namespace of the pod with address ip on node:
// the namespace pins its containerd made under the node's /run/netns, seen
// through the node's holder. The caller closes the handle; sockets opened
// in it (InNetns) carry test traffic as the pod's own.
func (c *Cluster) PodNetns(node string, ip netip.Addr) (netns.NsHandle, error) {
	m := c.worker(node)
	if m == nil {
		return -1, fmt.Errorf("no worker %q", node)
	}
	dir := fmt.Sprintf("/proc/%d/root/run/netns", m.holderPid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return -1, fmt.Errorf("pod namespaces of %s: %w", node, err)
	}
	for _, e := range ents {
		h, err := netns.GetFromPath(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // a sandbox going away
		}
		found := false
		_ = inNetns(h, func() error {
			addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
			for _, a := range addrs {
				if ad, ok := netip.AddrFromSlice(a.IP); ok && ad.Unmap() == ip {
					found = true
				}
			}
			return err
		})
		if found {
			return h, nil
		}
		h.Close()
	}
	return -1, fmt.Errorf("no network namespace on %s holds %s (%d looked at)", node, ip, len(ents))
}

// InNetns runs fn on a thread in ns (a PodNetns): sockets fn opens stay
// in ns after it returns.
func InNetns(ns netns.NsHandle, fn func() error) error { return inNetns(ns, fn) }

func (c *Cluster) worker(node string) *machine {
	for _, w := range c.workers {
		if w.name == node {
			return w
		}
	}
	return nil
}

// NodePodAddrs are the addresses of node's pods that have pod networking
// and have not ended, the set a node's endpoints must equal.
func (c *Cluster) NodePodAddrs(ctx context.Context, node string) (map[string]string, error) {
	pods, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, p := range pods.Items {
		if p.Spec.HostNetwork || p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		for _, ip := range p.Status.PodIPs {
			out[ip.IP] = p.Namespace + "/" + p.Name
		}
	}
	return out, nil
}

// CountLines counts the footprint's lines that start with prefix and end
// with suffix.
func (f Footprint) CountLines(prefix, suffix string) int {
	n := 0
	for _, l := range f {
		if strings.HasPrefix(l, prefix) && strings.HasSuffix(l, suffix) {
			n++
		}
	}
	return n
}

// Line is the footprint's first line starting with prefix ("" if none).
func (f Footprint) Line(prefix string) string {
	for _, l := range f {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}
