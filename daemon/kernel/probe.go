package kernel

import (
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"

	"github.com/coordino/coordino/bpf"
)

// Probe asks the running kernel for every feature of the table. It loads
// a few tiny programs and attaches none; it never fails: a probe that
// cannot answer reports the feature missing, with its reason.
func Probe() *Features {
	// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK.
	_ = rlimit.RemoveMemlock()
	m := modules{root: modulesRoot()}
	probes, probesErr := bpf.LoadCoordinoProbe()
	kfuncs := probeKfuncs(probes, probesErr, m)
	return &Features{list: []Feature{
		probeAttach(TCX, func(p *ebpf.Program) error {
			_, err := link.AttachTCX(link.TCXOptions{Interface: absentIfindex, Program: p, Attach: ebpf.AttachTCXIngress})
			return err
		}),
		fromErr(NetfilterLink, features.HaveProgramType(ebpf.Netfilter), "program type and links (6.4+)"),
		kfuncs[DynptrFromSkb],
		kfuncs[CTLookup],
		probeMapSum(),
		fromErr(RedirectPeer, features.HaveProgramHelper(ebpf.SchedCLS, asm.FnRedirectPeer), "tc programs (5.10+)"),
		fromErr(RedirectNeigh, features.HaveProgramHelper(ebpf.SchedCLS, asm.FnRedirectNeigh), "tc programs (5.10+)"),
		probeDecapFlags(probes, probesErr),
		m.all(XTBPFMatch, "nf_tables", "nft_compat", "xt_bpf"),
		probeAttach(Netkit, func(p *ebpf.Program) error {
			_, err := link.AttachNetkit(link.NetkitOptions{Interface: absentIfindex, Program: p, Attach: ebpf.AttachNetkitPrimary})
			return err
		}),
		m.all(WireGuard, "wireguard"),
		m.all(VXLAN, "vxlan"),
		m.all(SCTP, "sctp"),
	}}
}

// absentIfindex is an interface no kernel has: an attach to it fails with
// ENODEV where the attach type exists, and as not supported where not.
const absentIfindex = math.MaxInt32

// probeAttach answers whether a link type exists by attaching a trivial tc
// program to an absent interface.
func probeAttach(n Name, attach func(*ebpf.Program) error) Feature {
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
	})
	if err != nil {
		return row(n, false, fmt.Sprintf("cannot load a tc program: %v", err))
	}
	defer p.Close()
	err = attach(p)
	switch {
	case errors.Is(err, ebpf.ErrNotSupported):
		return row(n, false, "link type unknown to the kernel")
	case err == nil, errors.Is(err, unix.ENODEV), errors.Is(err, unix.EINVAL):
		return row(n, true, "link type supported")
	default:
		return row(n, false, err.Error())
	}
}

// fromErr turns a cilium/ebpf feature test's answer into a row.
func fromErr(n Name, err error, what string) Feature {
	if err != nil {
		if errors.Is(err, ebpf.ErrNotSupported) {
			return row(n, false, "not supported: "+what)
		}
		return row(n, false, err.Error())
	}
	return row(n, true, what)
}

// probeKfuncs loads bpf/coordino_probe.c's programs, one per kfunc.
func probeKfuncs(spec *ebpf.CollectionSpec, err error, m modules) map[Name]Feature {
	progs := map[Name]string{DynptrFromSkb: "probe_dynptr_from_skb", CTLookup: "probe_ct_lookup"}
	out := map[Name]Feature{}
	if err != nil {
		for n := range progs {
			out[n] = row(n, false, fmt.Sprintf("probe object: %v", err))
		}
		return out
	}
	for n, prog := range progs {
		p, err := ebpf.NewProgram(spec.Programs[prog])
		if err != nil {
			out[n] = row(n, false, kfuncMissing(n, err, m))
			continue
		}
		p.Close()
		out[n] = row(n, true, kfuncHome(n))
	}
	return out
}

// kfuncMissing says why a kfunc probe did not load, shortly: a verifier
// log is no table cell.
func kfuncMissing(n Name, err error, m modules) string {
	if n == CTLookup {
		if st := m.state("nf_conntrack"); st != "" && !strings.HasPrefix(st, "loaded") && st != "built in" {
			return "nf_conntrack is " + st
		}
	}
	var verr *ebpf.VerifierError
	if errors.As(err, &verr) || errors.Is(err, ebpf.ErrNotSupported) {
		return "not offered to tc programs by this kernel"
	}
	return err.Error()
}

// kfuncHome says whether the kernel itself or a module provides n.
func kfuncHome(n Name) string {
	name := strings.TrimPrefix(string(n), "kfunc ")
	if spec, err := btf.LoadKernelSpec(); err == nil {
		if _, err := spec.AnyTypeByName(name); err == nil {
			return "built into the kernel"
		}
	}
	if n == CTLookup {
		return "in module nf_conntrack (loaded)"
	}
	return "in a module"
}

// probeDecapFlags runs bpf/coordino_probe.c's probe_decap_flags on a test
// frame: IPv4 in Ethernet, long enough to lose 8 bytes after the MAC
// header.
func probeDecapFlags(spec *ebpf.CollectionSpec, err error) Feature {
	if err != nil {
		return row(DecapFlags, false, fmt.Sprintf("probe object: %v", err))
	}
	p, err := ebpf.NewProgram(spec.Programs["probe_decap_flags"])
	if err != nil {
		return row(DecapFlags, false, fmt.Sprintf("probe program: %v", err))
	}
	defer p.Close()
	frame := make([]byte, 14+20+8+20)
	frame[12], frame[13] = 0x08, 0x00 // IPv4
	frame[14] = 0x45
	frame[14+3] = byte(len(frame) - 14)
	frame[14+8], frame[14+9] = 64, 17 // TTL, UDP
	ret, err := p.Run(&ebpf.RunOptions{Data: frame})
	switch {
	case err != nil:
		return row(DecapFlags, false, fmt.Sprintf("test run: %v", err))
	case ret != 1:
		return row(DecapFlags, false, "refused (6.3+)")
	}
	return row(DecapFlags, true, "tc programs (6.3+)")
}

// probeMapSum loads the map-count iterator (bpf/coordino_count.c), the
// kfunc's only user.
func probeMapSum() Feature {
	var objs bpf.CoordinoCountObjects
	if err := bpf.LoadCoordinoCountObjects(&objs, nil); err != nil {
		return row(MapSumElemCount, false, "not offered to iterator programs (6.6+)")
	}
	objs.Close()
	return row(MapSumElemCount, true, "iterator programs (6.6+)")
}

// modules reads what modules the running kernel has, from /sys/module,
// /lib/modules/<release> and the kernel's build configuration.
type modules struct{ root string }

// configSymbols are the build options of the modules probed.
var configSymbols = map[string]string{
	"nf_tables": "CONFIG_NF_TABLES", "nft_compat": "CONFIG_NFT_COMPAT", "xt_bpf": "CONFIG_NETFILTER_XT_MATCH_BPF",
	"nf_conntrack": "CONFIG_NF_CONNTRACK", "wireguard": "CONFIG_WIREGUARD", "vxlan": "CONFIG_VXLAN", "sctp": "CONFIG_IP_SCTP",
}

// configValue is sym's value in the running kernel's configuration
// (/proc/config.gz, else /boot/config-<release>): "y", "m", "n", or "" when
// neither can be read.
func (m modules) configValue(sym string) string {
	var r io.Reader
	if f, err := os.Open("/proc/config.gz"); err == nil {
		defer f.Close()
		if z, err := gzip.NewReader(f); err == nil {
			r = z
		}
	}
	if r == nil {
		f, err := os.Open(filepath.Join("/boot", "config-"+filepath.Base(m.root)))
		if err != nil {
			return ""
		}
		defer f.Close()
		r = f
	}
	s := bufio.NewScanner(r)
	for s.Scan() {
		line := s.Text()
		if v, ok := strings.CutPrefix(line, sym+"="); ok {
			return v
		}
		if line == "# "+sym+" is not set" {
			return "n"
		}
	}
	return "n"
}

func modulesRoot() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return filepath.Join("/lib/modules", unix.ByteSliceToString(u.Release[:]))
}

// state is "loaded", "built in", "module, not loaded (loaded on first
// use)", "absent", or "" when nothing can tell.
func (m modules) state(name string) string {
	cfg := m.configValue(configSymbols[name])
	if cfg == "y" || m.listed("modules.builtin", name) {
		return "built in"
	}
	if _, err := os.Stat(filepath.Join("/sys/module", name)); err == nil {
		return "loaded"
	}
	if cfg == "m" || m.listed("modules.dep", name) {
		return "module, not loaded (loaded on first use)"
	}
	if cfg == "n" {
		return "absent"
	}
	if _, err := os.Stat(filepath.Join(m.root, "modules.dep")); err != nil {
		return ""
	}
	return "absent"
}

// listed reports whether the module index file lists name's object.
func (m modules) listed(index, name string) bool {
	f, err := os.Open(filepath.Join(m.root, index))
	if err != nil {
		return false
	}
	defer f.Close()
	want := []string{"/" + name + ".ko", "/" + strings.ReplaceAll(name, "_", "-") + ".ko"}
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for s.Scan() {
		obj, _, _ := strings.Cut(s.Text(), ":")
		for _, w := range want {
			if i := strings.Index(obj, w); i >= 0 && (len(obj) == i+len(w) || obj[i+len(w)] == '.') {
				return true
			}
		}
	}
	return false
}

// all reports n available when every module named is built in, loaded or
// loadable.
func (m modules) all(n Name, names ...string) Feature {
	var parts []string
	ok := true
	for _, name := range names {
		st := m.state(name)
		switch st {
		case "":
			st = "unknown (no " + filepath.Join(m.root, "modules.dep") + ")"
			if _, err := os.Stat(filepath.Join("/sys/module", name)); err != nil {
				ok = false
			}
		case "absent":
			ok = false
		}
		parts = append(parts, name+" "+st)
	}
	return row(n, ok, strings.Join(parts, ", "))
}
