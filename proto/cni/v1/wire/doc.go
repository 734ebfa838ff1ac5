// Package wire encodes and decodes, in protobuf's binary format, the few
// messages the plugin exchanges with the daemon (CNIRequest, CNIResponse,
// QueuedDelete, CNIError and google.rpc.Status), field for field as
// proto/cni/v1/cni.proto defines them. The plugin runs once per CNI call, so
// it avoids the protobuf runtime's start-up cost.
//
// Where a hand-written codec could part from protobuf it does as protobuf
// does: strings must be valid UTF-8 (the encoders refuse them with
// ErrInvalidUTF8, naming the field), a known field with another wire type
// and unknown fields and groups are skipped, and a message field that occurs
// twice is merged. Differential fuzzers check every message against the
// generated code: the same verdict and values from the same bytes, and what
// one encodes the other decodes.
package wire
