package harness

import (
	"os"

	"github.com/coordino/coordino/plugin"
)

// Test nodes keep their run dirs under the temp dir, which the plugin trusts
// only when the runtime says so; plugin processes inherit this setting.
func init() {
	if os.Getenv(plugin.RunDirRootsEnv) == "" {
		_ = os.Setenv(plugin.RunDirRootsEnv, os.TempDir()) // fails only on a malformed name
	}
}
