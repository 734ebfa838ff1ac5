package testbed

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
)

// Network names of the bed's conflists. They are unique to the bed so that
// cleaning libcni's shared cache (/var/lib/cni) cannot hit anyone else's.
const (
	NetPrimary = "coordino-testbed"
	NetChained = "coordino-testbed-chained"
	NetBridge  = "testbed-bridge"
)

// Address plans. Checked against the host's routes by CheckCIDRsFree.
const (
	CoordinoCIDR4 = "10.213.0.0/24"
	CoordinoCIDR6 = "fd42:c0d1:213::/64"
	BridgeCIDR4   = "10.214.0.0/24"
	ChainedCIDR4  = "10.215.0.0/24"
)

// InstallPlugins copies CNI plugin binaries into the bed's own bin dir
// (never /opt/cni/bin): every file of the given dirs whose name is listed, and
// builds "loopback", which containerd runs for every sandbox, from the
// reference plugins module pinned in the project's go.mod.
func (b *Bed) InstallPlugins(srcDirs []string, names ...string) error {
	for _, n := range names {
		found := false
		for _, d := range srcDirs {
			src := filepath.Join(d, n)
			if _, err := os.Stat(src); err != nil {
				continue
			}
			if err := copyExec(src, filepath.Join(b.CNIBinDir, n)); err != nil {
				return err
			}
			found = true
			break
		}
		if !found {
			return fmt.Errorf("CNI plugin %q not found in %v (make build ref-plugins)", n, srcDirs)
		}
	}
	lo := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(b.CNIBinDir, "loopback"),
		"github.com/containernetworking/plugins/plugins/main/loopback")
	lo.Dir = b.RepoRoot
	lo.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := lo.CombinedOutput(); err != nil {
		return fmt.Errorf("build loopback plugin: %w: %s", err, out)
	}
	return nil
}

// copyExec copies via a temp file and rename: containerd may exec the
// destination at any time and must never see a partial binary.
func copyExec(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp := dst + ".tmp"
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// BridgePlugins returns bridge + host-local plugin configs on the bed's
// bridge device, with IPAM state under the bed.
func (b *Bed) BridgePlugins(cidr, ipamDir string) []map[string]any {
	return []map[string]any{{
		"type":        "bridge",
		"bridge":      bedBridge,
		"isGateway":   true,
		"ipMasq":      false,
		"hairpinMode": true,
		"ipam": map[string]any{
			"type":    "host-local",
			"ranges":  [][]map[string]string{{{"subnet": cidr}}},
			"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
			"dataDir": b.path("cni", ipamDir),
		},
	}}
}

// CoordinoPlugin is the Coordino plugin entry pointing at a daemon's run dir.
func CoordinoPlugin(runDir string) map[string]any {
	return map[string]any{"type": "coordino", "runDir": runDir}
}

// WriteConflist writes a conflist into a handler's conf dir, replacing any
// previous one (containerd reloads the dir on change).
func (b *Bed) WriteConflist(handler, name string, plugins []map[string]any) error {
	dir, ok := b.ConfDirs[handler]
	if !ok {
		return fmt.Errorf("unknown runtime handler %q", handler)
	}
	conf := map[string]any{"cniVersion": "1.1.0", "name": name, "plugins": plugins}
	data, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return err
	}
	olds, _ := filepath.Glob(filepath.Join(dir, "*.conflist"))
	for _, o := range olds {
		_ = os.Remove(o)
	}
	tmp := filepath.Join(dir, ".tmp")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, "10-"+name+".conflist"))
}
