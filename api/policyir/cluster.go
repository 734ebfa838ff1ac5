package policyir

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	cnpv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// NormalizeCluster validates a policy.networking.k8s.io/v1beta1
// ClusterNetworkPolicy and returns its normalized form: the one normalizer
// the controller and standalone mode share. The error names the policy
// and the first bad field; an invalid policy has no IR.
//
// Peers the datapath cannot enforce yet (domainNames) and peers
// with no field set (a newer CRD than this code) fail closed as the API
// asks: an Accept rule ignores them, a Deny or Pass rule becomes a Deny of
// every peer on its ports. Each such case adds a warning.
func NormalizeCluster(cnp *cnpv1beta1.ClusterNetworkPolicy) (*Policy, error) {
	p, err := normalizeCluster(cnp)
	if err != nil {
		return nil, fmt.Errorf("clusternetworkpolicy %s: %w", cnp.Name, err)
	}
	return p, nil
}

func normalizeCluster(cnp *cnpv1beta1.ClusterNetworkPolicy) (*Policy, error) {
	if cnp.Name == "" {
		return nil, fieldErr("metadata.name", "required")
	}
	p := &Policy{Name: cnp.Name, Priority: cnp.Spec.Priority}
	switch cnp.Spec.Tier {
	case cnpv1beta1.AdminTier:
		p.Tier = TierAdmin
	case cnpv1beta1.BaselineTier:
		p.Tier = TierBaseline
	default:
		return nil, fieldErr("spec.tier", "unsupported value %q: must be Admin or Baseline", cnp.Spec.Tier)
	}
	if p.Priority < 0 || p.Priority > MaxPriority {
		return nil, fieldErr("spec.priority", "%d out of range 0-%d", p.Priority, MaxPriority)
	}
	var err error
	if p.NamespaceSelector, p.PodSelector, err = clusterSubject(cnp.Spec.Subject); err != nil {
		return nil, err
	}
	if len(cnp.Spec.Ingress) > MaxRulesPerDirection {
		return nil, fieldErr("spec.ingress", "%d rules: at most %d", len(cnp.Spec.Ingress), MaxRulesPerDirection)
	}
	if len(cnp.Spec.Egress) > MaxRulesPerDirection {
		return nil, fieldErr("spec.egress", "%d rules: at most %d", len(cnp.Spec.Egress), MaxRulesPerDirection)
	}
	for i, r := range cnp.Spec.Ingress {
		f := fmt.Sprintf("spec.ingress[%d]", i)
		peers := make([]clusterPeer, len(r.From))
		for j, peer := range r.From {
			peers[j] = clusterPeer{namespaces: peer.Namespaces, pods: peer.Pods}
		}
		rule, err := clusterRule(p, f, "from", Ingress, i, r.Action, peers, r.Protocols)
		if err != nil {
			return nil, err
		}
		p.Rules = append(p.Rules, rule)
	}
	for i, r := range cnp.Spec.Egress {
		f := fmt.Sprintf("spec.egress[%d]", i)
		peers := make([]clusterPeer, len(r.To))
		for j, peer := range r.To {
			peers[j] = clusterPeer{namespaces: peer.Namespaces, pods: peer.Pods, networks: peer.Networks,
				nodes: peer.Nodes, unsupported: unsupportedEgressPeer(peer)}
		}
		rule, err := clusterRule(p, f, "to", Egress, i, r.Action, peers, r.Protocols)
		if err != nil {
			return nil, err
		}
		p.Rules = append(p.Rules, rule)
	}
	return p, nil
}

func unsupportedEgressPeer(peer cnpv1beta1.ClusterNetworkPolicyEgressPeer) string {
	if len(peer.DomainNames) > 0 {
		return "domainNames"
	}
	return ""
}

// clusterSubject returns the namespace and pod selectors of a subject; it
// must set exactly one of namespaces and pods.
func clusterSubject(s cnpv1beta1.ClusterNetworkPolicySubject) (ns, pods labels.Selector, err error) {
	switch {
	case s.Namespaces != nil && s.Pods != nil:
		return nil, nil, fieldErr("spec.subject", "set exactly one of namespaces and pods")
	case s.Namespaces != nil:
		ns, err = selector("spec.subject.namespaces", s.Namespaces)
		return ns, labels.Everything(), err
	case s.Pods != nil:
		return namespacedPod("spec.subject.pods", s.Pods)
	}
	return nil, nil, fieldErr("spec.subject", "set exactly one of namespaces and pods")
}

func namespacedPod(field string, p *cnpv1beta1.NamespacedPod) (ns, pods labels.Selector, err error) {
	if ns, err = selector(field+".namespaceSelector", &p.NamespaceSelector); err != nil {
		return nil, nil, err
	}
	pods, err = selector(field+".podSelector", &p.PodSelector)
	return ns, pods, err
}

func selector(field string, s *metav1.LabelSelector) (labels.Selector, error) {
	sel, err := metav1.LabelSelectorAsSelector(s)
	if err != nil {
		return nil, fieldErr(field, "%v", err)
	}
	return sel, nil
}

// clusterPeer is an ingress or egress peer: exactly one field set.
type clusterPeer struct {
	namespaces  *metav1.LabelSelector
	pods        *cnpv1beta1.NamespacedPod
	networks    []cnpv1beta1.CIDR
	nodes       *metav1.LabelSelector
	unsupported string // the field of a peer not enforced yet
}

func clusterRule(p *Policy, field, peersField string, dir Direction, index int, action cnpv1beta1.ClusterNetworkPolicyRuleAction,
	peers []clusterPeer, protocols []cnpv1beta1.ClusterNetworkPolicyProtocol) (Rule, error) {
	r := Rule{Direction: dir, Index: index}
	switch action {
	case cnpv1beta1.ClusterNetworkPolicyRuleActionAccept:
		r.Action = ActionAccept
	case cnpv1beta1.ClusterNetworkPolicyRuleActionDeny:
		r.Action = ActionDeny
	case cnpv1beta1.ClusterNetworkPolicyRuleActionPass:
		r.Action = ActionPass
	default:
		return r, fieldErr(field+".action", "unsupported value %q: must be Accept, Deny or Pass", action)
	}
	if len(peers) == 0 {
		return r, fieldErr(field+"."+peersField, "at least one peer is required")
	}
	failClosed := false
	for j, peer := range peers {
		f := fmt.Sprintf("%s.%s[%d]", field, peersField, j)
		set := 0
		for _, b := range []bool{peer.namespaces != nil, peer.pods != nil, len(peer.networks) > 0, peer.nodes != nil, peer.unsupported != ""} {
			if b {
				set++
			}
		}
		switch {
		case set > 1:
			return r, fieldErr(f, "set exactly one of namespaces, pods, networks, nodes and domainNames")
		case set == 0 || peer.unsupported != "":
			what := "no known field"
			if peer.unsupported != "" {
				what = peer.unsupported + " (not supported)"
			}
			if r.Action == ActionAccept {
				p.Warnings = append(p.Warnings, fmt.Sprintf("%s: %s: matches nothing", f, what))
			} else {
				p.Warnings = append(p.Warnings, fmt.Sprintf("%s: %s: the rule denies every peer (fail closed)", f, what))
				failClosed = true
			}
		case peer.namespaces != nil:
			sel, err := selector(f+".namespaces", peer.namespaces)
			if err != nil {
				return r, err
			}
			r.Peers = append(r.Peers, Peer{NamespaceSelector: sel, PodSelector: labels.Everything()})
		case peer.pods != nil:
			ns, pods, err := namespacedPod(f+".pods", peer.pods)
			if err != nil {
				return r, err
			}
			r.Peers = append(r.Peers, Peer{NamespaceSelector: ns, PodSelector: pods})
		case peer.nodes != nil:
			sel, err := selector(f+".nodes", peer.nodes)
			if err != nil {
				return r, err
			}
			r.Peers = append(r.Peers, Peer{NodeSelector: sel})
		default:
			for k, c := range peer.networks {
				cidr, err := parseCIDR(string(c))
				if err != nil {
					return r, fieldErr(fmt.Sprintf("%s.networks[%d]", f, k), "%v", err)
				}
				if cidr.String() != string(c) {
					return r, fieldErr(fmt.Sprintf("%s.networks[%d]", f, k), "%q has host bits set (%s)", c, cidr)
				}
				r.Peers = append(r.Peers, Peer{Block: &IPBlock{CIDR: cidr}})
			}
		}
	}
	if err := clusterPorts(&r, field+".protocols", protocols); err != nil {
		return r, err
	}
	if failClosed {
		// Every peer: a rule with no peers matches all of them.
		r.Action, r.Peers = ActionDeny, nil
	} else if len(r.Peers) == 0 {
		r.NoPorts = true // only ignored peers: matches nothing
	}
	return r, nil
}

func clusterPorts(r *Rule, field string, protocols []cnpv1beta1.ClusterNetworkPolicyProtocol) error {
	for i, pr := range protocols {
		f := fmt.Sprintf("%s[%d]", field, i)
		type proto struct {
			number uint8
			name   string
			port   *cnpv1beta1.Port
		}
		var set []proto
		if pr.TCP != nil {
			set = append(set, proto{ProtoTCP, "tcp", pr.TCP.DestinationPort})
		}
		if pr.UDP != nil {
			set = append(set, proto{ProtoUDP, "udp", pr.UDP.DestinationPort})
		}
		if pr.SCTP != nil {
			set = append(set, proto{ProtoSCTP, "sctp", pr.SCTP.DestinationPort})
		}
		if pr.DestinationNamedPort != "" {
			if len(set) > 0 {
				return fieldErr(f, "set exactly one of tcp, udp, sctp and destinationNamedPort")
			}
			if err := validPortName(pr.DestinationNamedPort); err != nil {
				return fieldErr(f+".destinationNamedPort", "%v", err)
			}
			r.NamedPorts = append(r.NamedPorts, NamedPort{Protocol: ProtoAny, Name: pr.DestinationNamedPort})
			continue
		}
		if len(set) != 1 {
			return fieldErr(f, "set exactly one of tcp, udp, sctp and destinationNamedPort")
		}
		pf := f + "." + set[0].name + ".destinationPort"
		lo, hi, err := clusterPortRange(pf, set[0].port)
		if err != nil {
			return err
		}
		r.Ports = append(r.Ports, PortRange{Protocol: set[0].number, First: lo, Last: hi})
	}
	return nil
}

func clusterPortRange(field string, p *cnpv1beta1.Port) (lo, hi uint16, err error) {
	switch {
	case p == nil:
		return 0, 65535, nil
	case p.Range != nil && p.Number != 0:
		return 0, 0, fieldErr(field, "set exactly one of number and range")
	case p.Range != nil:
		s, e := p.Range.Start, p.Range.End
		if s < 1 || e > 65535 || s >= e {
			return 0, 0, fieldErr(field+".range", "%d-%d: start must be less than end, both within 1-65535", s, e)
		}
		return uint16(s), uint16(e), nil
	case p.Number < 1 || p.Number > 65535:
		return 0, 0, fieldErr(field+".number", "%d out of range 1-65535", p.Number)
	}
	return uint16(p.Number), uint16(p.Number), nil
}
