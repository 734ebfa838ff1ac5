package tracing

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// PluginSpanKey is the gRPC metadata with which the plugin describes the
// span it started without a tracing library: "<parent span id>-<start unix
// ns>". Its own span ID is the parent ID of the traceparent it sends; the
// daemon records that span on the plugin's behalf.
const PluginSpanKey = "coordino-plugin-span"

// maxPluginSkew bounds how far a plugin's start time may lie from now
// (its call timeout) before the daemon distrusts it.
const maxPluginSkew = 2 * time.Minute

// pluginSpan is the plugin's span as announced in the request metadata.
type pluginSpan struct {
	sc     trace.SpanContext // trace ID, the plugin's span ID, flags
	parent trace.SpanID      // the runtime's span, or invalid
	start  time.Time
}

// parsePluginSpan reads the announcement next to the extracted remote span
// context; ok is false for anything malformed.
func parsePluginSpan(remote trace.SpanContext, v string) (pluginSpan, bool) {
	if !remote.IsValid() || !remote.IsRemote() {
		return pluginSpan{}, false
	}
	parentHex, startStr, found := strings.Cut(v, "-")
	if !found || len(parentHex) != 16 {
		return pluginSpan{}, false
	}
	var parent trace.SpanID
	if _, err := hex.Decode(parent[:], []byte(parentHex)); err != nil {
		return pluginSpan{}, false
	}
	ns, err := strconv.ParseInt(startStr, 10, 64)
	if err != nil {
		return pluginSpan{}, false
	}
	start := time.Unix(0, ns)
	if d := time.Since(start); d < -time.Second || d > maxPluginSkew {
		return pluginSpan{}, false
	}
	return pluginSpan{sc: remote, parent: parent, start: start}, true
}

// startPluginSpan records the plugin's span and returns a context whose
// span is it, for the server span to be its child.
func startPluginSpan(ctx context.Context, t trace.Tracer, name string, p pluginSpan) (context.Context, trace.Span) {
	ctx = trace.ContextWithSpanContext(ctx, trace.SpanContext{}) // drop the remote plugin span as parent
	if p.parent.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, trace.NewSpanContext(trace.SpanContextConfig{
			TraceID: p.sc.TraceID(), SpanID: p.parent, TraceFlags: p.sc.TraceFlags(), TraceState: p.sc.TraceState(), Remote: true,
		}))
	}
	ctx = context.WithValue(ctx, presetKey{}, &presetIDs{trace: p.sc.TraceID(), span: p.sc.SpanID()})
	return t.Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient), trace.WithTimestamp(p.start))
}

// pairedSpan is the server span; ending it ends the plugin's span too
// (which thus covers the plugin from its start to the daemon's answer).
type pairedSpan struct {
	trace.Span
	plugin trace.Span
}

func (s pairedSpan) End(opts ...trace.SpanEndOption) {
	s.Span.End(opts...)
	s.plugin.End(opts...)
}

type presetKey struct{}

// presetIDs are the IDs the next span started under this context takes,
// once: its children get fresh ones.
type presetIDs struct {
	trace trace.TraceID
	span  trace.SpanID
	used  atomic.Bool
}

// idGenerator hands out preset IDs (the plugin's span) when asked, else
// random ones.
type idGenerator struct{}

var _ sdktrace.IDGenerator = idGenerator{}

func (g idGenerator) preset(ctx context.Context) *presetIDs {
	p, _ := ctx.Value(presetKey{}).(*presetIDs)
	if p == nil || !p.used.CompareAndSwap(false, true) {
		return nil
	}
	return p
}

func (g idGenerator) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	if p := g.preset(ctx); p != nil {
		return p.trace, p.span
	}
	var t trace.TraceID
	for !t.IsValid() {
		binary.LittleEndian.PutUint64(t[:8], rand.Uint64())
		binary.LittleEndian.PutUint64(t[8:], rand.Uint64())
	}
	return t, g.NewSpanID(ctx, t)
}

func (g idGenerator) NewSpanID(ctx context.Context, traceID trace.TraceID) trace.SpanID {
	if p := g.preset(ctx); p != nil && p.trace == traceID {
		return p.span
	}
	var sp trace.SpanID
	for !sp.IsValid() {
		binary.LittleEndian.PutUint64(sp[:], rand.Uint64())
	}
	return sp
}
