// Package e2e holds the node-level end-to-end tests: real network
// namespaces, the real daemon, and the plugin driven through libcni.
package e2e
