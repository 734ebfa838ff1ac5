package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRunInstallUninstall(t *testing.T) {
	root := t.TempDir()
	bin, conf, src, pm := filepath.Join(root, "bin"), filepath.Join(root, "net.d"), filepath.Join(root, "coordino"), filepath.Join(root, "portmap")
	os.WriteFile(src, []byte("plugin"), 0o755)
	os.WriteFile(pm, []byte("portmap"), 0o755)
	args := []string{"--cni-bin-dir", bin, "--cni-conf-dir", conf, "--plugin-source", src, "--portmap-source", pm, "--mtu", "1450", "--log-level", "debug"}
	if err := run(args); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(conf, "10-coordino.conflist"))
	if err != nil || !strings.Contains(string(data), `"mtu": 1450`) || !strings.Contains(string(data), `"logLevel": "debug"`) {
		t.Fatalf("conflist %s %v", data, err)
	}
	if !strings.Contains(string(data), `"type": "portmap"`) {
		t.Errorf("conflist does not chain portmap by default:\n%s", data)
	}
	if got, err := os.ReadFile(filepath.Join(bin, "portmap")); err != nil || string(got) != "portmap" {
		t.Errorf("bin dir portmap %q %v, want --portmap-source's", got, err)
	}
	if err := run(append(args, "--uninstall")); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(conf); len(entries) != 0 {
		t.Fatalf("conf dir not empty: %v", entries)
	}
	if entries, _ := os.ReadDir(bin); len(entries) != 0 {
		t.Fatalf("bin dir not empty: %v", entries)
	}
}

// TestRunPortMapOff: --portmap=false writes a conflist of Coordino alone and
// copies no portmap.
func TestRunPortMapOff(t *testing.T) {
	root := t.TempDir()
	bin, conf := filepath.Join(root, "bin"), filepath.Join(root, "net.d")
	if err := run([]string{"--cni-bin-dir", bin, "--cni-conf-dir", conf, "--plugin-source", "", "--portmap=false"}); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(conf, "10-coordino.conflist"))
	if err != nil || strings.Contains(string(data), "portmap") {
		t.Fatalf("conflist %s %v, want no portmap", data, err)
	}
	if entries, _ := os.ReadDir(bin); len(entries) != 0 {
		t.Fatalf("bin dir holds %v, want nothing", entries)
	}
}

func TestRunRejectsBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--watch", "--uninstall"}, "exclude each other"},
		{[]string{"--remove-node-state"}, "needs --uninstall"},
		{[]string{"extra"}, "unexpected arguments"},
		{[]string{"--mode", "sidecar"}, `mode: "sidecar"`},
		{[]string{"--log-level", "trace"}, `logLevel: "trace"`},
		{[]string{"--priority", "x"}, `priority: "x"`},
		{[]string{"--no-such-flag"}, "not defined"},
		{[]string{"--portmap-backend", "ipvs"}, `portmap backend: "ipvs"`},
		{[]string{"--portmap=false", "--portmap-backend", "nftables"}, "portmap backend: set without portmap"},
	} {
		if err := run(tc.args); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run(%q) = %v, want %q", tc.args, err, tc.want)
		}
	}
}
