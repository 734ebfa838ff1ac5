package flows

import (
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
