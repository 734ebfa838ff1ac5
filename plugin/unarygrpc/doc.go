// Package unarygrpc makes one unary gRPC call over an already connected
// stream (the daemon's Unix socket): HTTP/2 without TLS, one stream, the
// frames a unary call needs and the flow control and settings the protocol
// requires of a peer. The daemon stays a grpc-go server; the plugin, which
// runs once per CNI call, avoids grpc-go's client start-up cost.
//
// It is strict where a peer breaks RFC 9113 (frames over the 16 KiB it
// advertises, settings out of range, frames on the wrong or an unopened
// stream, header blocks over 1 MiB): each is a connection error that ends
// the call at once, reported as Unavailable with what the server did. It
// is lenient where the server may close early: after a failed write it reads
// on, and a stream that completes is the call's answer. docs/architecture.md
// ("The plugin's gRPC client and codec") has the whole list.
package unarygrpc
