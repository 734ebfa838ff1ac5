/* Services: policy on the destination kube-proxy translated to.
 *
 * kube-proxy (iptables or nftables) rewrites a Service address to a backend
 * in netfilter PREROUTING, after the tc hook on the client's host interface
 * has seen the packet. So for an egress-isolated pod the tc hook does not
 * decide a new flow to a Service CIDR: it tracks it as CT_SERVICE |
 * CT_SVC_PENDING under the tuple it sees (the Service's, which is also what
 * replies carry once the kernel un-NATs them) and lets it pass; the
 * netfilter program (coordino_svc.c) right after DNAT decides on the
 * translated destination and clears the mark or drops the packet. Kernels
 * without BPF netfilter links get the same decision from an nftables chain
 * at the same place (CFG_SERVICE_MATCH, coordino_svcmatch.c). Without
 * either (CFG_SERVICE_HOOK clear) such flows are dropped: fail closed. */
#pragma once

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "../coordino.h"
#include "parse.h"
#include "policy.h"
#include "conntrack.h"

/* svc_cidrs: LPM trie of the cluster's Service CIDRs (same key as the
 * ipcache), written by the daemon from --service-cidrs. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 64);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct ipcache_key);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cdo_svc_cidrs SEC(".maps");

/* svc_nodeports: this node's own addresses on the Services' NodePort
 * ports, which kube-proxy translates in PREROUTING as it does ClusterIPs:
 * exact (address, protocol, port) keys, written by the daemon from the
 * API (Services' nodePorts, the Node's addresses), so a node address on
 * any other port is judged on the address, as before. The value is unused. */
struct svc_nodeport_key {
	__u8 family;
	__u8 proto;
	__be16 port;
	__u8 addr[16]; /* IPv4 in the first 4 bytes, the rest zero */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct svc_nodeport_key);
	__type(value, __u8);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cdo_svc_nodeports SEC(".maps");

/* svc_pending: the endpoint (host ifindex) of each deferred packet's flow,
 * keyed by its tuple as the client sent it (ct_key with ifindex 0). The
 * netfilter program finds the endpoint by the packet's input device, which
 * is the pod's host veth in routed setups; where the veth is a bridge port
 * (chained after a bridge CNI) the input device is the bridge, and this map
 * names the endpoint instead. A pod can fill it with frames that never
 * reach PREROUTING (another host's MAC, say), and a full LRU map may hand
 * a fresh entry to another CPU's insert before the netfilter program reads
 * it: so a failed write drops the packet, this CPU's slot (cdo_svc_last)
 * names the endpoint first, and a packet neither names is decided by its
 * input device where that is a pod's veth (coordino_svc.c). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct ct_key);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cdo_svc_pending SEC(".maps");

/* svc_last: per CPU, the flow and endpoint of the last packet the tc
 * program deferred. A packet's tc ingress and its PREROUTING run in one
 * softirq on one CPU (a bridge passes a frame up at once unless RPS is set
 * on the bridge), so the netfilter program finds the owner here without
 * trusting cdo_svc_pending, which a full LRU map can lose: this slot cannot
 * be evicted, only overwritten by the next deferred packet on this CPU. */
struct svc_slot {
	struct ct_key key;
	__u32 ifindex;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct svc_slot);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cdo_svc_last SEC(".maps");

/* svc_pending_key is the flow's key in cdo_svc_pending. */
static __always_inline void svc_pending_key(struct ct_key *k, const struct packet *p)
{
	tuple_key(k, 0, DIR_EGRESS, p, 0);
}

/* svc_remember records in this CPU's slot that the endpoint on ifindex
 * deferred the flow of key k. */
static __always_inline void svc_remember(const struct ct_key *k, __u32 ifindex)
{
	__u32 zero = 0;
	struct svc_slot *s = bpf_map_lookup_elem(&cdo_svc_last, &zero);
	if (s) {
		s->key = *k;
		s->ifindex = ifindex;
	}
}

/* svc_recall takes the endpoint this CPU's slot names for k, or 0. Taken,
 * so that a later packet of the tuple never finds an endpoint that has
 * since gone (its interface index reused): each deferred one writes it. */
static __always_inline __u32 svc_recall(const struct ct_key *k)
{
	__u32 zero = 0;
	struct svc_slot *s = bpf_map_lookup_elem(&cdo_svc_last, &zero);
	if (!s)
		return 0;
	const __u32 *a = (const __u32 *)&s->key, *b = (const __u32 *)k;
#pragma unroll
	for (int i = 0; i < sizeof(*k) / 4; i++)
		if (a[i] != b[i])
			return 0;
	__u32 ifindex = s->ifindex;
	s->ifindex = 0;
	return ifindex;
}

/* svc_address reports whether addr lies in a Service CIDR. */
static __always_inline int svc_address(__u8 family, const __u8 *addr)
{
	struct ipcache_key k = {};
	addr_key(&k, family, addr);
	return bpf_map_lookup_elem(&cdo_svc_cidrs, &k) != NULL;
}

/* svc_target reports whether a flow to dst:dport (proto) is one kube-proxy
 * may translate: dst in a Service CIDR, or a node address on a NodePort.
 * dst is 16 bytes, IPv4 zero-padded. */
static __always_inline int svc_target(__u8 family, __u8 proto, const __u8 *dst, __be16 dport)
{
	if (svc_address(family, dst))
		return 1;
	struct svc_nodeport_key k = {.family = family, .proto = proto, .port = dport};
	__builtin_memcpy(k.addr, dst, 16);
	return bpf_map_lookup_elem(&cdo_svc_nodeports, &k) != NULL;
}

static __always_inline int svc_hook_active(const struct config *cfg)
{
	return cfg && (cfg->flags & CFG_SERVICE_HOOK);
}

/* svc_match_mode: the post-DNAT decision is nftables' (CFG_SERVICE_MATCH). */
static __always_inline int svc_match_mode(const struct config *cfg)
{
	return cfg && (cfg->flags & CFG_SERVICE_MATCH);
}

/* svc_source_key is a deferred flow's key in cdo_svc_pending under
 * CFG_SERVICE_MATCH: its source alone (destination zero), since the match
 * program sees only the translated destination. A pod's addresses and
 * ports are its own (anti-spoofing ran first), so only a pod's own flows
 * share a key, and they share its endpoint. */
static __always_inline void svc_source_key(struct ct_key *k, const struct packet *p)
{
	struct packet q = *p;
	__builtin_memset(q.dst, 0, sizeof(q.dst));
	q.dport = 0;
	tuple_key(k, 0, DIR_EGRESS, &q, 0);
}

/* svc_deferred reports whether a new flow of an endpoint's egress is decided
 * after DNAT: the endpoint is egress-isolated and p goes to a Service CIDR
 * or a NodePort with a protocol kube-proxy translates. */
static __always_inline int svc_deferred(const struct endpoint_info *ep, const struct packet *p)
{
	if (!(ep->flags & EP_EGRESS_ENFORCED) || !is_port_proto(p->proto) || p->icmp_error)
		return 0;
	return svc_target(p->family, p->proto, p->dst, p->dport);
}
