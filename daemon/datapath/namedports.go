package datapath

import (
	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/policy"
)

// Named-port seam. Rules naming container ports resolve from the ports the
// pods declare (see daemon/policy/namedports.go). Two feeders:
//
//   - this node's pods: SetPodNamedPorts, keyed by "namespace/name" (in
//     Kubernetes mode the pod informer calls it); each endpoint of that pod
//     contributes the ports under its identity, whichever comes first, the
//     ports or the endpoint. Kept in the endpoint's record, so a restarted
//     daemon resolves them before its sources catch up.
//   - pods of other nodes: SetPeerNamedPorts with the pod's identity, keyed
//     by any string unique to that pod (e.g. "node/pod"); they only resolve
//     egress rules towards that identity.
//
// Each call costs the rules naming one of the ports involved, and writes
// only the resulting map differences.

// localPortsKey is the engine's key for endpoint r's ports.
func localPortsKey(r *record) string { return "local/" + r.Key }

// SetPodNamedPorts sets the named container ports of this node's pod
// ("namespace/name"); nil or empty forgets them.
func (d *Datapath) SetPodNamedPorts(pod string, ports []policy.NamedPort) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.eps.setPodPorts(pod, ports)
	return d.flush("apply named ports")
}

// SetPeerNamedPorts sets the named ports of a pod elsewhere holding
// identity id; key names that pod uniquely. Nil or empty forgets them.
func (d *Datapath) SetPeerNamedPorts(key string, id identity.ID, ports []policy.NamedPort) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(ports) == 0 {
		d.engine.RemoveNamedPorts("peer/" + key)
	} else {
		d.engine.SetNamedPorts(policy.PodPorts{Key: "peer/" + key, ID: id, Ports: ports})
	}
	return d.flush("apply named ports")
}

// feedNamedPorts tells the engine endpoint r's ports under its identity.
func feedNamedPorts(e *policy.Engine, r *record) {
	if len(r.NamedPorts) == 0 {
		e.RemoveNamedPorts(localPortsKey(r))
		return
	}
	e.SetNamedPorts(policy.PodPorts{Key: localPortsKey(r), ID: r.Identity, Local: true, Ports: r.NamedPorts})
}
