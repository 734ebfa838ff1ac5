package harness

import (
	"os"
	"path/filepath"
)

// NewPolicyDir creates dir/policies holding one file, name, with the given
// NetworkPolicy YAML, for a daemon started with --policy-dir, and returns its path.
func NewPolicyDir(dir, name, yaml string) (string, error) {
	policyDir := filepath.Join(dir, "policies")
	if err := os.MkdirAll(policyDir, 0o700); err != nil {
		return "", err
	}
	return policyDir, os.WriteFile(filepath.Join(policyDir, name), []byte(yaml), 0o600)
}
