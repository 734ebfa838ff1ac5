package controller

import (
	"io"
	"strings"
	"testing"
)

// TestRetryDelayIsCapped: a key that keeps failing is retried at least
// every maxRetryDelay, never after client-go's default of up to 1000 s (a
// node left without a block for minutes although its next sync would
// succeed).
func TestRetryDelayIsCapped(t *testing.T) {
	l := retryLimiter()
	for i := 0; i < 40; i++ {
		if d := l.When("n-03"); d > maxRetryDelay {
			t.Fatalf("failure %d: next retry in %s, more than %s", i+1, d, maxRetryDelay)
		}
	}
	l.Forget("n-03")
	if d := l.When("n-03"); d > maxRetryDelay {
		t.Fatalf("after success: %s", d)
	}
}

// TestKubeAPIRateLimit: the controller does not run at client-go's default
// 5 requests/s (500 new Nodes would wait minutes for their blocks), the
// flags set the limit and negative values are refused.
func TestKubeAPIRateLimit(t *testing.T) {
	o, err := Parse(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.KubeAPIQPS < 50 || o.KubeAPIBurst < 100 {
		t.Fatalf("default limit %v/s burst %d", o.KubeAPIQPS, o.KubeAPIBurst)
	}
	if o, err = Parse([]string{"--kube-api-qps", "200", "--kube-api-burst", "400"}, io.Discard); err != nil || o.KubeAPIQPS != 200 || o.KubeAPIBurst != 400 {
		t.Fatalf("flags: %v/s burst %d (%v)", o.KubeAPIQPS, o.KubeAPIBurst, err)
	}
	if _, err := Parse([]string{"--kube-api-qps", "-1"}, io.Discard); err == nil || !strings.Contains(err.Error(), "--kube-api-qps") {
		t.Fatalf("negative QPS: %v", err)
	}
}
