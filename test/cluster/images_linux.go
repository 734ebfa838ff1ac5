package cluster

import (
	"crypto/sha256"
	"encoding/hex"
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
	// GlibcDNSImage is the DNS suites' glibc prober (sh, dig, getent):
	// the agnhost image under a second name, since its userland has them.
	GlibcDNSImage = "registry.k8s.io/e2e-test-images/glibc-dns-testing:2.1.1"
	// AgnhostCNPImage is the agnhost the ClusterNetworkPolicy conformance
	// suite (sigs.k8s.io/network-policy-api) names, served by the same
	// agnhost: the suite uses its long-stable netexec and connect commands.
	AgnhostCNPImage = "registry.k8s.io/e2e-test-images/agnhost:2.45"
)

// userlandRoot is the root filesystem test/testbed/build.sh userland
// unpacked for the agnhost image (shell, curl, nc, dig...), in the cache
// directory named by the hash of the pinned package list.
func userlandRoot(repoRoot, cache string) (string, error) {
	pins, err := os.ReadFile(filepath.Join(repoRoot, "test", "testbed", "userland", "packages.txt"))
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(pins)
	root := filepath.Join(cache, "userland-"+hex.EncodeToString(sum[:])[:12], "rootfs")
	if _, err := os.Stat(root); err != nil {
		return "", fmt.Errorf("agnhost userland missing (%w); build it with test/testbed/build.sh userland", err)
	}
	return root, nil
}

// buildImages packs the pause, agnhost and CoreDNS images offline (the
// same packer as test/testbed), builds the loopback plugin, and returns the
// archives every node imports, Coordino's own image included. agnhost gets
// the userland upstream's image has around it (its entrypoint and default
// command too), so the suites' `kubectl exec ... sh -c 'curl ...'` work.
func (c *Cluster) buildImages() ([]string, error) {
	if _, err := os.Stat(c.ImageArchive); err != nil {
		return nil, fmt.Errorf("Coordino image %s missing: make image", c.ImageArchive)
	}
	userland, err := userlandRoot(c.RepoRoot, c.Cache)
	if err != nil {
		return nil, err
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
		{"coredns.tar", CoreDNSImage, "/coredns", c.bins.coredns + ":/coredns"},
	}
	agnhost := filepath.Join(out, "agnhost.tar")
	if err := testbed.Mkimg(out, "-o", agnhost, "-tag", AgnhostImage, "-tag", GlibcDNSImage, "-tag", AgnhostCNPImage,
		"-entrypoint", "/agnhost", "-cmd", "pause", "-tree", userland, "-file", c.bins.agnhost+":/agnhost"); err != nil {
		return nil, err
	}
	archives := []string{c.ImageArchive, agnhost}
	for _, im := range imgs {
		tar := filepath.Join(out, im.tar)
		if err := testbed.PackImage(out, tar, im.tag, im.entry, im.file); err != nil {
			return nil, err
		}
		archives = append(archives, tar)
	}
	return archives, nil
}
