// Package wire encodes and decodes, in protobuf's binary format, the few
// messages the plugin exchanges with the daemon (CNIRequest, CNIResponse,
// QueuedDelete, CNIError and google.rpc.Status), field for field as
// proto/cni/v1/cni.proto defines them. The plugin runs once per CNI call, so
// it avoids the protobuf runtime's start-up cost; tests check every message
// against the generated code.
package wire
