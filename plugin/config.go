package plugin

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/coordino/coordino/proto/cni/v1/wire"
)

// DefaultRunDir is where the daemon listens when the network config has no runDir.
const DefaultRunDir = "/run/coordino"

// RunDirRootsEnv names the environment variable through which the container
// runtime (never the network config) may trust further runDir roots: a
// colon-separated list of absolute directories. The network config is not
// trusted: with Multus, namespace users may write one.
const RunDirRootsEnv = "COORDINO_RUN_DIR_ROOTS"

// Config is the part of the network config the plugin itself reads. All other
// keys are the daemon's business and travel to it untouched.
type Config struct {
	CNIVersion string `json:"cniVersion"`
	Name       string `json:"name"`
	RunDir     string `json:"runDir"`
	// runDirRoot is the trusted root runDir lies in (DefaultRunDir or one of RunDirRootsEnv).
	runDirRoot string
}

// ParseConfig decodes stdin. A malformed document is a decoding failure (6);
// a well-formed one with a bad runDir is an invalid network config (7).
func ParseConfig(stdin []byte) (*Config, error) {
	var c Config
	if err := json.Unmarshal(stdin, &c); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, fmt.Sprintf("decode network config: %v", err), "")
	}
	if c.RunDir == "" {
		c.RunDir = DefaultRunDir
	}
	if !filepath.IsAbs(c.RunDir) {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("runDir %q must be an absolute path", c.RunDir), "")
	}
	c.RunDir = filepath.Clean(c.RunDir)
	roots := TrustedRunDirRoots()
	for _, r := range roots {
		if c.RunDir == r || strings.HasPrefix(c.RunDir, r+"/") || r == "/" {
			c.runDirRoot = r
			return &c, nil
		}
	}
	return nil, types.NewError(types.ErrInvalidNetworkConfig,
		fmt.Sprintf("runDir %q is outside the trusted roots %s (set by the runtime through %s)", c.RunDir, strings.Join(roots, ":"), RunDirRootsEnv), "")
}

// TrustedRunDirRoots are DefaultRunDir and the clean absolute paths listed in RunDirRootsEnv.
func TrustedRunDirRoots() []string {
	roots := []string{DefaultRunDir}
	for _, r := range strings.Split(os.Getenv(RunDirRootsEnv), ":") {
		if filepath.IsAbs(r) {
			roots = append(roots, filepath.Clean(r))
		}
	}
	return roots
}

// SocketPath is the daemon socket for this config.
func (c *Config) SocketPath() string { return filepath.Join(c.RunDir, wire.SocketName) }

// QueueDir is the delete-queue directory for this config.
func (c *Config) QueueDir() string { return filepath.Join(c.RunDir, wire.DeleteQueueDir) }
