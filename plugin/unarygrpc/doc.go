// Package unarygrpc makes one unary gRPC call over an already connected
// stream (the daemon's Unix socket): HTTP/2 without TLS, one stream, the
// frames a unary call needs and the flow control and settings the protocol
// requires of a peer. The daemon stays a grpc-go server; the plugin, which
// runs once per CNI call, avoids grpc-go's client start-up cost.
package unarygrpc
