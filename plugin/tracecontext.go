package plugin

import (
	"context"
	"math/rand/v2"
	"os"
	"strconv"
	"time"

	"github.com/coordino/coordino/plugin/unarygrpc"
)

// started is when this plugin process began: the start of its span.
var started = time.Now()

// pluginSpanKey is daemon/tracing.PluginSpanKey (the plugin links no daemon code).
const pluginSpanKey = "coordino-plugin-span"

// outgoingMetadata is the request metadata of every call. The plugin starts
// a span without a tracing library: it picks a span ID, sends it as the
// parent in a W3C traceparent — in the runtime's trace when the runtime
// passes one in TRACEPARENT/TRACESTATE (the OpenTelemetry convention for
// processes), else in a new trace — and announces its own parent and start
// time in coordino-plugin-span, so the daemon records the span for it when
// it exports traces (and ignores all of it when it does not). Malformed
// runtime values are dropped, never forwarded.
func outgoingMetadata(context.Context) []unarygrpc.Header {
	parent, flags := "0000000000000000", "01"
	tp := os.Getenv("TRACEPARENT")
	inherited := validTraceparent(tp)
	b := make([]byte, 0, 55)
	b = append(b, "00-"...)
	if inherited {
		b = append(b, tp[3:35]...)
		parent, flags = tp[36:52], tp[53:]
	} else {
		b = appendHex64(appendHex64(b, rand.Uint64()), rand.Uint64()|1)
	}
	b = append(appendHex64(append(b, '-'), rand.Uint64()|1), '-')
	b = append(b, flags...)
	md := []unarygrpc.Header{
		{Name: "traceparent", Value: string(b)},
		{Name: pluginSpanKey, Value: parent + "-" + strconv.FormatInt(started.UnixNano(), 10)},
	}
	if ts := os.Getenv("TRACESTATE"); inherited && validTracestate(ts) {
		md = append(md, unarygrpc.Header{Name: "tracestate", Value: ts})
	}
	return md
}

// appendHex64 appends v as 16 lower-case hex digits.
func appendHex64(b []byte, v uint64) []byte {
	for shift := 60; shift >= 0; shift -= 4 {
		b = append(b, "0123456789abcdef"[v>>uint(shift)&0xf])
	}
	return b
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
