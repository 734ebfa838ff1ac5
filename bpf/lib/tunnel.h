/* The eBPF VXLAN tunnel: in vxlan routing over an IPv4 underlay, the pod
 * packets host routing takes (lib/hostroute.h) skip the kernel's VXLAN
 * device as well:
 *  - egress: a pod's packet to another node's block is encapsulated here,
 *    in the device's own wire format (outer IPv4 + UDP + VXLAN + inner
 *    Ethernet addressed to the peer's device MAC), and redirected to the
 *    underlay's next hop;
 *  - ingress: a VXLAN packet from a peer node (remote-node identity) for a
 *    local primary endpoint is decapsulated on the underlay's ingress and
 *    then handled like host routing's other arrivals (ingress policy,
 *    redirect into the pod).
 * Everything else keeps the device, which stays configured: node traffic,
 * ICMP, fragments, flows the host's conntrack knows, IPv6 underlays (the
 * outer UDP checksum IPv6 requires cannot be computed over a GSO packet
 * here). Since the wire format is the device's, either end may take either
 * path.
 *
 * The guard: the device decapsulates whatever reaches its UDP port, and
 * the packet inside is then judged by its inner source address. A pod that
 * sends a VXLAN frame to a node's port (its own node's or, routed, another
 * node's) could so pose as any pod; so can a host on the underlay that is
 * no peer node. With the guard on (vxlan routing, eBPF tunnel or not), the
 * endpoint programs drop a pod's UDP to a node address on the VXLAN port,
 * and the underlay's ingress drops UDP to this node on that port from any
 * address that is not a peer node's. */
#pragma once

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "../coordino.h"
#include "adjroom.h"
#include "parse.h"
#include "policy.h"
#include "clock.h"
#include "events.h"
#include "hostroute.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tunnel_config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cdo_tunnel SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 1 << 16);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct ipcache_key);
	__type(value, struct tunnel_peer);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cdo_tunnel_peers SEC(".maps");

/* The headers the tunnel adds between the outer Ethernet header and the
 * pod's packet. */
struct tunnel_hdr {
	struct iphdr ip;
	struct udphdr udp;
	__be32 vx_flags; /* VXLAN: the I flag (a valid VNI) */
	__be32 vx_vni;   /* VNI << 8 */
	struct ethhdr eth;
} __attribute__((packed));

#define TUNNEL_HLEN ((__u32)sizeof(struct tunnel_hdr)) /* 50 */
#define VXLAN_FLAG_VNI 0x08
/* The source ports the kernel's VXLAN device picks from (udp_flow_src_port
 * over the default local port range): flow entropy for the underlay. */
#define TUNNEL_SPORT_MIN 32768
#define TUNNEL_SPORT_SPAN (61000 - TUNNEL_SPORT_MIN)


/* TCP GSO packets grow by the tunnel headers; the pod MTU already left
 * room for them, so the segment size stays. */
#define TUNNEL_ENCAP_FLAGS                                                                         \
	(BPF_F_ADJ_ROOM_FIXED_GSO | BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 | BPF_F_ADJ_ROOM_ENCAP_L4_UDP |   \
	 BPF_F_ADJ_ROOM_ENCAP_L2_ETH | BPF_F_ADJ_ROOM_ENCAP_L2(ETH_HLEN))

/* tunnel_config_if returns the configuration if one of flags is set. */
static __always_inline const struct tunnel_config *tunnel_config_if(__u32 flags)
{
	__u32 zero = 0;
	struct tunnel_config *tc = bpf_map_lookup_elem(&cdo_tunnel, &zero);
	return tc && (tc->flags & flags) ? tc : NULL;
}

static __always_inline const struct tunnel_config *tunnel_config(void)
{
	return tunnel_config_if(TUNNEL_ON);
}

/* tunnel_guard_port: p is UDP to the guarded VXLAN port (p's first
 * fragment carries the port; later ones cannot be reassembled without it). */
static __always_inline int tunnel_guard_port(const struct packet *p)
{
	if (p->proto != IPPROTO_UDP || p->frag == FRAG_LATER)
		return 0;
	const struct tunnel_config *tc = tunnel_config_if(TUNNEL_GUARD);
	return tc && p->dport == tc->port;
}

/* tunnel_injection_from_pod: a pod's packet p goes to a node's VXLAN port. */
static __always_inline int tunnel_injection_from_pod(const struct packet *p)
{
	if (!tunnel_guard_port(p))
		return 0;
	__u32 id = lookup_identity(p->family, p->dst).identity;
	return id == ID_HOST || id == ID_REMOTE_NODE;
}

/* tunnel_guard_underlay judges a packet arriving on the underlay: UDP to
 * this node's VXLAN port from an address that is no peer node's is
 * dropped (counted, reported without an endpoint); anything else passes
 * (TC_ACT_UNSPEC). *from_peer_node is set when the packet passed because
 * its source is a peer node's, so that decapsulation need not ask again.
 * Only packets that may be UDP are parsed. */
static __always_inline int tunnel_guard_underlay(struct __sk_buff *skb, int *from_peer_node)
{
	__u8 family, next;
	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		family = 4;
		if (bpf_skb_load_bytes(skb, ETH_HLEN + offsetof(struct iphdr, protocol), &next, 1) < 0)
			return TC_ACT_UNSPEC;
	} else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		family = 6;
		if (bpf_skb_load_bytes(skb, ETH_HLEN + 6, &next, 1) < 0)
			return TC_ACT_UNSPEC;
	} else {
		return TC_ACT_UNSPEC;
	}
	/* TCP and ICMP never carry VXLAN; an IPv6 extension header might
	 * precede UDP. */
	if (next == IPPROTO_TCP || next == IPPROTO_ICMP || next == IPPROTO_ICMPV6)
		return TC_ACT_UNSPEC;
	const struct tunnel_config *tc = tunnel_config_if(TUNNEL_GUARD);
	if (!tc)
		return TC_ACT_UNSPEC;
	struct packet p = {};
	if (parse_ip(skb, ETH_HLEN, family, &p, 0) != PARSE_OK || !tunnel_guard_port(&p))
		return TC_ACT_UNSPEC;
	/* This node's VTEP address is one of its own: the common case skips
	 * the ipcache. */
	int to_vtep = family == 4 && tc->src && __builtin_memcmp(p.dst, &tc->src, 4) == 0;
	if (!to_vtep && lookup_identity(p.family, p.dst).identity != ID_HOST)
		return TC_ACT_UNSPEC;
	__u32 src = lookup_identity(p.family, p.src).identity;
	if (src == ID_REMOTE_NODE) {
		*from_peer_node = 1;
		return TC_ACT_UNSPEC;
	}
	emit(skb, NULL, DIR_INGRESS, &p, src, REASON_TUNNEL_INJECTION, now_ns());
	count(DIR_INGRESS, REASON_TUNNEL_INJECTION, skb->len);
	return TC_ACT_SHOT;
}

/* tunnel_peer_of returns the VTEP of the block holding h's destination,
 * or NULL (not another node's block). */
static __always_inline const struct tunnel_peer *tunnel_peer_of(const struct hr_packet *h)
{
	struct ipcache_key k = hr_block_key(h->family, h->dst);
	return bpf_map_lookup_elem(&cdo_tunnel_peers, &k);
}

static __always_inline __u16 csum_fold(__s64 sum)
{
	__u32 s = (__u32)sum;
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (__u16)~s;
}

/* tunnel_fits reports whether h's packet (each segment of a GSO packet)
 * still fits the underlay's MTU once encapsulated: pods whose MTU did not
 * leave the tunnel's room (another CNI sized it) take the device, which
 * answers with ICMP. */
static __always_inline int tunnel_fits(struct __sk_buff *skb, const struct hr_packet *h, __u32 mtu)
{
	if (!skb->gso_size)
		return skb->len - ETH_HLEN + TUNNEL_HLEN <= mtu;
	__u32 l4_off = ETH_HLEN + (h->family == 4 ? 20 : 40);
	__u32 l4_hlen = sizeof(struct udphdr);
	if (h->proto == IPPROTO_TCP) {
		__u8 doff;
		if (bpf_skb_load_bytes(skb, l4_off + 12, &doff, 1) < 0)
			return 0;
		l4_hlen = (doff >> 4) * 4;
	}
	return skb->gso_size + l4_off - ETH_HLEN + l4_hlen + TUNNEL_HLEN <= mtu;
}

/* tunnel_encap encapsulates a pod's packet h, arriving on ifindex, for the
 * peer tp and redirects it to the underlay's next hop towards tp;
 * TC_ACT_UNSPEC (the device's path, packet untouched) when it cannot. */
static __always_inline int tunnel_encap(struct __sk_buff *skb, __u32 ifindex, const struct hr_packet *h,
					const struct tunnel_config *tc, const struct tunnel_peer *tp)
{
	__u32 outer_len = skb->len - ETH_HLEN + TUNNEL_HLEN;
	if (outer_len > 0xffff)
		return TC_ACT_UNSPEC;
	/* Looked up as the device would route its outer packet (the veth as
	 * ingress, as host routing's own lookups): next hop and MTU. */
	union hr_fib_params fib = {.p = {
		.family = AF_INET,
		.l4_protocol = IPPROTO_UDP,
		.dport = tc->port,
		.ipv4_src = tc->src,
		.ipv4_dst = tp->vtep,
		.ifindex = ifindex,
	}};
	if (hr_fib(skb, &fib) != BPF_FIB_LKUP_RET_SUCCESS) {
		hr_count(HR_STAT_NO_ROUTE);
		return TC_ACT_UNSPEC;
	}
	if (!tunnel_fits(skb, h, fib.p.mtu_result))
		return TC_ACT_UNSPEC;

	__u32 hash = bpf_get_hash_recalc(skb);
	struct iphdr ip = {
		.version = 4,
		.ihl = 5,
		.ttl = 64,
		.protocol = IPPROTO_UDP,
		.tot_len = bpf_htons(outer_len),
		.id = (__be16)bpf_get_prandom_u32(),
		.saddr = tc->src,
		.daddr = tp->vtep,
	};
	ip.check = csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)&ip, sizeof(ip), 0));
	struct tunnel_hdr t = {.ip = ip};
	t.udp.source = bpf_htons(TUNNEL_SPORT_MIN + (((__u64)hash * TUNNEL_SPORT_SPAN) >> 32));
	t.udp.dest = tc->port;
	t.udp.len = bpf_htons(outer_len - sizeof(t.ip));
	/* Outer UDP checksum 0, as IPv4 allows: the pod's own checksum covers
	 * the payload (the device, by default, computes one; receivers take
	 * both). */
	t.vx_flags = bpf_htonl(VXLAN_FLAG_VNI << 24);
	t.vx_vni = bpf_htonl(tc->vni << 8);
	__builtin_memcpy(t.eth.h_dest, tp->mac, ETH_ALEN);
	__builtin_memcpy(t.eth.h_source, tc->mac, ETH_ALEN);
	t.eth.h_proto = h->family == 4 ? bpf_htons(ETH_P_IP) : bpf_htons(ETH_P_IPV6);
	__be32 nh = fib.p.ipv4_dst;

	if (bpf_skb_adjust_room(skb, TUNNEL_HLEN, BPF_ADJ_ROOM_MAC, TUNNEL_ENCAP_FLAGS) < 0)
		return TC_ACT_UNSPEC;
	/* Past this point the packet is half built: it cannot go back. */
	if (bpf_skb_store_bytes(skb, ETH_HLEN, &t, sizeof(t), 0) < 0 ||
	    hr_dec_ttl_at(skb, ETH_HLEN + TUNNEL_HLEN, h) < 0)
		return TC_ACT_SHOT;
	struct bpf_redir_neigh n = {.nh_family = AF_INET, .ipv4_nh = nh};
	hr_count(HR_STAT_OUT_REDIRECTED);
	hr_count(HR_STAT_ENCAPSULATED);
	return bpf_redirect_neigh(fib.p.ifindex, &n, sizeof(n), 0);
}

/* tunnel_inner: if h (an underlay packet addressed to this host) is VXLAN
 * from a peer node to this node's VTEP, on the tunnel's VNI, h becomes the
 * pod packet it carries and the result is 1; 0 leaves h as it was.
 * from_peer_node: the guard already found h's source to be a peer node. */
static __always_inline int tunnel_inner(struct __sk_buff *skb, struct hr_packet *h, int from_peer_node)
{
	if (h->family != 4 || h->proto != IPPROTO_UDP)
		return 0;
	const struct tunnel_config *tc = tunnel_config();
	if (!tc || h->dport != tc->port || __builtin_memcmp(h->dst, &tc->src, 4) != 0)
		return 0;
	if (!from_peer_node && lookup_identity(4, h->src).identity != ID_REMOTE_NODE)
		return 0;
	struct {
		__u8 flags;
		__u8 reserved[3];
		__u8 vni[3];
		__u8 reserved2;
		struct ethhdr eth;
	} __attribute__((packed)) vx;
	if (bpf_skb_load_bytes(skb, ETH_HLEN + sizeof(struct iphdr) + sizeof(struct udphdr), &vx, sizeof(vx)) < 0)
		return 0;
	__u32 vni = ((__u32)vx.vni[0] << 16) | ((__u32)vx.vni[1] << 8) | vx.vni[2];
	if (!(vx.flags & VXLAN_FLAG_VNI) || vni != tc->vni)
		return 0;
	struct hr_packet in = {};
	if (!hr_parse_at(skb, ETH_HLEN + TUNNEL_HLEN, vx.eth.h_proto, &in))
		return 0;
	*h = in;
	return 1;
}

/* tunnel_decap strips the tunnel headers off a packet tunnel_inner
 * accepted, leaving the pod packet h behind the outer Ethernet header: 0
 * when done, 1 when nothing changed (a kernel without the decapsulation
 * flags: the device takes it), -1 when the frame is left half rewritten. */
static __always_inline int tunnel_decap(struct __sk_buff *skb, const struct hr_packet *h)
{
	__u64 flags = BPF_F_ADJ_ROOM_FIXED_GSO |
		      (h->family == 4 ? TUNNEL_DECAP_L3_IPV4 : TUNNEL_DECAP_L3_IPV6);
	if (bpf_skb_adjust_room(skb, -(__s32)TUNNEL_HLEN, BPF_ADJ_ROOM_MAC, flags) < 0)
		return 1;
	__be16 proto = h->family == 4 ? bpf_htons(ETH_P_IP) : bpf_htons(ETH_P_IPV6);
	if (bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_proto), &proto, sizeof(proto), 0) < 0)
		return -1;
	hr_count(HR_STAT_DECAPSULATED);
	return 0;
}
