//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Coordino's post-DNAT program: a BPF_PROG_TYPE_NETFILTER program on
 * PREROUTING right after kube-proxy's DNAT (priority NF_IP_PRI_NAT_DST + 1),
 * for IPv4 and IPv6. It decides the flows the tc program deferred (lib/
 * service.h): Service traffic of egress-isolated pods, on the destination
 * kube-proxy chose. It is a separate object so that kernels without BPF
 * netfilter links still load the tc programs (and fail closed for Services).
 * Its maps are the tc object's, handed over by the loader. */
#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

/* Packets are read from a dynptr over the skb, whose data starts at the
 * network header in netfilter hooks. */
#define PARSE_CTX struct bpf_dynptr
#define parse_load(ctx, off, to, len) bpf_dynptr_read(to, len, ctx, off, 0)

#include "coordino.h"
#include "lib/parse.h"
#include "lib/policy.h"
#include "lib/conntrack.h"
#include "lib/events.h"
#include "lib/frag.h"
#include "lib/service.h"

char __license[] SEC("license") = "Dual BSD/GPL";

#define NF_DROP 0
#define NF_ACCEPT 1
#define NFPROTO_IPV4 2
#define IP_CT_IS_REPLY 3
#define NFCT_INFOMASK 7UL
#define IP_CT_DIR_ORIGINAL 0

/* Kernel types, only the fields read here; CO-RE relocates them against
 * the running kernel's BTF (the ___cdo suffix is ignored when matching). */
struct net_device___cdo {
	int ifindex;
} __attribute__((preserve_access_index));

struct nf_hook_state___cdo {
	__u8 pf;
	struct net_device___cdo *in;
} __attribute__((preserve_access_index));

struct sk_buff___cdo {
	unsigned int len;
	unsigned long _nfct;
} __attribute__((preserve_access_index));

struct bpf_nf_ctx___cdo {
	const struct nf_hook_state___cdo *state;
	struct sk_buff___cdo *skb;
} __attribute__((preserve_access_index));

union nf_inet_addr___cdo {
	__u32 all[4];
} __attribute__((preserve_access_index));

struct nf_conntrack_tuple___cdo {
	struct {
		union nf_inet_addr___cdo u3;
		union {
			__be16 all;
		} u;
		__u8 protonum;
	} dst;
} __attribute__((preserve_access_index));

struct nf_conntrack_tuple_hash___cdo {
	struct nf_conntrack_tuple___cdo tuple;
} __attribute__((preserve_access_index));

struct nf_conn___cdo {
	struct nf_conntrack_tuple_hash___cdo tuplehash[2];
} __attribute__((preserve_access_index));

extern int bpf_dynptr_from_skb(struct sk_buff___cdo *skb, __u64 flags,
			       struct bpf_dynptr *ptr__uninit) __ksym;

/* original_destination reads the destination the client addressed (the
 * Service's) from the packet's conntrack entry into orig; 0 when the packet
 * is not the original direction of its connection or not to a Service
 * (a Service CIDR or a NodePort). */
static __always_inline int original_destination(unsigned long nfct, __u8 family, struct packet *orig)
{
	if ((nfct & NFCT_INFOMASK) >= IP_CT_IS_REPLY)
		return 0;
	struct nf_conn___cdo *ct = (void *)(nfct & ~NFCT_INFOMASK);
	__u8 addr[16] = {};
	if (bpf_core_read(&orig->proto, sizeof(orig->proto), &ct->tuplehash[IP_CT_DIR_ORIGINAL].tuple.dst.protonum) ||
	    bpf_core_read(&orig->dport, sizeof(orig->dport), &ct->tuplehash[IP_CT_DIR_ORIGINAL].tuple.dst.u.all) ||
	    bpf_core_read(addr, sizeof(addr), &ct->tuplehash[IP_CT_DIR_ORIGINAL].tuple.dst.u3.all))
		return 0;
	if (family == 4)
		__builtin_memset(addr + 4, 0, 12);
	__builtin_memcpy(orig->dst, addr, 16);
	return is_port_proto(orig->proto) && svc_target(family, orig->proto, orig->dst, orig->dport);
}

/* cdo_svc decides a pending Service flow (see lib/service.h) on the
 * translated destination; every other packet passes untouched. */
SEC("netfilter")
int cdo_svc(struct bpf_nf_ctx___cdo *ctx)
{
	const struct nf_hook_state___cdo *state = ctx->state;
	struct sk_buff___cdo *skb = ctx->skb;
	/* From a pod's veth: only egress-isolated pods defer. From elsewhere
	 * (a bridge its veth is a port of): cdo_svc_pending names the pod.
	 * PREROUTING always has an input device; BPF_PROG_TEST_RUN leaves it
	 * unset, and index 0 is no endpoint's. */
	struct net_device___cdo *in = state->in;
	__u32 ifindex = in ? in->ifindex : 0;
	struct endpoint_info *ep = bpf_map_lookup_elem(&cdo_endpoints, &ifindex);
	if (ep && !(ep->flags & EP_EGRESS_ENFORCED))
		return NF_ACCEPT;

	/* Most packets are not to a Service: tell from the conntrack entry,
	 * before parsing. Without one nothing was translated. */
	__u8 family = state->pf == NFPROTO_IPV4 ? 4 : 6;
	struct packet orig = {};
	unsigned long nfct = skb->_nfct;
	if (nfct && !original_destination(nfct, family, &orig))
		return NF_ACCEPT;

	struct bpf_dynptr ptr;
	if (bpf_dynptr_from_skb(skb, 0, &ptr))
		return NF_ACCEPT;
	/* p is the translated packet; orig becomes what the tc program saw. */
	struct packet p = {};
	if (parse_ip(&ptr, 0, family, &p, 0) != PARSE_OK || !is_port_proto(p.proto) ||
	    p.frag == FRAG_LATER)
		return NF_ACCEPT;
	if (!nfct) {
		if (!svc_target(family, p.proto, p.dst, p.dport))
			return NF_ACCEPT;
		orig = p;
	} else {
		if (orig.proto != p.proto)
			return NF_ACCEPT;
		__u8 dst[16];
		__builtin_memcpy(dst, orig.dst, 16);
		__be16 dport = orig.dport;
		orig = p;
		__builtin_memcpy(orig.dst, dst, 16);
		orig.dport = dport;
	}
	/* This CPU's slot or the pending entry names the endpoint; from a
	 * pod's veth the input device already does. No map entry is proof the
	 * flow was decided: LRU maps a pod can fill may lose them between the
	 * tc program and here, so from a known egress-isolated endpoint a flow
	 * is decided now unless its conntrack entry says it was already. */
	struct ct_key pk;
	svc_pending_key(&pk, &orig);
	__u32 owner = svc_recall(&pk);
	__u32 *pending = bpf_map_lookup_elem(&cdo_svc_pending, &pk);
	if (pending) {
		if (!owner)
			owner = *pending;
		bpf_map_delete_elem(&cdo_svc_pending, &pk);
	}
	if (owner) {
		ifindex = owner;
		ep = bpf_map_lookup_elem(&cdo_endpoints, &ifindex);
	}
	if (!ep || !(ep->flags & EP_EGRESS_ENFORCED))
		return NF_ACCEPT; /* not from an egress-isolated endpoint */
	__u64 now = bpf_ktime_get_ns();
	struct ct_key k;
	__u8 origin;
	struct ct_entry *e = ct_lookup(ifindex, DIR_EGRESS, &orig, now, &k, &origin);
	if (e && (origin != DIR_EGRESS || !(e->flags & CT_SVC_PENDING)))
		return NF_ACCEPT; /* decided before: established or a reply */

	__u32 zero = 0;
	struct config *cfg = bpf_map_lookup_elem(&cdo_config, &zero);
	struct ipcache_value remote = remote_of(&p, DIR_EGRESS);
	__u32 reason = decide(ep, DIR_EGRESS, &remote, p.proto, p.dport);
	if (allowed(reason)) {
		/* Without an entry the next packet is deferred and decided again. */
		if (e) {
			e->flags = (e->flags & ~CT_SVC_PENDING) | CT_SVC_ALLOWED;
			if (cfg)
				e->revision = cfg->policy_revision;
		}
		if (cfg && (cfg->flags & CFG_EMIT_ALLOWED))
			emit_on(ifindex, ep, DIR_EGRESS, &p, remote.identity, reason, now);
		count(DIR_EGRESS, reason, skb->len);
		return NF_ACCEPT;
	}
	/* Without defragmentation before this hook (no conntrack in the
	 * node's netns) the tc program passes on the later fragments of a
	 * deferred first one: they must not outlive its denial. */
	if (p.frag == FRAG_FIRST)
		frag_forget(ifindex, &orig);
	if (e && (e->flags & CT_SVC_ALLOWED)) {
		/* Allowed before a policy change: a tombstone, like lib/conntrack.h. */
		e->flags = (e->flags & ~CT_SVC_PENDING) | CT_REVOKED;
		e->last_seen_ns = now;
		if (cfg)
			e->revision = cfg->policy_revision;
		ct_stat(CT_STAT_REVOKED);
		reason = REASON_POLICY_REVOKED;
	} else if (e) {
		bpf_map_delete_elem(&cdo_conntrack, &k);
	}
	emit_on(ifindex, ep, DIR_EGRESS, &p, remote.identity, reason, now);
	count(DIR_EGRESS, reason, skb->len);
	return NF_DROP;
}
