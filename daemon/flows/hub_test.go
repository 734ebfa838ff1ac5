package flows

import (
	"slices"
	"testing"

	"github.com/coordino/coordino/daemon/datapath"
)

func TestHubFiltersAndNeverBlocks(t *testing.T) {
	h := NewHub()
	all, cancelAll := h.Subscribe(Filter{})
	drops, cancelDrops := h.Subscribe(Filter{Endpoint: "n/c1/eth0", DroppedOnly: true})
	defer cancelDrops()
	h.Publish(datapath.Flow{Endpoint: "n/c1/eth0", Verdict: "allowed"})
	h.Publish(datapath.Flow{Endpoint: "n/c1/eth0", Verdict: "dropped"})
	h.Publish(datapath.Flow{Endpoint: "n/c2/eth0", Verdict: "dropped"})
	if len(all) != 3 {
		t.Fatalf("unfiltered subscriber got %d events", len(all))
	}
	if len(drops) != 1 || (<-drops).Verdict != "dropped" {
		t.Fatalf("filtered subscriber got the wrong events")
	}
	// A subscriber that never reads must not block publishing.
	for i := 0; i < subscriberBuffer+10; i++ {
		h.Publish(datapath.Flow{Endpoint: "x"})
	}
	if h.Dropped() == 0 {
		t.Fatal("overflow was not counted")
	}
	cancelAll()
	cancelAll() // idempotent
	if _, ok := <-all; !ok {
		t.Fatal("buffered events lost at cancel")
	}
}

func TestHubReportsAllowedDemand(t *testing.T) {
	h := NewHub()
	var calls []bool
	h.OnAllowedDemand(func(want bool) { calls = append(calls, want) })
	_, cancelDrops := h.Subscribe(Filter{DroppedOnly: true})
	if h.WantsAllowed() {
		t.Fatal("a dropped-only subscriber wants allowed flows")
	}
	_, cancel1 := h.Subscribe(Filter{})
	_, cancel2 := h.Subscribe(Filter{Endpoint: "n/c1/eth0"})
	if !h.WantsAllowed() {
		t.Fatal("subscribers want allowed flows, hub says no")
	}
	cancel1()
	cancel1() // idempotent: must not count twice
	if !h.WantsAllowed() {
		t.Fatal("one subscriber still wants allowed flows")
	}
	cancel2()
	cancelDrops()
	if h.WantsAllowed() {
		t.Fatal("no subscriber left, hub still wants allowed flows")
	}
	// Registration reports the current state; then only transitions.
	if want := []bool{false, true, false}; !slices.Equal(calls, want) {
		t.Fatalf("demand calls = %v, want %v", calls, want)
	}
}
