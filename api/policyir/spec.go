package policyir

import (
	"fmt"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
)

// FromSpec turns a PolicyIR spec into the Policy the daemon's engine
// consumes. The spec comes from the API server, so it is checked again
// (the CRD schema cannot check selectors, CIDRs or port order); the error
// names the object and the first bad field.
func FromSpec(namespace, name string, spec *coordinov1alpha1.PolicyIRSpec) (*Policy, error) {
	p := &Policy{Namespace: namespace, Name: name, Warnings: spec.Warnings}
	fail := func(err error) (*Policy, error) {
		return nil, fmt.Errorf("policyir %s/%s: %w", namespace, name, err)
	}
	var err error
	if p.PodSelector, err = metav1.LabelSelectorAsSelector(&spec.PodSelector); err != nil {
		return fail(fieldErr("spec.podSelector", "%v", err))
	}
	for i, t := range spec.PolicyTypes {
		switch t {
		case "Ingress":
			p.IsolatesIngress = true
		case "Egress":
			p.IsolatesEgress = true
		default:
			return fail(fieldErr(fmt.Sprintf("spec.policyTypes[%d]", i), "unsupported value %q: must be Ingress or Egress", t))
		}
	}
	for i, r := range spec.Rules {
		rule, err := ruleFromSpec(fmt.Sprintf("spec.rules[%d]", i), r)
		if err != nil {
			return fail(err)
		}
		// A rule of a direction the policy does not isolate allows nothing
		// more than no isolation does; drop it as Compile never emits it.
		if (rule.Direction == Ingress && p.IsolatesIngress) || (rule.Direction == Egress && p.IsolatesEgress) {
			p.Rules = append(p.Rules, rule)
		}
	}
	return p, nil
}

func ruleFromSpec(field string, r coordinov1alpha1.PolicyRule) (Rule, error) {
	var out Rule
	switch r.Direction {
	case "Ingress":
		out.Direction = Ingress
	case "Egress":
		out.Direction = Egress
	default:
		return out, fieldErr(field+".direction", "unsupported value %q: must be Ingress or Egress", r.Direction)
	}
	for i, peer := range r.Peers {
		p, err := peerFromSpec(fmt.Sprintf("%s.peers[%d]", field, i), peer)
		if err != nil {
			return out, err
		}
		out.Peers = append(out.Peers, p)
	}
	for i, pr := range r.Ports {
		f := fmt.Sprintf("%s.ports[%d]", field, i)
		if err := specProtocol(f, pr.Protocol); err != nil {
			return out, err
		}
		if pr.First < 0 || pr.Last > 65535 || pr.First > pr.Last {
			return out, fieldErr(f, "range %d-%d is not within 0-65535 in order", pr.First, pr.Last)
		}
		out.Ports = append(out.Ports, PortRange{Protocol: uint8(pr.Protocol), First: uint16(pr.First), Last: uint16(pr.Last)})
	}
	for i, np := range r.NamedPorts {
		f := fmt.Sprintf("%s.namedPorts[%d]", field, i)
		if err := specProtocol(f, np.Protocol); err != nil {
			return out, err
		}
		if err := validPortName(np.Name); err != nil {
			return out, fieldErr(f+".name", "%v", err)
		}
		out.NamedPorts = append(out.NamedPorts, NamedPort{Protocol: uint8(np.Protocol), Name: np.Name})
	}
	out.NoPorts = r.NoPorts
	if out.NoPorts {
		out.Ports, out.NamedPorts = nil, nil
	}
	return out, nil
}

func specProtocol(field string, p int32) error {
	switch p {
	case int32(ProtoAny), int32(ProtoTCP), int32(ProtoUDP), int32(ProtoSCTP):
		return nil
	}
	return fieldErr(field+".protocol", "unsupported protocol %d", p)
}

func peerFromSpec(field string, peer coordinov1alpha1.PolicyPeer) (Peer, error) {
	if b := peer.IPBlock; b != nil {
		if peer.PodSelector != nil || peer.NamespaceSelector != nil {
			return Peer{}, fieldErr(field, "ipBlock excludes selectors")
		}
		block, err := blockFromSpec(field+".ipBlock", b)
		return Peer{Block: block}, err
	}
	if peer.PodSelector == nil {
		return Peer{}, fieldErr(field+".podSelector", "required without ipBlock")
	}
	var out Peer
	var err error
	if out.PodSelector, err = metav1.LabelSelectorAsSelector(peer.PodSelector); err != nil {
		return out, fieldErr(field+".podSelector", "%v", err)
	}
	if peer.NamespaceSelector != nil {
		if out.NamespaceSelector, err = metav1.LabelSelectorAsSelector(peer.NamespaceSelector); err != nil {
			return out, fieldErr(field+".namespaceSelector", "%v", err)
		}
	}
	return out, nil
}

func blockFromSpec(field string, b *coordinov1alpha1.PolicyIPBlock) (*IPBlock, error) {
	cidr, err := parseCIDR(b.CIDR)
	if err != nil {
		return nil, fieldErr(field+".cidr", "%v", err)
	}
	out := &IPBlock{CIDR: cidr}
	for i, e := range b.Except {
		ex, err := parseCIDR(e)
		f := fmt.Sprintf("%s.except[%d]", field, i)
		if err != nil {
			return nil, fieldErr(f, "%v", err)
		}
		if !Within(ex, cidr) || ex.Bits() == cidr.Bits() {
			return nil, fieldErr(f, "%s must be strictly within cidr %s", e, b.CIDR)
		}
		out.Except = append(out.Except, ex)
	}
	return out, nil
}

// FromObject is FromSpec for a PolicyIR object: one the controller marked
// not Valid is refused with the controller's message.
func FromObject(obj *coordinov1alpha1.PolicyIR) (*Policy, error) {
	if c := apimeta.FindStatusCondition(obj.Status.Conditions, coordinov1alpha1.ConditionValid); c != nil && c.Status == metav1.ConditionFalse {
		return nil, fmt.Errorf("policyir %s/%s: not valid: %s", obj.Namespace, obj.Name, c.Message)
	}
	return FromSpec(obj.Namespace, obj.Name, &obj.Spec)
}
