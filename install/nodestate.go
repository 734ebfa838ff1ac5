package install

import "errors"

// NodeState names the runtime state the daemon leaves on a node.
type NodeState struct {
	RunDir string // the daemon's --run-dir: socket, netns pins under netns/
	BPFDir string // the daemon's --bpf-dir: pinned maps and tcx links
	// StateDir is the daemon's --state-dir (endpoint store, last-known
	// cluster state); its contents are removed last. Empty: left alone.
	StateDir string
}

// runDirEntries are what the daemon and the plugin create in the run dir
// (the socket, the inspect socket, the deletion queue, the netns pin dir,
// the metrics address, the userspace WireGuard device's pid and log files):
// only these are removed, so a run dir shared with anything else keeps the
// rest.
var runDirEntries = []string{"coordino.sock", "inspect.sock", "delete-queue", "netns", "metrics.addr", "wireguard-*.pid", "wireguard-*.log"}

// ErrDaemonRunning is returned by RemoveNodeState while a daemon still
// serves on the run dir's socket: it would attach programs again.
var ErrDaemonRunning = errors.New("coordino-daemon is still running")
