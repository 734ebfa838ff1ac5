package flows

import (
	"sync"
	"sync/atomic"

	"github.com/coordino/coordino/daemon/datapath"
)

// subscriberBuffer is how many events a subscriber may fall behind before
// events are dropped for it.
const subscriberBuffer = 1024

// Filter selects events for a subscriber.
type Filter struct {
	Endpoint    string
	DroppedOnly bool
}

func (f Filter) match(ev datapath.Flow) bool {
	return (f.Endpoint == "" || ev.Endpoint == f.Endpoint) && (!f.DroppedOnly || ev.Verdict == "dropped")
}

type subscriber struct {
	ch     chan datapath.Flow
	filter Filter
}

// Hub distributes events. Safe for concurrent use.
type Hub struct {
	mu      sync.Mutex
	subs    map[*subscriber]struct{}
	dropped atomic.Uint64
	// wantAllowed counts subscribers that want allowed flows (not
	// DroppedOnly); onDemand hears when it becomes zero or non-zero.
	wantAllowed int
	onDemand    func(bool)
}

// NewHub returns an empty hub.
func NewHub() *Hub { return &Hub{subs: map[*subscriber]struct{}{}} }

// Publish hands ev to every matching subscriber without blocking.
func (h *Hub) Publish(ev datapath.Flow) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		if !s.filter.match(ev) {
			continue
		}
		select {
		case s.ch <- ev:
		default:
			h.dropped.Add(1)
		}
	}
}

// Subscribe returns a channel of matching events and a function that ends
// the subscription (and closes the channel).
func (h *Hub) Subscribe(f Filter) (<-chan datapath.Flow, func()) {
	s := &subscriber{ch: make(chan datapath.Flow, subscriberBuffer), filter: f}
	h.mu.Lock()
	h.subs[s] = struct{}{}
	h.addDemand(s, 1)
	h.mu.Unlock()
	var once sync.Once
	return s.ch, func() {
		once.Do(func() {
			h.mu.Lock()
			delete(h.subs, s)
			h.addDemand(s, -1)
			h.mu.Unlock()
			close(s.ch)
		})
	}
}

// OnAllowedDemand registers fn (replacing any earlier one) and calls it at
// once with whether some subscriber wants allowed flows, then on every
// change. Calls are serialised and made before Subscribe returns, so a new
// subscriber sees every allowed flow the datapath reports after that.
func (h *Hub) OnAllowedDemand(fn func(want bool)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.onDemand = fn
	if fn != nil {
		fn(h.wantAllowed > 0)
	}
}

// WantsAllowed reports whether some subscriber wants allowed flows.
func (h *Hub) WantsAllowed() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.wantAllowed > 0
}

// addDemand counts s in or out; callers hold mu.
func (h *Hub) addDemand(s *subscriber, delta int) {
	if s.filter.DroppedOnly {
		return
	}
	before := h.wantAllowed > 0
	h.wantAllowed += delta
	if after := h.wantAllowed > 0; after != before && h.onDemand != nil {
		h.onDemand(after)
	}
}

// Dropped counts events lost to slow subscribers.
func (h *Hub) Dropped() uint64 { return h.dropped.Load() }
