package tracing

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc/metadata"
)

// instrumentation names the daemon's tracer.
const instrumentation = "github.com/coordino/coordino/daemon"

// Attribute keys on CNI spans.
const (
	ContainerIDKey = attribute.Key("cni.container_id")
	IfNameKey      = attribute.Key("cni.ifname")
	NetworkKey     = attribute.Key("cni.network")
	VerbKey        = attribute.Key("cni.verb")
	CodeKey        = attribute.Key("cni.result_code")
	PodKey         = attribute.Key("k8s.pod.name")
	NamespaceKey   = attribute.Key("k8s.namespace.name")
)

var (
	// tracer is nil while tracing is off: Start then does nothing at all.
	tracer atomic.Pointer[trace.Tracer]
	noSpan trace.Span = noop.Span{}
	w3c               = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
)

// Options configure Setup.
type Options struct {
	// Endpoint is --otlp-endpoint: "host:port" (plain gRPC) or a URL
	// ("https://collector:4317"). Empty defers to the OTEL_* environment.
	Endpoint    string
	ServiceName string
	Version     string
	NodeName    string
}

// Enabled reports whether spans are being recorded and exported.
func Enabled() bool { return tracer.Load() != nil }

// configured reports whether the flag or the standard environment asks for
// an OTLP exporter.
func configured(o Options) bool {
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") || os.Getenv("OTEL_TRACES_EXPORTER") == "none" {
		return false
	}
	return o.Endpoint != "" || os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" ||
		os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" || os.Getenv("OTEL_TRACES_EXPORTER") == "otlp"
}

// Setup installs an OTLP/gRPC exporter when one is configured and returns
// the function that flushes and stops it; otherwise it installs nothing.
// Batching, sampling and headers follow the standard OTEL_* variables.
func Setup(ctx context.Context, o Options) (shutdown func(context.Context) error, err error) {
	if !configured(o) {
		return func(context.Context) error { return nil }, nil
	}
	var opts []otlptracegrpc.Option
	switch {
	case strings.Contains(o.Endpoint, "://"):
		opts = append(opts, otlptracegrpc.WithEndpointURL(o.Endpoint))
	case o.Endpoint != "":
		opts = append(opts, otlptracegrpc.WithEndpoint(o.Endpoint), otlptracegrpc.WithInsecure())
	}
	exp, err := otlptracegrpc.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("OTLP trace exporter: %w", err)
	}
	// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES override the defaults.
	res, err := resource.New(ctx, resource.WithTelemetrySDK(),
		resource.WithAttributes(semconv.ServiceName(o.ServiceName), semconv.ServiceVersion(o.Version), semconv.HostName(o.NodeName)),
		resource.WithFromEnv())
	if err != nil {
		return nil, fmt.Errorf("trace resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res), sdktrace.WithIDGenerator(idGenerator{}))
	t := tp.Tracer(instrumentation)
	tracer.Store(&t)
	return func(ctx context.Context) error {
		tracer.Store(nil)
		return tp.Shutdown(ctx)
	}, nil
}

// StartServer starts the span of one gRPC request, as a child of the W3C
// trace context the caller sent in its metadata (if any). Set attributes
// only when span.IsRecording(): building them costs allocations.
func StartServer(ctx context.Context, name string) (context.Context, trace.Span) {
	t := tracer.Load()
	if t == nil {
		return ctx, noSpan
	}
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok {
		return (*t).Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer))
	}
	ctx = w3c.Extract(ctx, metadataCarrier(md))
	if p, ok := parsePluginSpan(trace.SpanContextFromContext(ctx), metadataCarrier(md).Get(PluginSpanKey)); ok {
		pctx, plugin := startPluginSpan(ctx, *t, name+" plugin", p)
		ctx, span := (*t).Start(pctx, name, trace.WithSpanKind(trace.SpanKindServer))
		return ctx, pairedSpan{Span: span, plugin: plugin}
	}
	return (*t).Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer))
}

// Start starts a child span of the span in ctx (a nil ctx is background).
func Start(ctx context.Context, name string) (context.Context, trace.Span) {
	t := tracer.Load()
	if t == nil {
		return ctx, noSpan
	}
	if ctx == nil {
		ctx = context.Background()
	}
	return (*t).Start(ctx, name)
}

// End records err on span, if any, and ends it.
func End(span trace.Span, err error) {
	if err != nil && span.IsRecording() {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// metadataCarrier reads gRPC metadata as a propagation carrier.
type metadataCarrier metadata.MD

func (c metadataCarrier) Get(key string) string {
	if v := metadata.MD(c).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c metadataCarrier) Set(key, value string) { metadata.MD(c).Set(key, value) }

func (c metadataCarrier) Keys() []string {
	out := make([]string, 0, len(c))
	for k := range c {
		out = append(out, k)
	}
	return out
}
