package testbed

import (
	"os"

	"github.com/coordino/coordino/plugin"
)

// The bed's daemons keep their run dirs under the temp dir, which the plugin
// trusts only when the runtime says so; containerd, and through it the
// plugin, inherit this setting.
func init() {
	if os.Getenv(plugin.RunDirRootsEnv) == "" {
		_ = os.Setenv(plugin.RunDirRootsEnv, os.TempDir())
	}
}
