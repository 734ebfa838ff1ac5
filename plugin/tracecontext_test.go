package plugin

import (
	"context"
	"strings"
	"testing"
)

func TestOutgoingMetadataStartsASpanInTheRuntimesTrace(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	t.Setenv("TRACEPARENT", tp)
	t.Setenv("TRACESTATE", "congo=t61rcWkgMzE")
	md := outgoingMetadata(context.Background())
	if len(md) != 3 || md[0].Name != "traceparent" || md[1].Name != pluginSpanKey || md[2].Name != "tracestate" {
		t.Fatalf("metadata = %v", md)
	}
	got := md[0].Value
	if !validTraceparent(got) || got[3:35] != tp[3:35] || got[36:52] == tp[36:52] || got[53:] != "01" {
		t.Fatalf("traceparent %q is not a new span in the runtime's trace %q", got, tp)
	}
	if !strings.HasPrefix(md[1].Value, "00f067aa0ba902b7-") {
		t.Fatalf("plugin span %q does not name the runtime's span as parent", md[1].Value)
	}
	for _, bad := range []string{
		"", "garbage",
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01", // zero trace id
		"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", // zero parent id
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", // upper case
		"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", // unknown version
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\nx: y",
	} {
		t.Setenv("TRACEPARENT", bad)
		md := outgoingMetadata(context.Background())
		if len(md) != 2 || !validTraceparent(md[0].Value) || md[0].Value[3:35] == tp[3:35] || !strings.HasPrefix(md[1].Value, "0000000000000000-") {
			t.Errorf("TRACEPARENT %q: metadata %v, want a new trace", bad, md)
		}
	}
}

func FuzzValidTraceparent(f *testing.F) {
	f.Add("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	f.Add("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0")
	f.Fuzz(func(t *testing.T, s string) {
		if validTraceparent(s) && (len(s) != 55 || s[:3] != "00-") {
			t.Fatalf("accepted %q", s)
		}
	})
}

// BenchmarkOutgoingMetadata is the plugin's whole tracing cost per verb
// (go test -bench OutgoingMetadata ./plugin/).
func BenchmarkOutgoingMetadata(b *testing.B) {
	b.Setenv("TRACEPARENT", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	b.ReportAllocs()
	for b.Loop() {
		outgoingMetadata(context.Background())
	}
}
