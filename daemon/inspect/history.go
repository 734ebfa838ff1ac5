package inspect

import (
	"context"
	"sync"

	"github.com/coordino/coordino/daemon/datapath"
	"github.com/coordino/coordino/daemon/flows"
	inspectv1 "github.com/coordino/coordino/proto/inspect/v1"
)

// historySize bounds the remembered drops (about 200 bytes each).
const historySize = 4096

// history remembers the newest drops for `coordinoctl flows --since`. It
// subscribes for drops only: those are reported anyway, while asking for
// allowed flows would make every new connection cost an event.
type history struct {
	mu   sync.Mutex
	ring []datapath.Flow
	next int
	full bool
}

func newHistory(n int) *history { return &history{ring: make([]datapath.Flow, n)} }

func (h *history) follow(ctx context.Context, hub *flows.Hub) {
	events, cancel := hub.Subscribe(flows.Filter{DroppedOnly: true})
	go func() {
		defer cancel()
		for {
			select {
			case <-ctx.Done():
				return
			case ev := <-events:
				h.add(ev)
			}
		}
	}()
}

func (h *history) add(f datapath.Flow) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ring[h.next] = f
	h.next = (h.next + 1) % len(h.ring)
	h.full = h.full || h.next == 0
}

// since returns remembered flows at or after sinceNano, oldest first.
func (h *history) since(sinceNano int64) []datapath.Flow {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []datapath.Flow
	start, n := 0, h.next
	if h.full {
		start, n = h.next, len(h.ring)
	}
	for i := range n {
		f := h.ring[(start+i)%len(h.ring)]
		if f.Time.UnixNano() >= sinceNano {
			out = append(out, f)
		}
	}
	return out
}

// ListRecentFlows implements Inspector.ListRecentFlows.
func (s *Service) ListRecentFlows(_ context.Context, req *inspectv1.ListRecentFlowsRequest) (*inspectv1.ListRecentFlowsResponse, error) {
	out := &inspectv1.ListRecentFlowsResponse{}
	for _, f := range s.history.since(req.SinceUnixNano) {
		out.Flows = append(out.Flows, flows.ToProto(f))
	}
	return out, nil
}
