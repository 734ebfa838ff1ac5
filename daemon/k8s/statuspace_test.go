package k8s

import (
	"testing"
	"time"
)

// TestStatusPacer: a low-water kick schedules one prompt status write
// promptDelay later, kicks while it is pending coalesce, and prompt writes
// keep promptSpacing from the last write (prompt or regular).
func TestStatusPacer(t *testing.T) {
	var p statusPacer
	t0 := time.Unix(1000, 0)
	if d, arm := p.kick(t0); !arm || d != promptDelay {
		t.Fatalf("first kick = %v %v, want timer for %v", d, arm, promptDelay)
	}
	if _, arm := p.kick(t0.Add(100 * time.Millisecond)); arm {
		t.Fatal("kick while a write is pending armed another timer")
	}
	p.fired()
	p.wrote(t0.Add(promptDelay))
	// Right after a write: wait out the spacing, not just the delay.
	if d, arm := p.kick(t0.Add(promptDelay + 100*time.Millisecond)); !arm || d != promptSpacing-100*time.Millisecond {
		t.Fatalf("kick 100ms after a write = %v %v, want %v", d, arm, promptSpacing-100*time.Millisecond)
	}
	p.fired()
	p.wrote(t0.Add(2 * time.Second))
	if d, arm := p.kick(t0.Add(10 * time.Second)); !arm || d != promptDelay {
		t.Fatalf("kick long after a write = %v %v, want %v", d, arm, promptDelay)
	}
}
