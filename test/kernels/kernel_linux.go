package kernels

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// DefaultCacheDir keeps extracted kernels and their initramfs between runs.
const DefaultCacheDir = "/var/cache/coordino-kernels"

// Kernel is one guest kernel, ready to boot.
type Kernel struct {
	Name    string // the series: "6.1", "6.12"
	Release string // its uname -r, also the modules directory
	Root    string // the extracted package; Root/lib/modules/Release holds the modules
	VMLinux string // the ELF taken out of the bzImage
}

// series maps a series name to the Debian package names that carry it:
// the generic flavour only (no -cloud, -rt), signed images included.
var series = map[string]*regexp.Regexp{
	"6.1":  regexp.MustCompile(`^linux-image-(6\.1\.0-[0-9]+-amd64)$`),
	"6.12": regexp.MustCompile(`^linux-image-(6\.12\.[0-9]+\+deb[0-9]+-amd64)$`),
}

// Series lists the guest kernels the matrix knows, oldest first.
func Series() []string {
	names := make([]string, 0, len(series))
	for n := range series {
		names = append(names, n)
	}
	slices.SortFunc(names, compareVersions)
	return names
}

// compareVersions orders strings by their runs of digits, numerically.
func compareVersions(a, b string) int {
	num := regexp.MustCompile(`[0-9]+`)
	x, y := num.FindAllString(a, -1), num.FindAllString(b, -1)
	for i := 0; i < len(x) && i < len(y); i++ {
		p, _ := strconv.Atoi(x[i])
		q, _ := strconv.Atoi(y[i])
		if p != q {
			return p - q
		}
	}
	return len(x) - len(y)
}

// Prepare returns the newest kernel of the series that apt knows, fetching
// and unpacking it into cache unless an earlier run did. Without apt's
// lists (offline), the newest one already in cache is used.
func Prepare(cache, name string, logf func(string, ...any)) (*Kernel, error) {
	re, ok := series[name]
	if !ok {
		return nil, fmt.Errorf("kernel %q: unknown series (known: %s)", name, strings.Join(Series(), ", "))
	}
	release, pkg, err := newestPackage(re)
	if err != nil || release == "" {
		logf("%s: apt knows no package (%v); running apt-get update", name, err)
		if out, uerr := exec.Command("apt-get", "update", "-qq").CombinedOutput(); uerr != nil {
			logf("apt-get update: %v: %s", uerr, out)
		}
		release, pkg, err = newestPackage(re)
	}
	if release == "" {
		if cached := newestCached(cache, re); cached != "" {
			logf("%s: using cached %s (apt: %v)", name, cached, err)
			release = cached
		} else {
			return nil, fmt.Errorf("kernel %s: no package matches %s and none is cached: %v", name, re, err)
		}
	}
	k := cachedKernel(cache, name, release)
	if _, err := os.Stat(filepath.Join(cache, release, "ready")); err == nil {
		return k, nil
	}
	logf("%s: fetching %s", name, pkg)
	if err := fetch(cache, pkg, release); err != nil {
		// A newer upload that cannot be fetched (offline) does not stop a
		// run that has an older one.
		cached := newestCached(cache, re)
		if cached == "" {
			return nil, fmt.Errorf("kernel %s (%s): %w", name, pkg, err)
		}
		logf("%s: %v; using cached %s", name, err, cached)
		return cachedKernel(cache, name, cached), nil
	}
	return k, nil
}

// cachedKernel is where release of series name lives in cache.
func cachedKernel(cache, name, release string) *Kernel {
	dir := filepath.Join(cache, release)
	return &Kernel{Name: name, Release: release, Root: filepath.Join(dir, "root"), VMLinux: filepath.Join(dir, "vmlinux")}
}

// newestPackage asks apt's lists for the newest package matching re.
func newestPackage(re *regexp.Regexp) (release, pkg string, err error) {
	out, err := exec.Command("apt-cache", "search", "--names-only", "^linux-image-").Output()
	if err != nil {
		return "", "", fmt.Errorf("apt-cache search: %w", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(line, " ")
		if m := re.FindStringSubmatch(name); m != nil && (release == "" || compareVersions(m[1], release) > 0) {
			release, pkg = m[1], name
		}
	}
	return release, pkg, nil
}

// newestCached is the newest release in cache that matches re and is ready.
func newestCached(cache string, re *regexp.Regexp) string {
	entries, _ := os.ReadDir(cache)
	best := ""
	for _, e := range entries {
		if _, err := os.Stat(filepath.Join(cache, e.Name(), "ready")); err != nil {
			continue
		}
		if re.MatchString("linux-image-"+e.Name()) && (best == "" || compareVersions(e.Name(), best) > 0) {
			best = e.Name()
		}
	}
	return best
}

// fetch downloads pkg, unpacks it, writes modules.dep (packages ship none)
// and the ELF image, in a scratch directory renamed into place at the end,
// so an interrupted run leaves nothing that looks ready.
func fetch(cache, pkg, release string) error {
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(cache, ".fetch-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	// apt drops privileges to _apt for the download when it can write there.
	if err := os.Chmod(tmp, 0o777); err != nil {
		return err
	}
	if err := run(tmp, "apt-get", "download", "-qq", pkg); err != nil {
		return err
	}
	debs, _ := filepath.Glob(filepath.Join(tmp, "*.deb"))
	if len(debs) != 1 {
		return fmt.Errorf("apt-get download %s left %d .deb files", pkg, len(debs))
	}
	root := filepath.Join(tmp, "root")
	if err := run(tmp, "dpkg-deb", "-x", debs[0], root); err != nil {
		return err
	}
	if err := os.Remove(debs[0]); err != nil {
		return err
	}
	if err := run(tmp, "depmod", "-b", root, release); err != nil {
		return err
	}
	bz, err := os.ReadFile(filepath.Join(root, "boot", "vmlinuz-"+release))
	if err != nil {
		return err
	}
	elf, err := extractELF(bz)
	if err != nil {
		return fmt.Errorf("vmlinuz-%s: %w", release, err)
	}
	if err := os.WriteFile(filepath.Join(tmp, "vmlinux"), elf, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(tmp, "ready"), []byte(pkg+"\n"), 0o644); err != nil {
		return err
	}
	dst := filepath.Join(cache, release)
	os.RemoveAll(dst)
	return os.Rename(tmp, dst)
}

// extractELF takes the kernel's ELF out of a bzImage: the setup header
// (Documentation/arch/x86/boot.rst) gives the compressed payload's offset
// and length, and the payload ends with its uncompressed size (4 bytes).
func extractELF(bz []byte) ([]byte, error) {
	if len(bz) < 0x250 || string(bz[0x202:0x206]) != "HdrS" {
		return nil, fmt.Errorf("not a bzImage (no HdrS setup header)")
	}
	setupSects := int(bz[0x1f1])
	if setupSects == 0 {
		setupSects = 4
	}
	start := (setupSects + 1) * 512
	off := start + int(binary.LittleEndian.Uint32(bz[0x248:]))
	n := int(binary.LittleEndian.Uint32(bz[0x24c:]))
	if n < 8 || off+n > len(bz) {
		return nil, fmt.Errorf("payload [%d, +%d) outside the image (%d bytes)", off, n, len(bz))
	}
	payload := bz[off : off+n-4]
	var tool string
	switch {
	case bytes.HasPrefix(payload, []byte("\xfd7zXZ\x00")):
		tool = "xz"
	case bytes.HasPrefix(payload, []byte("\x28\xb5\x2f\xfd")):
		tool = "zstd"
	case bytes.HasPrefix(payload, []byte("\x1f\x8b")):
		tool = "gzip"
	default:
		return nil, fmt.Errorf("payload compression %x not known", payload[:4])
	}
	cmd := exec.Command(tool, "-dc")
	cmd.Stdin = bytes.NewReader(payload)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	elf, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s -dc of the payload: %v: %s", tool, err, stderr.Bytes())
	}
	if !bytes.HasPrefix(elf, []byte("\x7fELF")) {
		return nil, fmt.Errorf("decompressed payload is not an ELF")
	}
	return elf, nil
}

// run runs a command in dir, returning its output with the error.
func run(dir, name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}
