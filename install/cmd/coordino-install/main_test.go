package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRunInstallUninstall(t *testing.T) {
	root := t.TempDir()
	bin, conf, src := filepath.Join(root, "bin"), filepath.Join(root, "net.d"), filepath.Join(root, "coordino")
	os.WriteFile(src, []byte("plugin"), 0o755)
	args := []string{"--cni-bin-dir", bin, "--cni-conf-dir", conf, "--plugin-source", src, "--mtu", "1450", "--log-level", "debug"}
	if err := run(args); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(conf, "10-coordino.conflist"))
	if err != nil || !strings.Contains(string(data), `"mtu": 1450`) || !strings.Contains(string(data), `"logLevel": "debug"`) {
		t.Fatalf("conflist %s %v", data, err)
	}
	if err := run(append(args, "--uninstall")); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(conf); len(entries) != 0 {
		t.Fatalf("conf dir not empty: %v", entries)
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
	} {
		if err := run(tc.args); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run(%q) = %v, want %q", tc.args, err, tc.want)
		}
	}
}
