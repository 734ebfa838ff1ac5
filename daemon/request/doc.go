// Package request turns one gRPC CNI invocation into a validated Invocation.
// The socket is an API boundary, so the daemon validates everything again
// even though the plugin already did: every failure is a CNI error with the
// spec's code and a message naming the offending field.
package request
