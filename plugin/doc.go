// Package plugin is the Coordino CNI binary's logic: it validates the
// invocation, forwards every verb verbatim to the node daemon over gRPC on a
// Unix socket, and prints the daemon's answer in the CNI version the runtime
// asked for. It holds no network or Kubernetes code: everything that touches
// the node happens in the daemon.
package plugin
