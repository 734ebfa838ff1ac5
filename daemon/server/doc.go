// Package server is the daemon's gRPC face: it listens on the root-only Unix
// socket, admits only peers whose credentials it trusts, validates each
// invocation, hands it to the endpoint manager and turns CNI errors into
// gRPC statuses the plugin can print unchanged.
package server
