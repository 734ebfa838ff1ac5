// Package install puts Coordino on a node and takes it off again: it copies
// the CNI plugin binary (and the portmap plugin its primary conflist chains,
// unless the host has its own) into the host's CNI bin dir and writes Coordino's
// conflist (primary mode) or a chained copy of the node's primary conflist
// with Coordino appended (chained mode), keeps that file right while other
// CNIs rewrite theirs (Watch), and removes both on Uninstall, with the
// daemon's datapath programs, BPF pins and netns pins when asked
// (RemoveNodeState). Every file it
// writes is replaced atomically, so a kill at any moment leaves the old or the
// new file, never a partial one.
package install
