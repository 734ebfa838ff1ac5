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
	h.mu.Unlock()
	var once sync.Once
	return s.ch, func() {
		once.Do(func() {
			h.mu.Lock()
			delete(h.subs, s)
			h.mu.Unlock()
			close(s.ch)
		})
	}
}

// Dropped counts events lost to slow subscribers.
func (h *Hub) Dropped() uint64 { return h.dropped.Load() }
