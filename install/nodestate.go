package install

import "errors"

// NodeState names the runtime state the daemon leaves on a node.
type NodeState struct {
	RunDir string // the daemon's --run-dir: socket, netns pins under netns/
	BPFDir string // the daemon's --bpf-dir: pinned maps and tcx links
}

// ErrDaemonRunning is returned by RemoveNodeState while a daemon still
// serves on the run dir's socket: it would attach programs again.
var ErrDaemonRunning = errors.New("coordino-daemon is still running")
