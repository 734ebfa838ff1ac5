/* Source validation (anti-spoofing): what a pod may put in the source of
 * its packets and in its ARP and neighbour advertisements. Only the pod's
 * own addresses (per interface, written by the daemon on attach) and, for
 * traffic that stays on the link, IPv6 link-local and unspecified sources.
 * Identities are derived from addresses only after this check. */
#pragma once

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "../coordino.h"
#include "parse.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1 << 18);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct ep_addr_key);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cdo_ep_addrs SEC(".maps");

static __always_inline int owns_address(__u32 ifindex, __u8 family, const __u8 *addr)
{
	struct ep_addr_key k = {.ifindex = ifindex, .family = family};
	if (family == 4)
		__builtin_memcpy(k.addr, addr, 4);
	else
		__builtin_memcpy(k.addr, addr, 16);
	return bpf_map_lookup_elem(&cdo_ep_addrs, &k) != NULL;
}

/* source_allowed: p, sent by the endpoint on ifindex, carries one of its
 * addresses, or is IPv6 link-scope traffic from a link-local address (or
 * from :: for ICMPv6: duplicate address detection, early MLD reports). */
static __always_inline int source_allowed(__u32 ifindex, const struct packet *p)
{
	if (p->family == 6 && (ip6_is_link_local(p->dst) || ip6_is_multicast(p->dst))) {
		if (ip6_is_link_local(p->src))
			return 1;
		if (ip6_is_unspecified(p->src) && p->proto == IPPROTO_ICMPV6)
			return 1;
	}
	return owns_address(ifindex, p->family, p->src);
}

/* nd_claim_allowed: a pod's neighbour discovery may not act as a router
 * (router advertisement, redirect) nor advertise an address not its own. */
static __always_inline int nd_claim_allowed(struct __sk_buff *skb, __u32 ifindex,
					    const struct packet *p)
{
	if (p->icmp_type == ICMP6_ROUTER_ADVERT || p->icmp_type == ICMP6_REDIRECT)
		return 0;
	if (p->icmp_type != ICMP6_NEIGH_ADVERT)
		return 1;
	__u8 target[16];
	if (bpf_skb_load_bytes(skb, p->l4_off + 8, target, sizeof(target)) < 0)
		return 0;
	return ip6_is_link_local(target) || owns_address(ifindex, 6, target);
}

/* arp_allowed: an ARP packet from the pod (Ethernet/IPv4 only) claims its
 * own address as sender, or none (0.0.0.0: an RFC 5227 probe). */
static __always_inline int arp_allowed(struct __sk_buff *skb, __u32 l3_off, __u32 ifindex)
{
	__u8 arp[28];
	if (bpf_skb_load_bytes(skb, l3_off, arp, sizeof(arp)) < 0)
		return 0;
	/* htype 1 (Ethernet), ptype 0x0800, hlen 6, plen 4 */
	if (arp[0] != 0 || arp[1] != 1 || arp[2] != 0x08 || arp[3] != 0 || arp[4] != 6 || arp[5] != 4)
		return 0;
	__u32 spa;
	__builtin_memcpy(&spa, &arp[14], 4);
	return spa == 0 || owns_address(ifindex, 4, &arp[14]);
}
