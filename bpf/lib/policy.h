/* Policy: endpoints, the ipcache (address -> identity), the policy table
 * and the decision for a new flow. */
#pragma once

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "../coordino.h"
#include "parse.h"
#include "nodeiso.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, struct endpoint_info);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cdo_endpoints SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 1 << 18);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct ipcache_key);
	__type(value, struct ipcache_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cdo_ipcache SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 1 << 20);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct policy_key);
	__type(value, struct policy_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cdo_policy SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cdo_config SEC(".maps");

#define EP_ISOLATED (EP_INGRESS_ISOLATED | EP_EGRESS_ISOLATED)

static __always_inline __u32 isolation_flag(__u8 dir)
{
	return dir == DIR_INGRESS ? EP_INGRESS_ISOLATED : EP_EGRESS_ISOLATED;
}

/* addr_key fills an LPM key (ipcache layout) for one address. */
static __always_inline void addr_key(struct ipcache_key *k, __u8 family, const __u8 *addr)
{
	k->family = family;
	if (family == 4) {
		k->prefixlen = 32 + 32;
		__builtin_memcpy(k->addr, addr, 4);
	} else {
		k->prefixlen = 32 + 128;
		__builtin_memcpy(k->addr, addr, 16);
	}
}

static __always_inline struct ipcache_value lookup_identity(__u8 family, const __u8 *addr)
{
	struct ipcache_value world = {.identity = ID_WORLD, .cidr_identity = ID_WORLD};
	struct ipcache_key k = {};
	addr_key(&k, family, addr);
	struct ipcache_value *v = bpf_map_lookup_elem(&cdo_ipcache, &k);
	return v ? *v : world;
}

/* remote_of returns the identity of p's peer: the side that is not the
 * endpoint, for a packet seen in direction dir. */
static __always_inline struct ipcache_value remote_of(const struct packet *p, __u8 dir)
{
	return lookup_identity(p->family, dir == DIR_EGRESS ? p->dst : p->src);
}

static __always_inline int policy_allows(__u32 local, const struct ipcache_value *remote,
					 __u8 dir, __u8 proto, __be16 port)
{
	struct policy_key k = {
		.prefixlen = POLICY_PREFIX_FULL,
		.local_id = local,
		.remote_id = remote->identity,
		.dir = dir,
		.proto = proto,
		.port = port,
	};
	if (bpf_map_lookup_elem(&cdo_policy, &k))
		return 1;
	if (remote->cidr_identity != remote->identity) {
		k.remote_id = remote->cidr_identity;
		if (bpf_map_lookup_elem(&cdo_policy, &k))
			return 1;
	}
	k.remote_id = ID_ANY;
	return bpf_map_lookup_elem(&cdo_policy, &k) != NULL;
}

/* decide returns the verdict reason for a new flow in direction dir to
 * destination port dport. */
static __always_inline __u32 decide(const struct endpoint_info *ep, __u8 dir,
				    const struct ipcache_value *remote, __u8 proto, __be16 dport)
{
	/* Kubelet probes and other traffic from this node are always allowed. */
	if (dir == DIR_INGRESS && remote->identity == ID_HOST)
		return REASON_HOST;
	__u32 node_verdict = nodeiso_pod_verdict(dir, remote->identity, proto, dport);
	if (node_verdict)
		return node_verdict;
	if (!(ep->flags & isolation_flag(dir)))
		return REASON_NOT_ISOLATED;
	if (!is_port_proto(proto))
		dport = 0;
	if (policy_allows(ep->identity, remote, dir, proto, dport))
		return REASON_POLICY;
	return REASON_POLICY_DENIED;
}

static __always_inline int allowed(__u32 reason)
{
	return reason < REASON_FIRST_DROP;
}
