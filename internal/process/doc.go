// Package process is the plumbing every Coordino binary shares (the node
// daemon, the controller and the installer): zap logging at a --log-level,
// the HTTP server of /metrics, /healthz and /readyz, and the context that
// ends on SIGTERM or SIGINT. It imports no other Coordino package, so the
// daemon and the controller both use it without importing each other.
package process
