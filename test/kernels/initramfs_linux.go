package kernels

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

//go:embed init.sh
var initScript []byte

// initModules are what init.sh needs before it can mount the host: the
// virtio PCI transport (built in from 6.12 on), 9p over virtio, overlayfs.
var initModules = []string{"virtio_pci", "9pnet_virtio", "9p", "overlay"}

// Busybox is the static busybox of Debian's busybox-static package.
const Busybox = "/bin/busybox"

// Initramfs writes (once per content) the kernel's initramfs into its cache
// directory: busybox, init.sh and the modules of initModules with their
// dependencies, uncompressed, listed in load order in /modules.
func (k *Kernel) Initramfs() (string, error) {
	var buf bytes.Buffer
	w := newCpio(&buf)
	for _, d := range []string{"bin", "dev", "proc", "sys", "lib", "lib/modules"} {
		w.dir(d)
	}
	bb, err := os.ReadFile(Busybox)
	if err != nil {
		return "", fmt.Errorf("%w (install busybox-static)", err)
	}
	w.file("bin/busybox", bb, 0o755)
	for _, applet := range []string{"sh", "mount", "mkdir", "insmod", "cat", "echo", "switch_root", "poweroff", "hostname"} {
		w.symlink("bin/"+applet, "busybox")
	}
	w.file("init", initScript, 0o755)
	mods, err := k.moduleOrder(initModules)
	if err != nil {
		return "", err
	}
	var list []string
	for _, m := range mods {
		ko, err := readModule(filepath.Join(k.modulesDir(), m))
		if err != nil {
			return "", err
		}
		name := moduleName(m) + ".ko"
		w.file("lib/modules/"+name, ko, 0o644)
		list = append(list, name)
	}
	w.file("modules", []byte(strings.Join(list, "\n")+"\n"), 0o644)
	if err := w.close(); err != nil {
		return "", err
	}
	sum := sha256.Sum256(buf.Bytes())
	path := filepath.Join(filepath.Dir(k.VMLinux), "initramfs-"+hex.EncodeToString(sum[:6])+".cpio")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	return path, writeAtomic(path, buf.Bytes())
}

func (k *Kernel) modulesDir() string { return filepath.Join(k.Root, "lib", "modules", k.Release) }

// moduleName is a module file's name as insmod and lsmod know it.
func moduleName(path string) string {
	base := filepath.Base(path)
	base, _, _ = strings.Cut(base, ".ko")
	return strings.ReplaceAll(base, "-", "_")
}

// moduleOrder resolves names through modules.dep into paths, every module
// after the ones it depends on. Names built into the kernel are left out.
func (k *Kernel) moduleOrder(names []string) ([]string, error) {
	deps := map[string][]string{} // module name -> its line: path, then dependency paths
	f, err := os.Open(filepath.Join(k.modulesDir(), "modules.dep"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		path, rest, ok := strings.Cut(sc.Text(), ":")
		if ok {
			deps[moduleName(path)] = append([]string{path}, strings.Fields(rest)...)
		}
	}
	builtin, _ := os.ReadFile(filepath.Join(k.modulesDir(), "modules.builtin"))
	var order []string
	seen := map[string]bool{}
	var visit func(name string) error
	visit = func(name string) error {
		if seen[name] {
			return nil
		}
		seen[name] = true
		line, ok := deps[name]
		if !ok {
			for _, b := range strings.Fields(string(builtin)) {
				if moduleName(b) == name {
					return nil
				}
			}
			return fmt.Errorf("kernel %s: module %s neither in modules.dep nor built in", k.Release, name)
		}
		for _, d := range line[1:] {
			if err := visit(moduleName(d)); err != nil {
				return err
			}
		}
		order = append(order, line[0])
		return nil
	}
	for _, n := range names {
		if err := visit(n); err != nil {
			return nil, err
		}
	}
	return order, sc.Err()
}

// readModule returns a module file's contents, decompressed: busybox's
// insmod loads plain .ko files only.
func readModule(path string) ([]byte, error) {
	if !strings.HasSuffix(path, ".xz") && !strings.HasSuffix(path, ".zst") {
		return os.ReadFile(path)
	}
	tool := "xz"
	if strings.HasSuffix(path, ".zst") {
		tool = "zstd"
	}
	out, err := exec.Command(tool, "-dc", path).Output()
	if err != nil {
		return nil, fmt.Errorf("%s -dc %s: %w", tool, path, err)
	}
	return out, nil
}

// writeAtomic writes data to path through a temporary file and a rename.
func writeAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// cpioWriter writes the "newc" cpio format the kernel unpacks as initramfs.
type cpioWriter struct {
	buf   *bytes.Buffer
	inode int
}

func newCpio(buf *bytes.Buffer) *cpioWriter { return &cpioWriter{buf: buf, inode: 1} }

func (w *cpioWriter) entry(name string, mode uint32, data []byte) {
	w.inode++
	fmt.Fprintf(w.buf, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		w.inode, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name)+1, 0)
	w.buf.WriteString(name + "\x00")
	w.pad()
	w.buf.Write(data)
	w.pad()
}

func (w *cpioWriter) pad() {
	for w.buf.Len()%4 != 0 {
		w.buf.WriteByte(0)
	}
}

func (w *cpioWriter) dir(name string)                            { w.entry(name, 0o040755, nil) }
func (w *cpioWriter) file(name string, data []byte, perm uint32) { w.entry(name, 0o100000|perm, data) }
func (w *cpioWriter) symlink(name, target string)                { w.entry(name, 0o120777, []byte(target)) }
func (w *cpioWriter) close() error {
	w.entry("TRAILER!!!", 0, nil)
	return nil
}
