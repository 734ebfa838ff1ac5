//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Coordino endpoint programs, attached to the host side of every pod
 * interface: cdo_from_ep on its ingress (the pod's egress) and cdo_to_ep on
 * its egress (the pod's ingress). Both enforce identity-based network policy
 * with connection tracking, count verdicts and report new flows; packets a
 * pod sends must carry its own addresses. Allowed packets return
 * TC_ACT_UNSPEC (tcx: TCX_NEXT) so later programs still run.
 *
 * One concern per header under lib/: parse (headers), source (anti-spoofing),
 * policy (identities and the decision), conntrack, frag (fragment ports),
 * events (counters and flow records). */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "coordino.h"
#include "lib/parse.h"
#include "lib/source.h"
#include "lib/policy.h"
#include "lib/conntrack.h"
#include "lib/frag.h"
#include "lib/events.h"
#include "lib/service.h"
#include "lib/hostroute.h"
#include "lib/tunnel.h"
#include "lib/nodeiso_hooks.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* Make these types visible in BTF so bpf2go can generate Go for them. */
const enum reason *unused_reason __attribute__((unused));
const enum direction *unused_direction __attribute__((unused));
const enum ct_stat *unused_ct_stat __attribute__((unused));
const struct flow_event *unused_flow_event __attribute__((unused));
const struct ep_addr_key *unused_ep_addr_key __attribute__((unused));
const struct nodeiso_config *unused_nodeiso_config __attribute__((unused));
const enum nodeiso_flag *unused_nodeiso_flag __attribute__((unused));
const struct local_ep_key *unused_local_ep_key __attribute__((unused));
const struct local_ep *unused_local_ep __attribute__((unused));
const enum hostroute_stat *unused_hostroute_stat __attribute__((unused));
const struct tunnel_config *unused_tunnel_config __attribute__((unused));
const struct tunnel_peer *unused_tunnel_peer __attribute__((unused));
const struct svc_nodeport_key *unused_svc_nodeport_key __attribute__((unused));

#ifndef ETH_P_8021AD
#define ETH_P_8021AD 0x88A8
#endif

static __always_inline int verdict(struct __sk_buff *skb, __u8 dir, __u32 reason)
{
	count(dir, reason, skb->len);
	return reason >= REASON_FIRST_DROP ? TC_ACT_SHOT : TC_ACT_UNSPEC;
}

/* drop counts, reports and drops a packet of the endpoint on ifindex. */
static __always_inline int drop(struct __sk_buff *skb, __u32 ifindex, const struct endpoint_info *ep,
				__u8 dir, const struct packet *p, __u32 remote_id, __u32 reason, __u64 now)
{
	emit_on(ifindex, ep, dir, p, remote_id, reason, now);
	return verdict(skb, dir, reason);
}

/* handle_l2 judges frames that are not IP: from the pod, ARP must claim
 * its own address and VLAN-tagged frames (which would carry IP past the
 * source check) are dropped; everything else stays on the link. */
static __always_inline int handle_l2(struct __sk_buff *skb, __u8 dir, __u32 ifindex)
{
	if (dir == DIR_EGRESS) {
		if (skb->protocol == bpf_htons(ETH_P_ARP) && !arp_allowed(skb, ETH_HLEN, ifindex))
			return verdict(skb, dir, REASON_SPOOFED);
		if (skb->protocol == bpf_htons(ETH_P_8021Q) || skb->protocol == bpf_htons(ETH_P_8021AD))
			return verdict(skb, dir, REASON_SPOOFED);
	}
	return verdict(skb, dir, REASON_NOT_IP);
}

/* What svc_defer knows of the flow: new (tracked as pending first), or
 * one whose replies passed (allowed before). */
#define SVC_NEW 1
#define SVC_REPLIED 2

/* svc_defer passes a Service flow of an egress-isolated endpoint on to the
 * post-DNAT hook, which counts and reports its verdict; a new flow is tracked
 * as pending first. Without the hook the flow is dropped (fail closed). */
static __always_inline int svc_defer(struct __sk_buff *skb, const struct endpoint_info *ep,
				     __u32 ifindex, const struct packet *p, const struct config *cfg,
				     __u32 revision, __u64 now, int state)
{
	int create = state & SVC_NEW;
	if (!svc_hook_active(cfg))
		return drop(skb, ifindex, ep, DIR_EGRESS, p, ID_WORLD, REASON_SERVICE_UNENFORCEABLE, now);
	if (create)
		ct_create(ifindex, DIR_EGRESS, p, revision, now, CT_SERVICE | CT_SVC_PENDING);
	/* Where the veth is a bridge port, the post-DNAT program learns whose
	 * flow it is from this CPU's slot, or from this entry where the frame
	 * was queued between the two: without the entry, fail closed. */
	struct ct_key k;
	if (svc_match_mode(cfg)) {
		skb->mark |= MARK_SVC_DEFERRED | (create ? MARK_SVC_NEW : 0) |
			     (state & SVC_REPLIED ? MARK_SVC_REPLIED : 0);
		svc_source_key(&k, p);
	} else {
		svc_pending_key(&k, p);
		svc_remember(&k, ifindex);
	}
	if (bpf_map_update_elem(&cdo_svc_pending, &k, &ifindex, BPF_ANY))
		return drop(skb, ifindex, ep, DIR_EGRESS, p, ID_WORLD, REASON_SERVICE_UNENFORCEABLE, now);
	if (p->frag == FRAG_FIRST)
		frag_remember(ifindex, p, now);
	return TC_ACT_UNSPEC;
}

/* handle judges skb for the endpoint whose host interface is ifindex: the
 * interface the program runs on, or (host routing) the endpoint a packet
 * arriving from another node is for. memo_asked: host routing already
 * found nothing in the memo for it (hr_flow_memo). */
static __always_inline int handle(struct __sk_buff *skb, __u8 dir, __u32 ifindex, int memo_asked)
{
	struct packet p = {};
	__u8 family;

	if (!skb_family(skb, &family))
		return handle_l2(skb, dir, ifindex);

	int parsed = parse_ip(skb, ETH_HLEN, family, &p, 0);
	__u32 zero = 0;
	struct config *cfg = bpf_map_lookup_elem(&cdo_config, &zero);
	__u32 revision = cfg ? cfg->policy_revision : 0;
	__u64 now = now_ns();
	/* A flow conntrack answered a moment ago (lib/conntrack.h, ct_memo):
	 * the checks below passed then, under the same revision. */
	if (parsed == PARSE_OK && !memo_asked) {
		int known = ct_memo_get(ifindex, dir, &p, revision, now);
		if (known >= 0)
			return verdict(skb, dir, known);
	}

	struct endpoint_info *ep = bpf_map_lookup_elem(&cdo_endpoints, &ifindex);
	if (!ep)
		return verdict(skb, dir, REASON_NO_ENDPOINT);
	if (parsed != PARSE_OK)
		return verdict(skb, dir, REASON_MALFORMED);

	if (dir == DIR_EGRESS && !source_allowed(ifindex, &p))
		return drop(skb, ifindex, ep, dir, &p, 0, REASON_SPOOFED, now);
	if (is_link_control(&p)) {
		if (dir == DIR_EGRESS && !nd_claim_allowed(skb, ifindex, &p))
			return drop(skb, ifindex, ep, dir, &p, 0, REASON_SPOOFED, now);
		return verdict(skb, dir, REASON_NEIGHBOR);
	}
	if (dir == DIR_EGRESS && tunnel_injection_from_pod(&p))
		return drop(skb, ifindex, ep, dir, &p, remote_of(&p, dir).identity, REASON_TUNNEL_INJECTION, now);

	int observed = cfg && (cfg->flags & CFG_EMIT_ALLOWED);
	/* Nothing isolated: no verdict depends on state, so nothing is tracked
	 * but TCP connections from their SYN and UDP flows from their first
	 * packet: who opened a flow decides its fate once a policy isolates
	 * the pod (its own keep working, the others are cut and stay cut; a
	 * reply in flight at the change must not open a flow the other way). */
	int isolated = ep->flags & EP_ISOLATED;
	if (!isolated && !observed && p.proto != IPPROTO_TCP && p.proto != IPPROTO_UDP &&
	    !nodeiso_pods_isolated())
		return verdict(skb, dir, REASON_NOT_ISOLATED);

	if (p.frag == FRAG_LATER && !frag_ports_of(ifindex, &p, now)) {
		/* Without ports only a direction that is not isolated can pass. */
		if (ep->flags & isolation_flag(dir))
			return drop(skb, ifindex, ep, dir, &p, 0, REASON_FRAGMENT, now);
		return verdict(skb, dir, REASON_NOT_ISOLATED);
	}

	if (p.icmp_error) {
		struct packet q = {};
		if (parse_quote(skb, &p, &q) == PARSE_OK &&
		    ct_related(ep, ifindex, dir, &q, revision, now))
			return verdict(skb, dir, REASON_RELATED);
	}

	__u32 reason;
	int tracked = ct_track(ep, ifindex, dir, &p, revision, now);
	switch (tracked) {
	case CT_ESTABLISHED:
		reason = REASON_ESTABLISHED;
		break;
	case CT_REPLY:
		reason = REASON_REPLY;
		break;
	case CT_REVOKED_HIT:
		return drop(skb, ifindex, ep, dir, &p, remote_of(&p, dir).identity, REASON_POLICY_REVOKED, now);
	case CT_DEFERRED:
	case CT_DEFERRED_REPLIED:
		if (!(ep->flags & EP_EGRESS_ENFORCED)) {
			reason = REASON_ESTABLISHED;
			break;
		}
		return svc_defer(skb, ep, ifindex, &p, cfg, revision, now,
				 tracked == CT_DEFERRED_REPLIED ? SVC_REPLIED : 0);
	default: {
		if (dir == DIR_EGRESS && svc_deferred(ep, &p))
			return svc_defer(skb, ep, ifindex, &p, cfg, revision, now, SVC_NEW);
		struct ipcache_value remote = remote_of(&p, dir);
		reason = decide(ep, dir, &remote, p.proto, p.dport);
		if (!allowed(reason))
			return drop(skb, ifindex, ep, dir, &p, remote.identity, reason, now);
		/* On an isolated endpoint any allowed packet (re)creates the
		 * entry. A UDP packet that finds no entry opens its flow, on
		 * any endpoint: were it marked ambiguous, a client whose
		 * ingress policy is revoked would keep its flow (and any new
		 * one on the same ports) for as long as the server's other
		 * direction stays open. Mid-flow TCP, the side that opened the
		 * flow is unknown: if policy would also let the other side
		 * open it, remember that (CT_AMBIGUOUS). Elsewhere a TCP entry
		 * needs its SYN, and other flows are tracked only to report
		 * each once while observed. */
		int opening = tcp_opening(&p) || p.proto == IPPROTO_UDP;
		int track = isolated || opening || (observed && p.proto != IPPROTO_TCP);
		if (p.frag != FRAG_LATER && !p.icmp_error && track) {
			__u32 flags = 0;
			if (!opening &&
			    allowed(decide(ep, dir ^ 1, &remote, p.proto, p.sport)))
				flags = CT_AMBIGUOUS;
			ct_create(ifindex, dir, &p, revision, now, flags);
		}
		if (observed)
			emit_on(ifindex, ep, dir, &p, remote.identity, reason, now);
	}
	}
	if (p.frag == FRAG_FIRST)
		frag_remember(ifindex, &p, now);
	return verdict(skb, dir, reason);
}

/* to_other_node host-routes a pod's allowed packet f to another node's pod
 * block, through the eBPF tunnel when it has the block's VTEP; anything not
 * eligible (lib/hostroute.h) continues on the normal path. */
static __always_inline int to_other_node(struct __sk_buff *skb, __u32 ifindex, struct hr_flow *f)
{
	/* Source check: the policy program before this one dropped spoofing. */
	const struct tunnel_config *tc = tunnel_config();
	const struct tunnel_peer *tp = tc ? tunnel_peer_of(&f->h) : NULL;
	if ((!tp && !hr_in_peer_block(f->h.family, f->h.dst)) || hr_flow_host_tracked(skb, f))
		return TC_ACT_UNSPEC;
	return tp ? tunnel_encap(skb, ifindex, &f->h, tc, tp) : hr_route_out(skb, ifindex, &f->h);
}

/* from_ep_remembered judges a pod's packet whose flow this CPU's memo
 * knows by the memo's verdict, as handle() would, and host-routes it where
 * eligible, parsing it once: 1 with the program's answer in *rc. 0 for any
 * other packet (*asked: the memo was asked in vain). */
static __always_inline int from_ep_remembered(struct __sk_buff *skb, __u32 ifindex,
					      const struct config *cfg, int *rc, int *asked)
{
	struct hr_flow f = {};
	if (!hr_flow_of(skb, cfg, ifindex, DIR_EGRESS, &f))
		return 0;
	if (!f.memo) {
		*asked = 1;
		return 0;
	}
	*rc = verdict(skb, DIR_EGRESS, f.memo->reason);
	if (*rc == TC_ACT_UNSPEC)
		*rc = to_other_node(skb, ifindex, &f);
	return 1;
}

/* cdo_from_ep runs on the host interface's ingress: packets leaving the
 * pod. Allowed packets to another node's pod block may be host-routed. */
SEC("tc")
int cdo_from_ep(struct __sk_buff *skb)
{
	/* Read once and passed down: a later skb->ifindex may be compiled
	 * into a read through an offset context pointer, which the verifier
	 * refuses. */
	__u32 ifindex = skb->ifindex;
	const struct config *cfg = hostroute_config();
	int rc, asked = 0;
	if (cfg && from_ep_remembered(skb, ifindex, cfg, &rc, &asked))
		return rc;
	rc = handle(skb, DIR_EGRESS, ifindex, asked);
	if (rc != TC_ACT_UNSPEC || !cfg)
		return rc;
	/* Parsed again: keeping the first parse across handle() costs the
	 * verifier more than the parse costs the packet. */
	struct hr_flow f = {};
	if (!hr_flow_of(skb, cfg, ifindex, DIR_EGRESS, &f))
		return TC_ACT_UNSPEC;
	return to_other_node(skb, ifindex, &f);
}

/* cdo_to_ep runs on the host interface's egress: packets towards the pod. */
SEC("tc")
int cdo_to_ep(struct __sk_buff *skb)
{
	return handle(skb, DIR_INGRESS, skb->ifindex, 0);
}

/* to_local_pod host-routes a packet from another node's pod to a local
 * primary endpoint: its ingress policy runs here, as cdo_to_ep would run
 * it (the redirected packet never crosses the host interface's egress),
 * and an allowed packet is redirected into the pod. On the underlay
 * (underlay set), a VXLAN packet carrying such a packet is decapsulated
 * first (lib/tunnel.h; from_peer_node: the guard found its source to be a
 * peer node). Anything not eligible (lib/hostroute.h) continues on the
 * normal path, untouched. */
static __always_inline int to_local_pod(struct __sk_buff *skb, int underlay, int from_peer_node)
{
	struct hr_flow f = {};
	struct local_ep ep;
	const struct config *cfg;
	if (skb->pkt_type != HR_PACKET_HOST || !(cfg = hostroute_config()) || !hr_parse(skb, &f.h))
		return TC_ACT_UNSPEC;
	int tunnelled = underlay && tunnel_inner(skb, &f.h, from_peer_node);
	if (!hr_from_peer(&f.h) || !hr_local_ep(&f.h, &ep))
		return TC_ACT_UNSPEC;
	hr_flow_memo(&f, cfg, ep.ifindex, DIR_INGRESS);
	if (hr_flow_host_tracked(skb, &f))
		return TC_ACT_UNSPEC;
	if (tunnelled) {
		int rc = tunnel_decap(skb, &f.h);
		if (rc)
			return rc > 0 ? TC_ACT_UNSPEC : TC_ACT_SHOT;
	}
	int rc = f.memo ? verdict(skb, DIR_INGRESS, f.memo->reason) : handle(skb, DIR_INGRESS, ep.ifindex, 1);
	if (rc != TC_ACT_UNSPEC)
		return rc;
	return hr_into_pod(skb, &f.h, &ep);
}

/* cdo_from_tunnel runs on the ingress of the VXLAN device: decapsulated
 * frames, host-routed to local pods like the uplink's (cdo_from_node). */
SEC("tc")
int cdo_from_tunnel(struct __sk_buff *skb)
{
	return to_local_pod(skb, 0, 0);
}
