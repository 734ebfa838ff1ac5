package plugin

import (
	"context"
	"os"

	"github.com/coordino/coordino/plugin/unarygrpc"
)

// outgoingMetadata is the request metadata of every call: the runtime's W3C
// trace context, when it passes one in TRACEPARENT/TRACESTATE (the
// OpenTelemetry convention for processes), so the daemon's spans of this
// verb join the runtime's trace. The plugin links no tracing library; bad
// values are dropped, never forwarded.
func outgoingMetadata(context.Context) []unarygrpc.Header {
	tp := os.Getenv("TRACEPARENT")
	if !validTraceparent(tp) {
		return nil
	}
	md := []unarygrpc.Header{{Name: "traceparent", Value: tp}}
	if ts := os.Getenv("TRACESTATE"); validTracestate(ts) {
		md = append(md, unarygrpc.Header{Name: "tracestate", Value: ts})
	}
	return md
}

// validTraceparent accepts version 00 of the W3C header:
// 00-<32 hex trace id, not all zero>-<16 hex parent id, not all zero>-<2 hex flags>.
func validTraceparent(s string) bool {
	if len(s) != 55 || s[:3] != "00-" || s[35] != '-' || s[52] != '-' {
		return false
	}
	return lowerHex(s[3:35], true) && lowerHex(s[36:52], true) && lowerHex(s[53:], false)
}

func lowerHex(s string, nonZero bool) bool {
	zero := true
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
		zero = zero && c == '0'
	}
	return !nonZero || !zero
}

// validTracestate bounds tracestate to printable ASCII of the spec's size.
func validTracestate(s string) bool {
	if s == "" || len(s) > 512 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
