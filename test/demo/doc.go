// Command demo is Coordino's guided end-to-end tour (`make demo`): on plain
// network namespaces, with no Kubernetes, it starts a standalone
// coordino-daemon in a "node" namespace, attaches pods through libcni in
// primary and chained mode, proves connectivity, breaks and repairs a pod,
// crashes and restarts the daemon, garbage-collects stale attachments, reads
// the daemon's metrics and finally removes everything it made, showing that
// nothing is left.
//
// It needs root and the binaries of `make build ref-plugins`. Colour is used
// only when stdout is a terminal (and NO_COLOR is unset). The exit status is
// non-zero when any check fails. Ctrl-C or SIGTERM stops the tour and still
// cleans up.
package main
