package testbed

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NetnsLeft is a network namespace file left in containerd's netns
// directory after every sandbox is gone, with what says whose leak it is.
type NetnsLeft struct {
	Path string
	// Mounted: a namespace is bind-mounted on it; otherwise it is the empty
	// file containerd creates before mounting one.
	Mounted bool
	// Sandbox is the sandbox containerd still knows that refers to it
	// ("<id> (<state>)"), or "".
	Sandbox string
	// Pin is Coordino's pin on the same namespace, or "".
	Pin string
	// Links are its interfaces other than lo (a CNI ADD put them there).
	Links []string
}

// ContainerdOrphan reports a namespace only containerd ever had: no
// sandbox it knows refers to it, Coordino holds nothing of it, and no CNI
// ADD reached it. containerd records a sandbox's netns path only after
// creating the namespace (internal/cri/server/sandbox_run.go: NewNetNS,
// then the sandbox store update), so a SIGKILL between the two loses it.
func (n NetnsLeft) ContainerdOrphan() bool {
	return n.Sandbox == "" && n.Pin == "" && len(n.Links) == 0
}

func (n NetnsLeft) String() string {
	var why string
	switch {
	case n.Pin != "":
		why = fmt.Sprintf("Coordino's leak: its pin %s holds this namespace", n.Pin)
		if len(n.Links) > 0 {
			why += fmt.Sprintf(" and its interfaces %v are still there (no DEL completed)", n.Links)
		}
	case n.Sandbox != "":
		why = fmt.Sprintf("containerd still has sandbox %s on it: not stopped yet, or its stop failed (a failed CNI DEL keeps it: see the daemon's log)", n.Sandbox)
	case len(n.Links) > 0:
		why = fmt.Sprintf("interfaces %v are still in it (a CNI ADD reached it and no DEL removed them), though no sandbox refers to it and Coordino pins nothing of it", n.Links)
	case !n.Mounted:
		why = "containerd's own leak: an empty file, never mounted (containerd was killed between creating it and mounting the namespace); no CNI ADD reached it"
	default:
		why = "containerd's own leak: no sandbox containerd knows refers to it, Coordino pins nothing of it and no CNI ADD reached it " +
			"(containerd was killed between creating the namespace and recording it in the sandbox's metadata)"
	}
	return filepath.Base(n.Path) + ": " + why
}

// LeftNetns explains every netns file left in the bed containerd's netns
// directory (none: nil).
func (b *Bed) LeftNetns() ([]NetnsLeft, error) {
	paths, _ := filepath.Glob(filepath.Join(b.Dir, "containerd", "state", "io.containerd.grpc.v1.cri", "netns", "*"))
	if len(paths) == 0 {
		return nil, nil
	}
	refs, err := b.SandboxNetns()
	if err != nil {
		return nil, err
	}
	var pinDirs []string
	for _, d := range b.daemons {
		pinDirs = append(pinDirs, filepath.Join(d.RunDir, "netns"))
	}
	return ExplainNetns(paths, refs, pinDirs...), nil
}

// ExplainNetns says whose each of paths is: sandboxes maps a netns path to
// the sandbox containerd knows that refers to it (SandboxNetns), pinDirs
// are Coordino daemons' pin directories.
func ExplainNetns(paths []string, sandboxes map[string]string, pinDirs ...string) []NetnsLeft {
	pins := map[[2]uint64]string{}
	for _, dir := range pinDirs {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			p := filepath.Join(dir, e.Name())
			if id, ok := nsfsID(p); ok {
				pins[id] = p
			}
		}
	}
	var out []NetnsLeft
	for _, p := range paths {
		n := NetnsLeft{Path: p, Sandbox: sandboxes[p]}
		if id, ok := nsfsID(p); ok {
			n.Mounted = true
			n.Pin = pins[id]
			n.Links = linksIn(p)
		}
		out = append(out, n)
	}
	return out
}

// nsfsID is the (device, inode) of the namespace mounted on path, if one is.
func nsfsID(path string) ([2]uint64, bool) {
	var sfs unix.Statfs_t
	if err := unix.Statfs(path, &sfs); err != nil || uint32(sfs.Type) != unix.NSFS_MAGIC {
		return [2]uint64{}, false
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return [2]uint64{}, false
	}
	return [2]uint64{st.Dev, st.Ino}, true
}

// linksIn lists the interfaces of the namespace at path other than lo.
func linksIn(path string) []string {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return []string{"(cannot open: " + err.Error() + ")"}
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return []string{"(cannot list: " + err.Error() + ")"}
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		return []string{"(cannot list: " + err.Error() + ")"}
	}
	var names []string
	for _, l := range links {
		if l.Attrs().Name != "lo" {
			names = append(names, l.Attrs().Name)
		}
	}
	return names
}

// SandboxNetns maps the netns path of every sandbox containerd knows, in
// any state, to "<id> (<state>)".
func (b *Bed) SandboxNetns() (map[string]string, error) {
	out, err := b.Crictl("pods", "-o", "json")
	if err != nil {
		return nil, err
	}
	var pods struct {
		Items []struct {
			ID    string `json:"id"`
			State string `json:"state"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &pods); err != nil {
		return nil, fmt.Errorf("crictl pods: %w", err)
	}
	refs := map[string]string{}
	for _, p := range pods.Items {
		out, err := b.Crictl("inspectp", "-o", "json", p.ID)
		if err != nil {
			continue // removed meanwhile
		}
		var st struct {
			Info struct {
				Metadata struct {
					NetNSPath string `json:"NetNSPath"`
				} `json:"sandboxMetadata"`
			} `json:"info"`
		}
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			return nil, fmt.Errorf("crictl inspectp %s: %w", p.ID, err)
		}
		if path := st.Info.Metadata.NetNSPath; path != "" {
			refs[path] = p.ID + " (" + strings.TrimPrefix(p.State, "SANDBOX_") + ")"
		}
	}
	return refs, nil
}
