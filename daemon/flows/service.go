package flows

import (
	"github.com/coordino/coordino/daemon/datapath"
	flowv1 "github.com/coordino/coordino/proto/flow/v1"
)

// Service implements the Observer gRPC service over a Hub.
type Service struct {
	flowv1.UnimplementedObserverServer
	hub *Hub
}

// NewService serves hub's events.
func NewService(hub *Hub) *Service { return &Service{hub: hub} }

// FollowFlows streams matching events until the client goes away. The
// response headers are sent once the subscription is in place.
func (s *Service) FollowFlows(req *flowv1.FollowFlowsRequest, stream flowv1.Observer_FollowFlowsServer) error {
	events, cancel := s.hub.Subscribe(Filter{Endpoint: req.Endpoint, DroppedOnly: req.DroppedOnly})
	defer cancel()
	// Headers now, not with the first event: they tell the client the
	// subscription stands (nothing after this is missed) and that the
	// daemon answers, however quiet the node is.
	if err := stream.SendHeader(nil); err != nil {
		return err
	}
	ctx := stream.Context()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev := <-events:
			if err := stream.Send(ToProto(ev)); err != nil {
				return err
			}
		}
	}
}

// ToProto converts a datapath flow to its wire form.
func ToProto(f datapath.Flow) *flowv1.FlowEvent {
	ev := &flowv1.FlowEvent{
		TimeUnixNano:   f.Time.UnixNano(),
		Endpoint:       f.Endpoint,
		Ifindex:        f.IfIndex,
		Direction:      f.Direction,
		Verdict:        f.Verdict,
		Reason:         f.Reason,
		Protocol:       f.Protocol,
		SrcPort:        uint32(f.SrcPort),
		DstPort:        uint32(f.DstPort),
		LocalIdentity:  f.LocalIdentity,
		RemoteIdentity: f.RemoteIdentity,
	}
	if f.Src.IsValid() {
		ev.Src = f.Src.String()
	}
	if f.Dst.IsValid() {
		ev.Dst = f.Dst.String()
	}
	return ev
}
