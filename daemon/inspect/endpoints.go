package inspect

import (
	"context"
	"maps"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/coordino/coordino/daemon/datapath"
	"github.com/coordino/coordino/daemon/store"
	inspectv1 "github.com/coordino/coordino/proto/inspect/v1"
)

// ListEndpoints implements Inspector.ListEndpoints.
func (s *Service) ListEndpoints(context.Context, *inspectv1.ListEndpointsRequest) (*inspectv1.ListEndpointsResponse, error) {
	eps, err := s.endpoints()
	if err != nil {
		return nil, err
	}
	return &inspectv1.ListEndpointsResponse{Endpoints: eps}, nil
}

// GetEndpoint implements Inspector.GetEndpoint.
func (s *Service) GetEndpoint(_ context.Context, req *inspectv1.GetEndpointRequest) (*inspectv1.Endpoint, error) {
	eps, err := s.endpoints()
	if err != nil {
		return nil, err
	}
	return findEndpoint(eps, req.Query)
}

// endpoints joins the store's records with the datapath's view of them.
func (s *Service) endpoints() ([]*inspectv1.Endpoint, error) {
	stored, err := s.cfg.Store.List("")
	if err != nil {
		return nil, status.Errorf(codes.Internal, "list endpoints: %v", err)
	}
	attached := map[string]datapath.EndpointState{}
	if s.cfg.Policy != nil {
		for _, e := range s.cfg.Policy.EndpointStates() {
			attached[e.Key] = e
		}
	}
	out := make([]*inspectv1.Endpoint, 0, len(stored))
	for _, ep := range stored {
		e := &inspectv1.Endpoint{
			Key: ep.Key.String(), Network: ep.Network, ContainerId: ep.ContainerID, Ifname: ep.IfName,
			PodNamespace: ep.PodNamespace, PodName: ep.PodName, PodUid: ep.PodUID, Mode: string(ep.Mode),
			HostInterface: ep.HostIfName, Identity: ep.Identity, Labels: maps.Clone(ep.Labels),
			Netns: ep.Netns, CreatedUnix: ep.Created.Unix(),
		}
		for _, p := range ep.IPs {
			e.Ips = append(e.Ips, p.Addr().String())
		}
		if a, ok := attached[e.Key]; ok {
			e.HostIfindex = uint32(a.HostIfIndex)
			e.Identity = uint32(a.Identity)
			e.AttachMode = a.Mode
			e.IngressIsolated = a.Isolation&1 != 0
			e.EgressIsolated = a.Isolation&2 != 0
		}
		out = append(out, e)
	}
	return out, nil
}

// findEndpoint resolves a query: an attachment key, "namespace/name", a pod
// name, or a container ID or unique prefix of one. Ambiguity is an error.
func findEndpoint(eps []*inspectv1.Endpoint, q string) (*inspectv1.Endpoint, error) {
	if q == "" {
		return nil, status.Error(codes.InvalidArgument, "endpoint query is empty: give a pod (namespace/name or name) or a container ID")
	}
	var hits []*inspectv1.Endpoint
	for _, match := range []func(*inspectv1.Endpoint) bool{
		func(e *inspectv1.Endpoint) bool { return e.Key == q || e.ContainerId == q },
		func(e *inspectv1.Endpoint) bool { return e.PodName != "" && e.PodNamespace+"/"+e.PodName == q },
		func(e *inspectv1.Endpoint) bool { return e.PodName == q },
		func(e *inspectv1.Endpoint) bool { return len(q) >= 4 && strings.HasPrefix(e.ContainerId, q) },
	} {
		for _, e := range eps {
			if match(e) {
				hits = append(hits, e)
			}
		}
		if len(hits) > 0 {
			break
		}
	}
	switch len(hits) {
	case 0:
		return nil, status.Errorf(codes.NotFound, "no endpoint matches %q", q)
	case 1:
		return hits[0], nil
	}
	keys := make([]string, len(hits))
	for i, h := range hits {
		keys[i] = h.Key
	}
	return nil, status.Errorf(codes.FailedPrecondition, "%q matches %d endpoints (%s): give the container ID", q, len(hits), strings.Join(keys, ", "))
}

func podName(ep *store.Endpoint) string {
	if ep.PodName == "" {
		return ""
	}
	return ep.PodNamespace + "/" + ep.PodName
}
