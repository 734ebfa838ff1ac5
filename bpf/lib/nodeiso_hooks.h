/* Node -> node isolation programs, attached by the daemon to the node's
 * underlay interface (cdo_from_node on ingress, cdo_to_node on egress) and,
 * for an L3 device such as the WireGuard TUN, cdo_from_node_l3 on ingress.
 * They judge only traffic between this node's addresses (ID_HOST) and other
 * nodes' (ID_REMOTE_NODE); pod traffic and everything else passes untouched
 * (TC_ACT_UNSPEC), and nothing at all is looked at while node-to-node
 * isolation is off. Drops are counted in the ingress slot of
 * REASON_NODE_TO_NODE_DENIED and reported as flows without an endpoint. */
#pragma once

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "../coordino.h"
#include "parse.h"
#include "policy.h"
#include "conntrack.h"
#include "events.h"
#include "nodeiso.h"
#include "tunnel.h"

/* Node flows are tracked under one pseudo interface (no endpoint has
 * ifindex 0), so a flow leaving by the underlay may be answered through the
 * WireGuard device and the other way round. */
#define NODE_CT_IFINDEX 0

/* from_node judges a packet arriving from the underlay (l3_off 14) or an
 * L3 tunnel device (l3_off 0). */
static __always_inline int from_node(struct __sk_buff *skb, __u32 l3_off)
{
	if (!(nodeiso_flags() & NODEISO_NODE_TO_NODE))
		return TC_ACT_UNSPEC;
	struct packet p = {};
	__u8 family;
	if (!skb_family(skb, &family))
		return TC_ACT_UNSPEC;
	/* What the stack would drop anyway is not node isolation's business. */
	if (parse_ip(skb, l3_off, family, &p, 0) != PARSE_OK || p.frag == FRAG_LATER)
		return TC_ACT_UNSPEC;
	if (lookup_identity(p.family, p.dst).identity != ID_HOST ||
	    lookup_identity(p.family, p.src).identity != ID_REMOTE_NODE)
		return TC_ACT_UNSPEC;
	if (!nodeiso_opens_flow(&p) || p.icmp_error)
		return TC_ACT_UNSPEC;
	if (nodeiso_allows(ID_HOST, ID_REMOTE_NODE, DIR_INGRESS, p.proto, p.dport))
		return TC_ACT_UNSPEC;
	__u64 now = now_ns();
	if (p.proto == IPPROTO_UDP || p.proto == IPPROTO_SCTP) {
		/* A reply to a flow this node opened (see cdo_to_node). */
		struct ct_key k;
		__u8 origin;
		if (ct_lookup(NODE_CT_IFINDEX, DIR_INGRESS, &p, now, &k, &origin) && origin == DIR_EGRESS)
			return TC_ACT_UNSPEC;
	}
	emit(skb, NULL, DIR_INGRESS, &p, ID_REMOTE_NODE, REASON_NODE_TO_NODE_DENIED, now);
	count(DIR_INGRESS, REASON_NODE_TO_NODE_DENIED, skb->len);
	return TC_ACT_SHOT;
}

/* Host routing's ingress (coordino.c): the underlay is where other nodes'
 * pod traffic arrives, in direct routing and through the eBPF tunnel. */
static __always_inline int to_local_pod(struct __sk_buff *skb, int underlay, int from_peer_node);

/* cdo_from_node runs on the ingress of the node's underlay (Ethernet). */
SEC("tc")
int cdo_from_node(struct __sk_buff *skb)
{
	int from_peer_node = 0;
	int rc = tunnel_guard_underlay(skb, &from_peer_node);
	if (rc != TC_ACT_UNSPEC)
		return rc;
	rc = from_node(skb, ETH_HLEN);
	return rc == TC_ACT_UNSPEC ? to_local_pod(skb, 1, from_peer_node) : rc;
}

/* cdo_from_node_l3 runs on the ingress of an L3 device (WireGuard TUN). */
SEC("tc")
int cdo_from_node_l3(struct __sk_buff *skb)
{
	return from_node(skb, 0);
}

/* to_node tracks the UDP and SCTP flows this node opens towards other
 * nodes, so that their replies pass from_node. It never drops. */
static __always_inline int to_node(struct __sk_buff *skb, __u32 l3_off)
{
	if (!(nodeiso_flags() & NODEISO_NODE_TO_NODE))
		return TC_ACT_UNSPEC;
	struct packet p = {};
	__u8 family;
	if (!skb_family(skb, &family))
		return TC_ACT_UNSPEC;
	if (parse_ip(skb, l3_off, family, &p, 0) != PARSE_OK)
		return TC_ACT_UNSPEC;
	if ((p.proto != IPPROTO_UDP && p.proto != IPPROTO_SCTP) || p.frag == FRAG_LATER)
		return TC_ACT_UNSPEC;
	if (lookup_identity(p.family, p.src).identity != ID_HOST ||
	    lookup_identity(p.family, p.dst).identity != ID_REMOTE_NODE)
		return TC_ACT_UNSPEC;
	__u64 now = now_ns();
	struct ct_key k;
	__u8 origin;
	struct ct_entry *e = ct_lookup(NODE_CT_IFINDEX, DIR_EGRESS, &p, now, &k, &origin);
	if (e) {
		if (now > e->last_seen_ns + CT_REFRESH_NS)
			e->last_seen_ns = now;
		return TC_ACT_UNSPEC;
	}
	ct_create(NODE_CT_IFINDEX, DIR_EGRESS, &p, 0, now, 0);
	return TC_ACT_UNSPEC;
}

/* cdo_to_node runs on the egress of the node's underlay (Ethernet). */
SEC("tc")
int cdo_to_node(struct __sk_buff *skb)
{
	return to_node(skb, ETH_HLEN);
}

/* cdo_to_node_l3 runs on the egress of an L3 device (WireGuard TUN). */
SEC("tc")
int cdo_to_node_l3(struct __sk_buff *skb)
{
	return to_node(skb, 0);
}
