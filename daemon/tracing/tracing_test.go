package tracing

import (
	"context"
	"net/netip"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/coordino/coordino/daemon/ipam"
)

// install records spans in memory for one test.
func install(t testing.TB) *tracetest.InMemoryExporter {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
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
