package nodeiso

import (
	"errors"
	"fmt"
	"slices"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/policy"
)

// LocalPod is the local identity of pod -> host entries: they hold for every
// pod (no pod has identity 0). Matches NODEISO_LOCAL_POD in bpf/coordino.h.
const LocalPod = identity.Any

// Rules is the compiled node isolation of a node.
type Rules struct {
	// PodToHost and NodeToNode say which directions some policy isolates.
	PodToHost  bool
	NodeToNode bool
	// Keys are the allowed entries of both directions: local LocalPod,
	// remote Host or RemoteNode, egress for pod -> host; local Host, remote
	// RemoteNode, ingress for node -> node; the tunnel ports' first.
	Keys []policy.Key
}

// Isolated reports whether any direction is isolated.
func (r Rules) Isolated() bool { return r.PodToHost || r.NodeToNode }

// Compile merges policies: a direction is isolated when one of them
// isolates it, and allowed ports are the union of all rules. tunnelPorts
// are UDP ports nodes always accept from each other (WireGuard, VXLAN): node
// isolation must never cut the pod network. Invalid policies are skipped
// and reported in the error; the others still apply.
func Compile(pols []*coordinov1alpha1.NodeIsolationPolicy, tunnelPorts []uint16) (Rules, error) {
	var out Rules
	var rules []policy.Rule
	var errs []error
	for _, p := range pols {
		if err := Validate(p); err != nil {
			errs = append(errs, err)
			continue
		}
		podToHost, nodeToNode := types(&p.Spec)
		out.PodToHost = out.PodToHost || podToHost
		out.NodeToNode = out.NodeToNode || nodeToNode
		for _, r := range p.Spec.PodToHost {
			for _, remote := range scopeRemotes(r.Scope) {
				rules = append(rules, portRules(LocalPod, remote, policy.Egress, r)...)
			}
		}
		for _, r := range p.Spec.NodeToNode {
			rules = append(rules, portRules(identity.Host, identity.RemoteNode, policy.Ingress, r)...)
		}
	}
	if out.NodeToNode {
		// First: a map too small for every key keeps them.
		var tunnel []policy.Rule
		for _, port := range tunnelPorts {
			tunnel = append(tunnel, policy.Rule{Local: identity.Host, Remote: identity.RemoteNode, Dir: policy.Ingress,
				Proto: policy.ProtoUDP, PortLo: port, PortHi: port})
		}
		rules = append(tunnel, rules...)
	}
	seen := map[policy.Key]bool{}
	for _, r := range rules {
		for _, k := range r.Keys() {
			if !seen[k] {
				seen[k] = true
				out.Keys = append(out.Keys, k)
			}
		}
	}
	return out, errors.Join(errs...)
}

// types returns the directions a spec isolates (see PolicyTypes).
func types(s *coordinov1alpha1.NodeIsolationPolicySpec) (podToHost, nodeToNode bool) {
	if len(s.PolicyTypes) == 0 {
		return true, len(s.NodeToNode) > 0
	}
	return slices.Contains(s.PolicyTypes, coordinov1alpha1.PolicyTypePodToHost),
		slices.Contains(s.PolicyTypes, coordinov1alpha1.PolicyTypeNodeToNode)
}

func scopeRemotes(scope string) []identity.ID {
	switch scope {
	case coordinov1alpha1.ScopeOwnNode:
		return []identity.ID{identity.Host}
	case coordinov1alpha1.ScopeOtherNodes:
		return []identity.ID{identity.RemoteNode}
	}
	return []identity.ID{identity.Host, identity.RemoteNode}
}

// portRules turns one validated HostPortRule into policy rules.
func portRules(local, remote identity.ID, dir policy.Direction, r coordinov1alpha1.HostPortRule) []policy.Rule {
	base := policy.Rule{Local: local, Remote: remote, Dir: dir, PortLo: 0, PortHi: 65535}
	if r.Protocol == "ICMP" {
		v4, v6 := base, base
		v4.Proto, v6.Proto = policy.ProtoICMP, protoICMPv6
		return []policy.Rule{v4, v6}
	}
	base.Proto = protocols[r.Protocol]
	if r.Port != 0 {
		base.PortLo, base.PortHi = uint16(r.Port), uint16(r.Port)
		if r.EndPort != 0 {
			base.PortHi = uint16(r.EndPort)
		}
	}
	return []policy.Rule{base}
}

// protoICMPv6 is IPPROTO_ICMPV6.
const protoICMPv6 = 58

var protocols = map[string]uint8{"TCP": policy.ProtoTCP, "UDP": policy.ProtoUDP, "SCTP": policy.ProtoSCTP}

// Validate checks what the CRD schema checks (the standalone directory has
// no API server to do it), naming the offending field.
func Validate(p *coordinov1alpha1.NodeIsolationPolicy) error {
	if p.Name == "" {
		return fmt.Errorf("NodeIsolationPolicy: metadata.name is required")
	}
	if p.Namespace != "" {
		return fmt.Errorf("NodeIsolationPolicy %s: metadata.namespace must be empty (cluster-scoped)", p.Name)
	}
	for i, t := range p.Spec.PolicyTypes {
		if t != coordinov1alpha1.PolicyTypePodToHost && t != coordinov1alpha1.PolicyTypeNodeToNode {
			return fmt.Errorf("NodeIsolationPolicy %s: spec.policyTypes[%d]: %q is not PodToHost or NodeToNode", p.Name, i, t)
		}
	}
	for _, f := range []struct {
		field string
		rules []coordinov1alpha1.HostPortRule
	}{{"podToHost", p.Spec.PodToHost}, {"nodeToNode", p.Spec.NodeToNode}} {
		field := f.field
		for i, r := range f.rules {
			if err := validateRule(r); err != nil {
				return fmt.Errorf("NodeIsolationPolicy %s: spec.%s[%d].%w", p.Name, field, i, err)
			}
		}
	}
	return nil
}

func validateRule(r coordinov1alpha1.HostPortRule) error {
	switch r.Protocol {
	case "TCP", "UDP", "SCTP":
	case "ICMP":
		if r.Port != 0 || r.EndPort != 0 {
			return fmt.Errorf("port: ICMP takes no port")
		}
	default:
		return fmt.Errorf("protocol: %q is not TCP, UDP, SCTP or ICMP", r.Protocol)
	}
	switch r.Scope {
	case "", coordinov1alpha1.ScopeOwnNode, coordinov1alpha1.ScopeOtherNodes, coordinov1alpha1.ScopeAllNodes:
	default:
		return fmt.Errorf("scope: %q is not OwnNode, OtherNodes or AllNodes", r.Scope)
	}
	if r.Port < 0 || r.Port > 65535 {
		return fmt.Errorf("port: %d is outside 1-65535", r.Port)
	}
	if r.EndPort != 0 {
		if r.Port == 0 {
			return fmt.Errorf("endPort: needs port")
		}
		if r.EndPort < r.Port || r.EndPort > 65535 {
			return fmt.Errorf("endPort: %d must be between port %d and 65535", r.EndPort, r.Port)
		}
	}
	return nil
}
