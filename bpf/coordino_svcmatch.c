//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Coordino's post-DNAT decision for kernels without BPF netfilter links
 * (before 6.4): a socket filter program that an nftables chain runs through
 * the xtables BPF match (xt_bpf), on PREROUTING right after kube-proxy's DNAT
 * (priority NF_IP_PRI_NAT_DST + 1), for packets of connections whose
 * original destination is a Service CIDR, in their original direction (the
 * chain's rules test that; daemon/datapath/servicematch.go). It answers
 * "match" (1) for a packet to drop, 0 to let it pass, and decides on the
 * destination kube-proxy translated to, as coordino_svc.c does on newer
 * kernels.
 *
 * It keeps no state (CFG_SERVICE_MATCH in coordino.h): a deferred flow
 * stays pending in conntrack, so the tc program defers every packet of it
 * and each is decided here on the policy in force, which is what the
 * netfilter program's conntrack answers amount to. A packet is the
 * endpoint's that its input device is (routed pods), or the one the tc
 * program named by the packet's source (a bridge's port). Its maps are the
 * tc object's, handed over by the loader. */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "coordino.h"
#include "lib/parse.h"
#include "lib/policy.h"
#include "lib/conntrack.h"
#include "lib/events.h"
#include "lib/service.h"

char __license[] SEC("license") = "Dual BSD/GPL";

#define MATCH_PASS 0
#define MATCH_DROP 1

/* deferring_endpoint finds the endpoint a deferred packet p is from: its
 * input device's, else the one the tc program recorded by p's source. */
static __always_inline struct endpoint_info *deferring_endpoint(struct __sk_buff *skb,
								 const struct packet *p, __u32 *ifindex)
{
	*ifindex = skb->ifindex;
	struct endpoint_info *ep = bpf_map_lookup_elem(&cdo_endpoints, ifindex);
	if (ep)
		return ep;
	struct ct_key k;
	svc_source_key(&k, p);
	__u32 *owner = bpf_map_lookup_elem(&cdo_svc_pending, &k);
	if (!owner)
		return NULL;
	*ifindex = *owner;
	return bpf_map_lookup_elem(&cdo_endpoints, ifindex);
}

SEC("socket")
int cdo_svc_match(struct __sk_buff *skb)
{
	__u8 family;
	if (!skb_family(skb, &family))
		return MATCH_PASS;
	/* Data starts at the network header in netfilter hooks. Conntrack
	 * reassembled fragments before DNAT, so a later fragment here had no
	 * first one to translate it: not a Service flow's. */
	struct packet p = {};
	if (parse_ip(skb, 0, family, &p, 0) != PARSE_OK || !is_port_proto(p.proto) ||
	    p.frag == FRAG_LATER)
		return MATCH_PASS;

	__u32 mark = skb->mark;
	__u32 ifindex;
	struct endpoint_info *ep = deferring_endpoint(skb, &p, &ifindex);
	if (!ep) {
		/* The tc program deferred it but its record is gone (a pod can
		 * fill cdo_svc_pending): fail closed. Not deferred: not from a
		 * pod, or from one that is not egress-isolated. */
		if (!(mark & MARK_SVC_DEFERRED))
			return MATCH_PASS;
		count(DIR_EGRESS, REASON_SERVICE_UNENFORCEABLE, skb->len);
		return MATCH_DROP;
	}
	if (!(ep->flags & EP_EGRESS_ENFORCED))
		return MATCH_PASS;

	__u64 now = bpf_ktime_get_ns();
	struct ipcache_value remote = remote_of(&p, DIR_EGRESS);
	__u32 reason = decide(ep, DIR_EGRESS, &remote, p.proto, p.dport);
	if (allowed(reason)) {
		/* Counted once: the tc program leaves deferred packets to us. */
		if (!(mark & MARK_SVC_DEFERRED))
			return MATCH_PASS;
		__u32 zero = 0;
		struct config *cfg = bpf_map_lookup_elem(&cdo_config, &zero);
		if ((mark & MARK_SVC_NEW) && cfg && (cfg->flags & CFG_EMIT_ALLOWED))
			emit_on(ifindex, ep, DIR_EGRESS, &p, remote.identity, reason, now);
		count(DIR_EGRESS, reason, skb->len);
		return MATCH_PASS;
	}
	if (mark & MARK_SVC_REPLIED)
		reason = REASON_POLICY_REVOKED;
	emit_on(ifindex, ep, DIR_EGRESS, &p, remote.identity, reason, now);
	count(DIR_EGRESS, reason, skb->len);
	return MATCH_DROP;
}
