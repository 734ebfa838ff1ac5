// Command gen writes ./base: the conformance suite's base manifests and
// policies from the network-policy-api module go.mod pins, with the SCTP
// servers left out of the test pods when the kernel has no SCTP (they
// cannot start there, and the suite waits for every pod).
package main

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/network-policy-api/conformance"
)

func main() {
	keepSCTP := len(os.Args) > 1 && os.Args[1] == "-sctp"
	err := fs.WalkDir(conformance.Manifests, "base", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := conformance.Manifests.ReadFile(path)
		if err != nil {
			return err
		}
		if path == "base/manifests.yaml" && !keepSCTP {
			if data, err = dropSCTP(data); err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		return os.WriteFile(path, data, 0o644)
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}

// dropSCTP removes the containers serving SCTP from the test pods. The
// file is a Go template (host-network ports), not YAML yet, so the cut is by
// lines: a container is a "- name:" item at the containers' indentation.
func dropSCTP(data []byte) ([]byte, error) {
	const item = "        - name: "
	lines := strings.SplitAfter(string(data), "\n")
	var out, block []string
	flush := func() {
		if !strings.Contains(strings.Join(block, ""), "SERVE_SCTP_PORT_") {
			out = append(out, block...)
		}
		block = nil
	}
	dropped := 0
	for _, l := range lines {
		trimmed := strings.TrimRight(l, "\n")
		switch {
		case strings.HasPrefix(trimmed, item):
			flush()
			block = []string{l}
		case block != nil && (strings.HasPrefix(trimmed, item[:len(item)-len("- name: ")]+"  ") || strings.TrimSpace(trimmed) == ""):
			block = append(block, l)
		default:
			flush()
			out = append(out, l)
		}
		if strings.Contains(l, "SERVE_SCTP_PORT_") {
			dropped++
		}
	}
	flush()
	if dropped == 0 {
		return nil, fmt.Errorf("no SCTP server found: the manifests changed, check this cut")
	}
	return []byte(strings.Join(out, "")), nil
}
