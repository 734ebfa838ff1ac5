package bgp

import (
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// ReadyHere returns the Services ("namespace/name") with a ready endpoint
// on node, from their EndpointSlices (an endpoint whose Ready condition is
// unset counts as ready, as the API documents).
func ReadyHere(eps []*discoveryv1.EndpointSlice, node string) map[string]bool {
	out := map[string]bool{}
	for _, s := range eps {
		svc := s.Labels[discoveryv1.LabelServiceName]
		if svc == "" {
			continue
		}
		for _, e := range s.Endpoints {
			if e.NodeName != nil && *e.NodeName == node && (e.Conditions.Ready == nil || *e.Conditions.Ready) {
				out[s.Namespace+"/"+svc] = true
				break
			}
		}
	}
	return out
}

// ServiceRoutes returns the host routes this node announces for the
// Services sel selects: every LoadBalancer ingress IP and externalIP of
// each, except that a Service with externalTrafficPolicy Local is left to
// the nodes with a ready endpoint of it (readyHere, from ReadyHere). A nil
// sel announces nothing. Unparsable addresses are skipped: the API server
// validates externalIPs, and a load balancer's status is its controller's.
func ServiceRoutes(sel labels.Selector, svcs []*corev1.Service, readyHere map[string]bool) []netip.Prefix {
	if sel == nil {
		return nil
	}
	var out []netip.Prefix
	for _, s := range svcs {
		if !sel.Matches(labels.Set(s.Labels)) {
			continue
		}
		if s.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal && !readyHere[s.Namespace+"/"+s.Name] {
			continue
		}
		addrs := slices.Clone(s.Spec.ExternalIPs)
		for _, in := range s.Status.LoadBalancer.Ingress {
			addrs = append(addrs, in.IP)
		}
		for _, a := range addrs {
			ip, err := netip.ParseAddr(a)
			if err != nil || ip.Zone() != "" {
				continue
			}
			ip = ip.Unmap()
			out = append(out, netip.PrefixFrom(ip, ip.BitLen()))
		}
	}
	slices.SortFunc(out, netip.Prefix.Compare)
	return slices.Compact(out)
}
