package policyir

import (
	"fmt"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
)

// FieldError is a validation error naming the offending field.
type FieldError struct {
	Field  string
	Detail string
}

// Error renders "field: detail".
func (e *FieldError) Error() string { return e.Field + ": " + e.Detail }

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Detail: fmt.Sprintf(format, args...)}
}

// ValidateNamespace checks a Namespace object.
func ValidateNamespace(ns *corev1.Namespace) error {
	if ns.Name == "" {
		return fieldErr("metadata.name", "required")
	}
	return nil
}

// ValidateNode checks a Node document of the standalone policy directory:
// a name, and addresses a nodes peer can match. The error names the field.
func ValidateNode(n *corev1.Node) error {
	if n.Name == "" {
		return fieldErr("metadata.name", "required")
	}
	for i, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
			continue
		}
		if _, err := netip.ParseAddr(a.Address); err != nil {
			return fieldErr(fmt.Sprintf("status.addresses[%d].address", i), "%q is not an IP address", a.Address)
		}
	}
	return nil
}

// ValidateNetworkPolicy checks np the way the API server would for the parts
// Coordino relies on; the error names the first bad field.
func ValidateNetworkPolicy(np *networkingv1.NetworkPolicy) error {
	if np.Name == "" {
		return fieldErr("metadata.name", "required")
	}
	if _, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector); err != nil {
		return fieldErr("spec.podSelector", "%v", err)
	}
	for i, t := range np.Spec.PolicyTypes {
		if t != networkingv1.PolicyTypeIngress && t != networkingv1.PolicyTypeEgress {
			return fieldErr(fmt.Sprintf("spec.policyTypes[%d]", i), "unsupported value %q: must be Ingress or Egress", t)
		}
	}
	for i, r := range np.Spec.Ingress {
		f := fmt.Sprintf("spec.ingress[%d]", i)
		if err := validatePeers(f+".from", r.From); err != nil {
			return err
		}
		if err := validatePorts(f+".ports", r.Ports); err != nil {
			return err
		}
	}
	for i, r := range np.Spec.Egress {
		f := fmt.Sprintf("spec.egress[%d]", i)
		if err := validatePeers(f+".to", r.To); err != nil {
			return err
		}
		if err := validatePorts(f+".ports", r.Ports); err != nil {
			return err
		}
	}
	return nil
}

func validatePeers(field string, peers []networkingv1.NetworkPolicyPeer) error {
	for i, p := range peers {
		f := fmt.Sprintf("%s[%d]", field, i)
		if p.IPBlock != nil {
			if p.PodSelector != nil || p.NamespaceSelector != nil {
				return fieldErr(f, "ipBlock cannot be combined with podSelector or namespaceSelector")
			}
			if err := validateIPBlock(f+".ipBlock", p.IPBlock); err != nil {
				return err
			}
			continue
		}
		if p.PodSelector == nil && p.NamespaceSelector == nil {
			return fieldErr(f, "must specify podSelector, namespaceSelector or ipBlock")
		}
		if p.PodSelector != nil {
			if _, err := metav1.LabelSelectorAsSelector(p.PodSelector); err != nil {
				return fieldErr(f+".podSelector", "%v", err)
			}
		}
		if p.NamespaceSelector != nil {
			if _, err := metav1.LabelSelectorAsSelector(p.NamespaceSelector); err != nil {
				return fieldErr(f+".namespaceSelector", "%v", err)
			}
		}
	}
	return nil
}

func validateIPBlock(field string, b *networkingv1.IPBlock) error {
	_, err := blockFromSpec(field, &coordinov1alpha1.PolicyIPBlock{CIDR: b.CIDR, Except: b.Except})
	return err
}

// parseCIDR accepts a CIDR like the API server: host bits may be set.
func parseCIDR(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("invalid CIDR %q", s)
	}
	if p.Addr().Is4In6() {
		return netip.Prefix{}, fmt.Errorf("invalid CIDR %q: IPv4-mapped IPv6 is not allowed", s)
	}
	return p.Masked(), nil
}

func validatePorts(field string, ports []networkingv1.NetworkPolicyPort) error {
	for i, p := range ports {
		f := fmt.Sprintf("%s[%d]", field, i)
		if _, err := protoNumber(p.Protocol); err != nil {
			return fieldErr(f+".protocol", "%v", err)
		}
		if p.Port == nil {
			if p.EndPort != nil {
				return fieldErr(f+".endPort", "requires port")
			}
			continue
		}
		if p.Port.Type == intstr.String {
			if err := validPortName(p.Port.StrVal); err != nil {
				return fieldErr(f+".port", "%v", err)
			}
			if p.EndPort != nil {
				return fieldErr(f+".endPort", "requires a numeric port")
			}
			continue
		}
		if p.Port.IntVal < 1 || p.Port.IntVal > 65535 {
			return fieldErr(f+".port", "%d out of range 1-65535", p.Port.IntVal)
		}
		if p.EndPort != nil && (*p.EndPort < p.Port.IntVal || *p.EndPort > 65535) {
			return fieldErr(f+".endPort", "%d must be between port (%d) and 65535", *p.EndPort, p.Port.IntVal)
		}
	}
	return nil
}

// validPortName accepts what a container port's name may be (IANA service
// name syntax); no other name can match a container port.
func validPortName(name string) error {
	if errs := validation.IsValidPortName(name); len(errs) > 0 {
		return fmt.Errorf("port name %q: %s", name, strings.Join(errs, "; "))
	}
	return nil
}

func protoNumber(p *corev1.Protocol) (uint8, error) {
	if p == nil {
		return ProtoTCP, nil
	}
	switch *p {
	case corev1.ProtocolTCP:
		return ProtoTCP, nil
	case corev1.ProtocolUDP:
		return ProtoUDP, nil
	case corev1.ProtocolSCTP:
		return ProtoSCTP, nil
	}
	return 0, fmt.Errorf("unsupported protocol %q: must be TCP, UDP or SCTP", *p)
}
