package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"path/filepath"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/coordino/coordino/conflist"
)

// CNI drives plugins through libcni from inside a node's netns, with its own
// result cache, exactly as a container runtime on that node would.
type CNI struct {
	Node     *Node
	Config   *libcni.CNIConfig
	List     *libcni.NetworkConfigList
	CacheDir string
}

// NewCNI parses conflist JSON for node, searching binDirs for plugins
// (default: Coordino's and the reference plugins').
func (n *Node) NewCNI(conflist []byte, binDirs ...string) (*CNI, error) {
	list, err := libcni.NetworkConfFromBytes(conflist)
	if err != nil {
		return nil, fmt.Errorf("parse conflist: %w", err)
	}
	if len(binDirs) == 0 {
		binDirs = []string{BinDir(), RefBinDir()}
	}
	cache := filepath.Join(n.Dir, "cni-cache-"+RandomSuffix(6))
	return &CNI{Node: n, Config: libcni.NewCNIConfigWithCacheDir(binDirs, cache, nil), List: list, CacheDir: cache}, nil
}

// PrimaryConflist is the conflist the installer writes for primary mode,
// pointed at this node's daemon.
func (n *Node) PrimaryConflist(name, cniVersion string) []byte {
	b, err := conflist.Build(conflist.Options{Name: name, CNIVersion: cniVersion, Knobs: conflist.Knobs{RunDir: n.RunDir}})
	if err != nil {
		panic(fmt.Sprintf("harness: build conflist: %v", err)) // only reachable with a bad harness run dir
	}
	return b
}

// RuntimeConf is the per-attachment part of a CNI call for pod.
func RuntimeConf(pod *Pod, ifname string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{
		ContainerID: pod.ContainerID,
		NetNS:       pod.NS.Path(),
		IfName:      ifname,
		Args:        [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "default"}, {"K8S_POD_NAME", pod.Name}},
	}
}

func (c *CNI) in(f func() error) error {
	return c.Node.NS.Do(func(ns.NetNS) error { return f() })
}

// Add runs ADD for the whole list.
func (c *CNI) Add(ctx context.Context, rt *libcni.RuntimeConf) (types.Result, error) {
	var res types.Result
	err := c.in(func() (err error) { res, err = c.Config.AddNetworkList(ctx, c.List, rt); return })
	return res, err
}

// Del runs DEL for the whole list.
func (c *CNI) Del(ctx context.Context, rt *libcni.RuntimeConf) error {
	return c.in(func() error { return c.Config.DelNetworkList(ctx, c.List, rt) })
}

// Check runs CHECK for the whole list.
func (c *CNI) Check(ctx context.Context, rt *libcni.RuntimeConf) error {
	return c.in(func() error { return c.Config.CheckNetworkList(ctx, c.List, rt) })
}

// GC runs GC with the given valid attachments.
func (c *CNI) GC(ctx context.Context, valid []types.GCAttachment) error {
	return c.in(func() error { return c.Config.GCNetworkList(ctx, c.List, &libcni.GCArgs{ValidAttachments: valid}) })
}

// Status runs STATUS.
func (c *CNI) Status(ctx context.Context) error {
	return c.in(func() error { return c.Config.GetStatusNetworkList(ctx, c.List) })
}

// Addresses extracts the IPs of a result, converted to the current version.
func Addresses(res types.Result) ([]netip.Addr, error) {
	cur, err := current.NewResultFromResult(res)
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, ip := range cur.IPs {
		a, ok := netip.AddrFromSlice(ip.Address.IP)
		if !ok {
			return nil, fmt.Errorf("bad address %v", ip.Address)
		}
		out = append(out, a.Unmap())
	}
	return out, nil
}

// ResultJSON renders a result for logs.
func ResultJSON(res types.Result) string {
	b, _ := json.Marshal(res)
	return string(b)
}
