package cluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/coordino/coordino/test/testbed"
)

// Image references the nodes hold without any registry. The pause and
// agnhost names are the ones the upstream e2e suites ask for
// (k8s.io/kubernetes/test/utils/image at the cluster's version), so the
// suites find them in the nodes' image stores.
const (
	PauseImage   = "registry.k8s.io/pause:3.10.2"
	AgnhostImage = "registry.k8s.io/e2e-test-images/agnhost:2.66.1"
	CoreDNSImage = "coordino.test/coredns:" + CoreDNSVersion
)

// buildImages packs the pause, agnhost and CoreDNS images offline (the
// same packer as test/testbed), builds the loopback plugin, and returns the
// archives every node imports, Coordino's own image included.
func (c *Cluster) buildImages() ([]string, error) {
	if _, err := os.Stat(c.ImageArchive); err != nil {
		return nil, fmt.Errorf("Coordino image %s missing: make image", c.ImageArchive)
	}
	out := c.path("images")
	if err := testbed.BuildImagePrograms(c.RepoRoot, out, "pause"); err != nil {
		return nil, err
	}
	lo := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(out, "loopback"),
		"github.com/containernetworking/plugins/plugins/main/loopback")
	lo.Dir = c.RepoRoot
	lo.Env = append(os.Environ(), "CGO_ENABLED=0")
	if o, err := lo.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build loopback plugin: %w: %s", err, o)
	}
	imgs := []struct{ tar, tag, entry, file string }{
		{"pause.tar", PauseImage, "/pause", filepath.Join(out, "pause") + ":/pause"},
		{"agnhost.tar", AgnhostImage, "/agnhost", c.bins.agnhost + ":/agnhost"},
		{"coredns.tar", CoreDNSImage, "/coredns", c.bins.coredns + ":/coredns"},
	}
	archives := []string{c.ImageArchive}
	for _, im := range imgs {
		tar := filepath.Join(out, im.tar)
		if err := testbed.PackImage(out, tar, im.tag, im.entry, im.file); err != nil {
			return nil, err
		}
		archives = append(archives, tar)
	}
	return archives, nil
}
