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

/* Any direction whose verdicts depend on policy state. */
#define EP_ISOLATED (EP_INGRESS_ISOLATED | EP_EGRESS_ISOLATED | EP_INGRESS_TIERED | EP_EGRESS_TIERED)

/* isolation_flag: the flags under which new flows of dir consult policy
 * (a NetworkPolicy isolates dir, or a ClusterNetworkPolicy has dir rules). */
static __always_inline __u32 isolation_flag(__u8 dir)
{
	return dir == DIR_INGRESS ? EP_INGRESS_ISOLATED | EP_INGRESS_TIERED : EP_EGRESS_ENFORCED;
}

static __always_inline __u32 np_isolation_flag(__u8 dir)
{
	return dir == DIR_INGRESS ? EP_INGRESS_ISOLATED : EP_EGRESS_ISOLATED;
}

static __always_inline __u32 tiered_flag(__u8 dir)
{
	return dir == DIR_INGRESS ? EP_INGRESS_TIERED : EP_EGRESS_TIERED;
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

/* tier_order orders a value's tier rule: 0 none, else lower decides
 * first: by rank, and at one rank Deny, then Pass, then Accept. */
static __always_inline __u32 tier_order(__u32 flags)
{
	__u32 code = (flags >> POLICY_ACTION_SHIFT) & 3;
	if (!code)
		return 0;
	__u32 rank = (flags >> POLICY_RANK_SHIFT) & 0x7fff;
	__u32 after = code == POLICY_DENY ? 0 : code == POLICY_PASS ? 1 : 2;
	return ((rank << 2) | after) + 1;
}

/* tier_action is the POLICY_* action of a tier_order. */
static __always_inline __u32 tier_action(__u32 order)
{
	__u32 after = (order - 1) & 3;
	return after == 0 ? POLICY_DENY : after == 1 ? POLICY_PASS : POLICY_ACCEPT;
}

struct tier_fold {
	__u32 allow; /* a NetworkPolicy allow matched */
	__u32 best;  /* tier_order of the deciding tier rule, 0: none */
};

static __always_inline void fold_lookup(struct policy_key *k, struct tier_fold *f)
{
	struct policy_value *v = bpf_map_lookup_elem(&cdo_policy, k);
	if (!v)
		return;
	if (!(v->flags & POLICY_NO_ALLOW))
		f->allow = 1;
	__u32 o = tier_order(v->flags);
	if (o && (!f->best || o < f->best))
		f->best = o;
}

/* policy_fold looks the flow up under its remote identity, its CIDR
 * identity and any remote in key direction dir, and folds the values. */
static __always_inline struct tier_fold policy_fold(__u32 local, const struct ipcache_value *remote,
						    __u8 dir, __u8 proto, __be16 port)
{
	struct tier_fold f = {};
	struct policy_key k = {
		.prefixlen = POLICY_PREFIX_FULL,
		.local_id = local,
		.remote_id = remote->identity,
		.dir = dir,
		.proto = proto,
		.port = port,
	};
	fold_lookup(&k, &f);
	if (remote->cidr_identity != remote->identity) {
		k.remote_id = remote->cidr_identity;
		fold_lookup(&k, &f);
	}
	k.remote_id = ID_ANY;
	fold_lookup(&k, &f);
	return f;
}

/* Whether the programs decide the ClusterNetworkPolicy tiers, set by the
 * loader (daemon/datapath). The objects built with CDO_NO_TIERS hold no
 * tiered code at all: for kernels before 6.4 a program with a subprogram
 * loses the verifier's precision tracking, and 6.1 refuses the programs at
 * its million instructions even with the call pruned as dead code. The
 * daemon then leaves cluster policies out of the maps (their entries would
 * read as allows on the untiered path). */
volatile const __u8 cdo_have_tiers = 0;

#ifndef CDO_NO_TIERS
/* tiered_decide is decide for an endpoint some ClusterNetworkPolicy has
 * rules for in dir: the Admin tier's deciding rule (Accept and Deny are
 * final, Pass goes on), then NetworkPolicy if it isolates dir, then the
 * Baseline tier, then allow. A global function: the verifier checks it
 * once, not at each of decide's inlined call sites (six lookups each would
 * exceed its budget). Five scalars at most: dir, proto and port travel
 * packed in dpp (dir << 24 | proto << 16 | port in network order). */
__attribute__((noinline)) __u32 cdo_tiered_decide(__u32 local, __u32 ep_flags, __u32 remote_id,
						 __u32 cidr_id, __u32 dpp)
{
	struct ipcache_value remote = {.identity = remote_id, .cidr_identity = cidr_id};
	__u8 dir = dpp >> 24;
	__u8 proto = dpp >> 16;
	__be16 dport = dpp & 0xffff;
	if (dir > DIR_EGRESS)
		return REASON_POLICY_DENIED;
	struct tier_fold f = policy_fold(local, &remote, dir, proto, dport);
	if (f.best) {
		__u32 a = tier_action(f.best);
		if (a == POLICY_DENY)
			return REASON_ADMIN_DENY;
		if (a == POLICY_ACCEPT)
			return REASON_POLICY;
	}
	if (ep_flags & np_isolation_flag(dir))
		return f.allow ? REASON_POLICY : REASON_POLICY_DENIED;
	f = policy_fold(local, &remote, dir | DIR_BASELINE, proto, dport);
	if (f.best) {
		__u32 a = tier_action(f.best);
		if (a == POLICY_DENY)
			return REASON_BASELINE_DENY;
		if (a == POLICY_ACCEPT)
			return REASON_POLICY;
	}
	return REASON_NOT_ISOLATED;
}

#endif

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
#ifndef CDO_NO_TIERS
	if (cdo_have_tiers && (ep->flags & tiered_flag(dir)))
		return cdo_tiered_decide(ep->identity, ep->flags, remote->identity, remote->cidr_identity,
					 (__u32)dir << 24 | (__u32)proto << 16 | dport);
#endif
	if (policy_allows(ep->identity, remote, dir, proto, dport))
		return REASON_POLICY;
	return REASON_POLICY_DENIED;
}

static __always_inline int allowed(__u32 reason)
{
	return reason < REASON_FIRST_DROP;
}
