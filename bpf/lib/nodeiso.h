/* Node isolation (NodeIsolationPolicy): which host ports pods may open on
 * their own node and on other nodes, and which ports nodes may open on each
 * other. Two hooks enforce it:
 *  - pod -> host: decide() on the pod's host veth (cdo_from_ep) asks
 *    nodeiso_pod_verdict for new flows towards the host identity (this node)
 *    or the remote-node identity (other nodes' addresses, from the peers);
 *  - node -> node: cdo_from_node on the ingress of the node's underlay
 *    interface (and of the WireGuard device when node traffic is encrypted)
 *    judges new flows from a remote node to this node; cdo_to_node on the
 *    underlay's egress remembers UDP/SCTP flows this node opened towards other
 *    nodes, so their replies pass.
 * Nothing is isolated until the daemon sets a NODEISO_* flag: without a
 * NodeIsolationPolicy the datapath behaves as before. Node -> own pod
 * (kubelet probes) is never judged here. */
#pragma once

#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>

#include "../coordino.h"
#include "parse.h"

/* Allowed (scope, protocol, port) entries, keyed like the policy map:
 * local_id NODEISO_LOCAL_POD with remote ID_HOST or ID_REMOTE_NODE and
 * DIR_EGRESS for pod -> host; local_id ID_HOST with remote ID_REMOTE_NODE
 * and DIR_INGRESS for node -> node. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 4096);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct policy_key);
	__type(value, struct policy_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cdo_nodeiso SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct nodeiso_config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cdo_nodeiso_cfg SEC(".maps");

static __always_inline __u32 nodeiso_flags(void)
{
	__u32 zero = 0;
	struct nodeiso_config *c = bpf_map_lookup_elem(&cdo_nodeiso_cfg, &zero);
	return c ? c->flags : 0;
}

static __always_inline int nodeiso_allows(__u32 local, __u32 remote, __u8 dir, __u8 proto,
					  __be16 port)
{
	if (!is_port_proto(proto))
		port = 0;
	struct policy_key k = {
		.prefixlen = POLICY_PREFIX_FULL,
		.local_id = local,
		.remote_id = remote,
		.dir = dir,
		.proto = proto,
		.port = port,
	};
	return bpf_map_lookup_elem(&cdo_nodeiso, &k) != NULL;
}

/* nodeiso_pod_verdict judges a new flow a pod opens (dir DIR_EGRESS)
 * towards a node address: 0 when node isolation has no say, else
 * REASON_NODE_ISOLATED or 0 when a rule allows it. */
static __always_inline __u32 nodeiso_pod_verdict(__u8 dir, __u32 remote, __u8 proto, __be16 dport)
{
	if (dir != DIR_EGRESS || (remote != ID_HOST && remote != ID_REMOTE_NODE))
		return 0;
	if (!(nodeiso_flags() & NODEISO_POD_TO_HOST))
		return 0;
	if (nodeiso_allows(NODEISO_LOCAL_POD, remote, DIR_EGRESS, proto, dport))
		return 0;
	return REASON_NODE_ISOLATED;
}

/* nodeiso_pods_isolated: pod -> host isolation is on, so even flows of
 * endpoints without NetworkPolicy need a decision. */
static __always_inline int nodeiso_pods_isolated(void)
{
	return nodeiso_flags() & NODEISO_POD_TO_HOST;
}

/* nodeiso_new_node_flow reports whether p (from a remote node) may open a
 * flow, or is part of one that exists: TCP segments other than a bare SYN
 * belong to a connection (the host's stack answers a stray one with a
 * reset), ICMP other than echo requests is a reply or an error. */
static __always_inline int nodeiso_opens_flow(const struct packet *p)
{
	switch (p->proto) {
	case IPPROTO_TCP:
		return (p->tcp_flags & (TCP_SYN | TCP_ACK)) == TCP_SYN;
	case IPPROTO_ICMP:
		return p->icmp_type == 8; /* echo request */
	case IPPROTO_ICMPV6:
		return p->icmp_type == 128; /* echo request */
	}
	return 1;
}
