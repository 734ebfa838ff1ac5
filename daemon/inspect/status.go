package inspect

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/coordino/coordino/daemon/datapath"
	"github.com/coordino/coordino/daemon/ipam"
	"github.com/coordino/coordino/daemon/metrics"
	"github.com/coordino/coordino/daemon/store"
	inspectv1 "github.com/coordino/coordino/proto/inspect/v1"
)

// Thresholds of the status verdict; the PrometheusRule alerts use the same.
const (
	// mapPressureWarn is the fill above which a BPF map is a problem.
	mapPressureWarn = 0.8
	// queueStuckAfter is how old a queued DEL may get before the queue
	// counts as not draining (the daemon drains it every 5 s).
	queueStuckAfter = time.Minute
)

// GetStatus implements Inspector.GetStatus.
func (s *Service) GetStatus(context.Context, *inspectv1.GetStatusRequest) (*inspectv1.Status, error) {
	usage := s.cfg.Pool.Usage()
	st := &inspectv1.Status{
		Version:          Version(),
		NodeName:         s.cfg.NodeName,
		Mode:             "kubernetes",
		ControlPlane:     "static (--pod-cidr, --policy-dir)",
		AttachMode:       s.cfg.AttachMode,
		StartedUnix:      s.started.Unix(),
		Blocks:           blocks(usage),
		Datapath:         s.cfg.DatapathKind,
		DatapathFallback: s.cfg.DatapathFallback,
	}
	if s.cfg.Standalone {
		st.Mode = "standalone"
	}
	var problems, failures []string
	eps, err := s.cfg.Store.List("")
	if err != nil {
		return nil, status.Errorf(codes.Internal, "list endpoints: %v", err)
	}
	for _, ep := range eps {
		if ep.Mode == store.ModeChained {
			st.ChainedEndpoints++
		} else {
			st.PrimaryEndpoints++
		}
	}
	failures, problems = s.addressPressure(usage, failures, problems)
	if s.cfg.KernelFeatures != nil {
		st.KernelFeatures = s.cfg.KernelFeatures()
	}
	if s.cfg.CrossNode != nil {
		st.CrossNode = s.cfg.CrossNode()
		for _, p := range st.CrossNode.GetPeers() {
			if p.Problem != "" {
				problems = append(problems, fmt.Sprintf("peer node %s: %s", p.Name, p.Problem))
			}
		}
	}
	if s.cfg.Masquerade != nil {
		st.Masquerade = s.cfg.Masquerade()
		if p := st.Masquerade.GetProblem(); p != "" {
			problems = append(problems, "masquerade: "+p)
		}
	}
	if s.cfg.NotEnforced != nil {
		if msg := s.cfg.NotEnforced(); msg != "" {
			problems = append(problems, msg)
		}
	}
	if dp := s.cfg.Datapath; dp != nil {
		st.Identities = uint32(len(dp.Identities()))
		rev, invalid := dp.PolicyRevision()
		st.PolicyRevision, st.InvalidPolicies = rev, uint32(invalid)
		if invalid > 0 {
			problems = append(problems, fmt.Sprintf("%d invalid network policies skipped", invalid))
		}
		usage, err := dp.MapUsage()
		if err != nil {
			return nil, status.Errorf(codes.Internal, "map usage: %v", err)
		}
		for _, u := range usage {
			st.Maps = append(st.Maps, &inspectv1.MapPressure{Name: u.Name, Entries: uint32(u.Entries), Capacity: uint32(u.Capacity),
				UpdateFailures: u.UpdateFailures, Refusing: u.Refusing})
			if u.Refusing {
				failures = append(failures, fmt.Sprintf("BPF map %s refuses updates (%d/%d, %d refused writes): failing closed; raise --%s",
					u.Name, u.Entries, u.Capacity, u.UpdateFailures, datapath.MapSizeFlag(u.Name)))
			} else if u.Capacity > 0 && float64(u.Entries) >= mapPressureWarn*float64(u.Capacity) {
				problems = append(problems, fmt.Sprintf("BPF map %s is %d%% full (%d/%d)", u.Name, 100*u.Entries/u.Capacity, u.Entries, u.Capacity))
			}
		}
	} else if s.cfg.DatapathKind == "nftables" {
		st.AttachMode = "nftables"
	} else {
		st.AttachMode = "none"
		problems = append(problems, "datapath disabled (--no-datapath): NetworkPolicy is not enforced")
	}
	n, oldest, err := metrics.DeleteQueue(s.cfg.QueueDir)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	st.DeleteQueue = uint32(n)
	if n > 0 && oldest > queueStuckAfter {
		problems = append(problems, fmt.Sprintf("delete queue not draining: %d DELs, oldest %s", n, oldest.Round(time.Second)))
	}
	switch {
	case len(failures) > 0:
		st.Verdict = "failing"
	case len(problems) > 0:
		st.Verdict = "degraded"
	default:
		st.Verdict = "ok"
	}
	st.Problems = append(failures, problems...)
	return st, nil
}

// addressPressure judges each address family over all of its blocks: one
// full block beside others with room is normal. A family with no address
// left is failing in standalone mode (only --pod-cidr can grow it) and
// degraded in Kubernetes mode, where the controller is adding a block and
// ADDs answer "try again later" meanwhile.
func (s *Service) addressPressure(usage []ipam.Usage, failures, problems []string) ([]string, []string) {
	for _, fam := range []struct {
		name string
		is4  bool
	}{{"IPv4", true}, {"IPv6", false}} {
		var used, size int
		var cidrs []string
		for _, b := range usage {
			if b.Prefix.Addr().Is4() == fam.is4 {
				used, size = used+b.Used, size+b.Size
				cidrs = append(cidrs, b.Prefix.String())
			}
		}
		switch {
		case size == 0:
		case used >= size && s.cfg.Standalone:
			failures = append(failures, fmt.Sprintf("every %s address is in use, the pool is exhausted (%d/%d in %s): new pods fail until some leave or --pod-cidr grows",
				fam.name, used, size, strings.Join(cidrs, ", ")))
		case used >= size:
			problems = append(problems, fmt.Sprintf("every %s block is full (%d/%d in %s): new pods retry until the controller adds a block",
				fam.name, used, size, strings.Join(cidrs, ", ")))
		case float64(used) >= mapPressureWarn*float64(size):
			problems = append(problems, fmt.Sprintf("%s blocks are %d%% used (%d/%d)", fam.name, 100*used/size, used, size))
		}
	}
	return failures, problems
}

func blocks(usage []ipam.Usage) []*inspectv1.Block {
	var out []*inspectv1.Block
	for _, u := range usage {
		out = append(out, &inspectv1.Block{Cidr: u.Prefix.String(), Size: uint32(u.Size), Used: uint32(u.Used), Free: uint32(u.Size - u.Used)})
	}
	return out
}

// GetIPAM implements Inspector.GetIPAM.
func (s *Service) GetIPAM(context.Context, *inspectv1.GetIPAMRequest) (*inspectv1.IPAM, error) {
	eps, err := s.cfg.Store.List("")
	if err != nil {
		return nil, status.Errorf(codes.Internal, "list endpoints: %v", err)
	}
	out := &inspectv1.IPAM{Blocks: blocks(s.cfg.Pool.Usage())}
	for _, ep := range eps {
		if ep.Mode != store.ModePrimary {
			continue
		}
		for _, p := range ep.IPs {
			out.Allocations = append(out.Allocations, &inspectv1.Allocation{Ip: p.Addr().String(), Endpoint: ep.Key.String(), Pod: podName(ep)})
		}
	}
	return out, nil
}

// ListIdentities implements Inspector.ListIdentities.
func (s *Service) ListIdentities(context.Context, *inspectv1.ListIdentitiesRequest) (*inspectv1.ListIdentitiesResponse, error) {
	out := &inspectv1.ListIdentitiesResponse{}
	if s.cfg.Datapath == nil {
		return out, nil
	}
	counts := map[uint32]uint32{}
	for _, e := range s.cfg.Datapath.EndpointStates() {
		counts[uint32(e.Identity)]++
	}
	for _, id := range s.cfg.Datapath.Identities() {
		out.Identities = append(out.Identities, &inspectv1.Identity{
			Id: uint32(id.ID), Namespace: id.Namespace, Labels: maps.Clone(id.Labels), Endpoints: counts[uint32(id.ID)],
		})
	}
	slices.SortFunc(out.Identities, func(a, b *inspectv1.Identity) int { return int(a.Id) - int(b.Id) })
	return out, nil
}
