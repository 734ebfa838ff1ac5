package tracing

import (
	"context"
	"net/netip"
	"strconv"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"

	"github.com/coordino/coordino/daemon/ipam"
)

// install records spans in memory for one test.
func install(t testing.TB) *tracetest.InMemoryExporter {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithIDGenerator(idGenerator{}))
	tr := tp.Tracer(instrumentation)
	tracer.Store(&tr)
	t.Cleanup(func() { tracer.Store(nil); _ = tp.Shutdown(context.Background()) })
	return exp
}

// addSpans opens the spans of one primary ADD, as the server and the
// endpoint manager do.
func addSpans(ctx context.Context) {
	ctx, root := StartServer(ctx, "cni.ADD")
	if root.IsRecording() {
		root.SetAttributes(ContainerIDKey.String("c1"), IfNameKey.String("eth0"))
	}
	for _, name := range []string{"ipam.allocate", "store.commit", "netns.pin", "netlink.setup", "bpf.attach"} {
		_, s := Start(ctx, name)
		End(s, nil)
	}
	root.End()
}

func TestSpansOnlyWhenEnabled(t *testing.T) {
	if _, s := Start(context.Background(), "x"); s.IsRecording() || Enabled() {
		t.Fatal("a span is recorded with tracing off")
	}
	if allocs := testing.AllocsPerRun(100, func() { addSpans(context.Background()) }); allocs != 0 {
		t.Fatalf("tracing off allocates %.0f times per ADD", allocs)
	}
	exp := install(t)
	addSpans(context.Background())
	spans := exp.GetSpans()
	if len(spans) != 6 {
		t.Fatalf("%d spans, want 6", len(spans))
	}
	root := spans[len(spans)-1]
	for _, s := range spans[:5] {
		if s.Parent.SpanID() != root.SpanContext.SpanID() {
			t.Fatalf("span %s is not a child of %s", s.Name, root.Name)
		}
	}
	if root.SpanKind != trace.SpanKindServer {
		t.Fatalf("root kind %v", root.SpanKind)
	}
}

// BenchmarkADDTracing compares the spans of one ADD with tracing off and on
// against a reference from the same run: allocating and releasing one pod
// address, the cheapest step of an ADD (go test -bench ADDTracing ./daemon/tracing/).
func BenchmarkADDTracing(b *testing.B) {
	pool, err := ipam.NewPool([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/16")})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("reference-ipam-allocate-release", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			ips, err := pool.Allocate()
			if err != nil {
				b.Fatal(err)
			}
			pool.Release(ips)
		}
	})
	b.Run("spans-off", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			addSpans(context.Background())
		}
	})
	b.Run("spans-on-batched", func(b *testing.B) {
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
		tr := tp.Tracer(instrumentation)
		tracer.Store(&tr)
		defer func() { tracer.Store(nil); _ = tp.Shutdown(context.Background()) }()
		b.ReportAllocs()
		for b.Loop() {
			addSpans(context.Background())
		}
	})
}

func TestPluginSpanFromMetadata(t *testing.T) {
	exp := install(t)
	start := time.Now().Add(-3 * time.Millisecond)
	md := metadata.Pairs("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-1111111111111111-01",
		PluginSpanKey, "00f067aa0ba902b7-"+strconv.FormatInt(start.UnixNano(), 10))
	ctx, span := StartServer(metadata.NewIncomingContext(context.Background(), md), "cni.ADD")
	_, child := Start(ctx, "ipam.allocate")
	child.End()
	span.End()
	spans := exp.GetSpans()
	if len(spans) != 3 {
		t.Fatalf("%d spans", len(spans))
	}
	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans.Snapshots() {
		byName[s.Name()] = s
	}
	plugin, server, ipamSpan := byName["cni.ADD plugin"], byName["cni.ADD"], byName["ipam.allocate"]
	if plugin == nil || server == nil || ipamSpan == nil {
		t.Fatalf("spans %v", byName)
	}
	if plugin.SpanContext().SpanID().String() != "1111111111111111" || plugin.Parent().SpanID().String() != "00f067aa0ba902b7" ||
		plugin.SpanContext().TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || !plugin.StartTime().Equal(time.Unix(0, start.UnixNano())) {
		t.Fatalf("plugin span %v parent %v start %v", plugin.SpanContext(), plugin.Parent(), plugin.StartTime())
	}
	if server.Parent().SpanID() != plugin.SpanContext().SpanID() || ipamSpan.Parent().SpanID() != server.SpanContext().SpanID() ||
		server.SpanContext().SpanID() == plugin.SpanContext().SpanID() || ipamSpan.SpanContext().SpanID() == plugin.SpanContext().SpanID() {
		t.Fatalf("tree: plugin %v, server %v under %v, ipam %v under %v", plugin.SpanContext().SpanID(),
			server.SpanContext().SpanID(), server.Parent().SpanID(), ipamSpan.SpanContext().SpanID(), ipamSpan.Parent().SpanID())
	}
}

func FuzzParsePluginSpan(f *testing.F) {
	remote := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, Remote: true})
	f.Add("00f067aa0ba902b7-" + strconv.FormatInt(time.Now().UnixNano(), 10))
	f.Add("0000000000000000-1")
	f.Add("zz-")
	f.Fuzz(func(t *testing.T, v string) {
		p, ok := parsePluginSpan(remote, v)
		if ok && (time.Since(p.start) > maxPluginSkew || time.Until(p.start) > time.Second) {
			t.Fatalf("accepted start %v from %q", p.start, v)
		}
	})
}
