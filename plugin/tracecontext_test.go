package plugin

import (
	"context"
	"testing"
)

func TestOutgoingMetadataForwardsOnlyValidTraceContext(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	t.Setenv("TRACEPARENT", tp)
	t.Setenv("TRACESTATE", "congo=t61rcWkgMzE")
	md := outgoingMetadata(context.Background())
	if len(md) != 2 || md[0].Name != "traceparent" || md[0].Value != tp || md[1].Name != "tracestate" {
		t.Fatalf("metadata = %v", md)
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
		if md := outgoingMetadata(context.Background()); md != nil {
			t.Errorf("TRACEPARENT %q forwarded: %v", bad, md)
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
