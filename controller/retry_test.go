package controller

import "testing"

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
