// Package datapath loads Coordino's eBPF programs, keeps their maps pinned
// under the BPF directory and attaches them to the host side of every
// endpoint (tcx links, or clsact + cls_bpf where tcx is missing). It owns the
// translation of identities and compiled policy into map entries, and adopts
// all pinned state when the daemon restarts, so enforcement has no gap.
//
// Datapath is a front: it holds the lock, the policy engine and the
// addresses the engine does not know, and hands each call to the parts that
// own the maps and their state. No part touches another's fields; what one
// needs of another it gets through methods, or as arguments:
//
//	endpoints      the endpoint table: records, source addresses, pods' named
//	               ports; the order of an attach, failed attach and removal
//	mapWriter      policy, ipcache, endpoints and config maps: their mirror,
//	               what is pending, the fail-closed flush (sync.go)
//	mapHealth      refused writes of every map: counts, episodes (capacity.go)
//	retrier        the backoff of writes that failed
//	attacher       endpoint and device hooks and their pins; ifindex→key
//	hostRouting    host routing and the eBPF tunnel's maps (hostroute.go)
//	nodeIsolation  NodeIsolationPolicy's map and flags (nodeiso.go)
//	services       the post-DNAT stage and Service CIDRs (service.go)
//	conntrack      the conntrack table: counts, walks, purges (ctpurge.go)
//	remoteAddrs    other nodes' pods, by address (remote.go)
package datapath
