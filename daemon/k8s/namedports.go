package k8s

import (
	"cmp"
	"slices"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"

	"github.com/coordino/coordino/daemon/policy"
)

// podNamedPorts returns the named ports a pod declares, sorted: those of
// its containers and init containers (a restartable init container, a
// sidecar, serves like any other).
func podNamedPorts(p *corev1.Pod) []policy.NamedPort {
	var out []policy.NamedPort
	for _, cs := range [][]corev1.Container{p.Spec.InitContainers, p.Spec.Containers} {
		for _, c := range cs {
			for _, cp := range c.Ports {
				if cp.Name == "" || cp.ContainerPort < 1 || cp.ContainerPort > 65535 {
					continue
				}
				out = append(out, policy.NamedPort{Name: cp.Name, Protocol: protocolNumber(cp.Protocol), Port: uint16(cp.ContainerPort)})
			}
		}
	}
	return sortedPorts(out)
}

// protocolNumber is the policy engine's number of a Kubernetes protocol
// (TCP when unset, as the API defaults it).
func protocolNumber(p corev1.Protocol) uint8 {
	switch p {
	case corev1.ProtocolUDP:
		return policy.ProtoUDP
	case corev1.ProtocolSCTP:
		return policy.ProtoSCTP
	}
	return policy.ProtoTCP
}

// sortedPorts sorts ports and drops duplicates, so equal sets compare equal.
func sortedPorts(out []policy.NamedPort) []policy.NamedPort {
	slices.SortFunc(out, func(a, b policy.NamedPort) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.Port, b.Port))
	})
	return slices.Compact(out)
}

// applyNamedPorts gives the sink the named ports of this node's pods that
// changed since the last call (a pod's ports are immutable, so in practice
// pods that came or went).
func (s *Source) applyNamedPorts(v view, sink Sink) {
	want := v.namedPorts()
	for key, ports := range want {
		if slices.Equal(s.fedPorts[key], ports) {
			continue
		}
		if err := sink.SetPodNamedPorts(key, ports); err != nil {
			s.log.Error("giving the datapath a pod's named ports", zap.String("pod", key), zap.Error(err))
			continue
		}
		s.fedPorts[key] = ports
	}
	for key := range s.fedPorts {
		if _, ok := want[key]; ok {
			continue
		}
		if err := sink.SetPodNamedPorts(key, nil); err != nil {
			s.log.Error("withdrawing a pod's named ports from the datapath", zap.String("pod", key), zap.Error(err))
			continue
		}
		delete(s.fedPorts, key)
	}
}
