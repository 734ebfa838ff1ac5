// Package tracing gives the daemon OpenTelemetry traces of CNI verbs: a
// server span per request (child of the caller's W3C trace context from
// the gRPC "traceparent" metadata), the span the plugin announces and the
// daemon records for it (plugin.go), and child spans for IPAM, the store
// commit, netns pinning, netlink set-up and the BPF attach. Spans are
// exported over OTLP/gRPC only when an endpoint is configured
// (--otlp-endpoint or the standard OTEL_EXPORTER_OTLP_* variables);
// otherwise Start returns at once without allocating, so the ADD path pays
// nothing measurable.
package tracing
