package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// The reference primary CNI's conflist: containernetworking's bridge with
// host-local addresses from the worker's /24, the same range Coordino's
// IPPool gives that worker.
const primaryConflist = "10-bridge.conflist"

// installPrimaryCNI writes the reference bridge + host-local conflist on
// every worker, with the plugins copied from RefPluginDir, and routes each
// worker's pod range to it from the other workers (what a CNI's routing
// would do; bridge does not). Nodes become Ready once containerd loads the
// config.
func (c *Cluster) installPrimaryCNI(ctx context.Context) error {
	if c.PrimaryCNI != "bridge" {
		return fmt.Errorf("primary CNI %q: only bridge is supported", c.PrimaryCNI)
	}
	for i, m := range c.workers {
		fs := c.nodeFS(m.name)
		for _, p := range []string{"bridge", "host-local"} {
			src := filepath.Join(c.RefPluginDir, p)
			if _, err := os.Stat(src); err != nil {
				return fmt.Errorf("reference plugin %s missing: make ref-plugins", src)
			}
			if err := copyFile(src, filepath.Join(fs("/opt/cni/bin"), p)); err != nil {
				return err
			}
		}
		conf := map[string]any{
			"cniVersion": "1.0.0",
			"name":       "bridge",
			"plugins": []map[string]any{{
				"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
				"ipam": map[string]any{
					"type":   "host-local",
					"ranges": [][]map[string]string{{{"subnet": workerPodCIDR(i + 1).String()}}},
					"routes": []map[string]string{{"dst": "0.0.0.0/0"}},
				},
			}},
		}
		b, err := json.MarshalIndent(conf, "", "  ")
		if err != nil {
			return err
		}
		if err := writeFileAtomic(filepath.Join(fs("/etc/cni/net.d"), primaryConflist), b); err != nil {
			return err
		}
		for j := range c.workers {
			if j != i {
				if err := addRoute(m.ns, workerPodCIDR(j+1), c.workerIP(j+1)); err != nil {
					return err
				}
			}
		}
	}
	return c.WaitNodesReady(ctx, 3*time.Minute)
}

// nodeFS maps a node path (one of nodePaths) to the per-node directory
// mounted over it, as seen from the host.
func (c *Cluster) nodeFS(node string) func(nodePath string) string {
	return func(p string) string { return filepath.Join(c.path("nodes", node), "fs", nodeDirName(p)) }
}

func writeFileAtomic(dst string, b []byte) error {
	tmp := filepath.Join(filepath.Dir(dst), "."+filepath.Base(dst)+".tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}
