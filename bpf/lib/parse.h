/* Packet parsing: IPv4/IPv6 headers, the IPv6 extension-header chain,
 * fragments, L4 ports and the packet quoted by an ICMP error. Everything is
 * read with bpf_skb_load_bytes (bpf_dynptr_read in the netfilter program),
 * so a truncated packet fails a load and is reported malformed instead of
 * being read past its end. */
#pragma once

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#ifndef IPPROTO_ICMPV6
#define IPPROTO_ICMPV6 58
#endif
#define NEXTHDR_HOP 0
#define NEXTHDR_ROUTING 43
#define NEXTHDR_FRAGMENT 44
#define NEXTHDR_AUTH 51
#define NEXTHDR_DEST 60
/* Longer chains than this are dropped: no legitimate pod traffic needs them. */
#define IPV6_MAX_EXT_HEADERS 6

#define TCP_FIN 0x01
#define TCP_SYN 0x02
#define TCP_RST 0x04
#define TCP_ACK 0x10

/* ICMPv6 types handled on the link without policy (see is_link_control). */
#define ICMP6_MLD_QUERY 130
#define ICMP6_MLD_DONE 132
#define ICMP6_ROUTER_SOLICIT 133
#define ICMP6_ROUTER_ADVERT 134
#define ICMP6_NEIGH_ADVERT 136
#define ICMP6_REDIRECT 137
#define ICMP6_MLD2_REPORT 143

/* The parser reads through parse_load from a PARSE_CTX: the tc programs'
 * skb by default; the netfilter program (coordino_svc.c) defines both to
 * read from a dynptr over its skb before including this header. */
#ifndef PARSE_CTX
#define PARSE_CTX struct __sk_buff
#define parse_load(ctx, off, to, len) bpf_skb_load_bytes(ctx, off, to, len)
#endif

enum frag_kind {
	FRAG_NONE,  /* not fragmented (or an atomic fragment) */
	FRAG_FIRST, /* offset 0, more fragments follow: carries the ports */
	FRAG_LATER, /* offset > 0: no L4 header */
};

/* Extension headers seen before L4 (struct packet.ext). */
#define EXT_HOP 1
#define EXT_OTHER 2

enum parse_result {
	PARSE_OK,
	PARSE_MALFORMED,
};

/* A parsed packet. Ports hold the ICMP echo identifier for echo messages. */
struct packet {
	__u8 family;
	__u8 proto;
	__u8 tcp_flags;
	__u8 icmp_error; /* ICMP(v6) error: the quoted packet starts at l4_off + 8 */
	__be16 sport;
	__be16 dport;
	__u8 src[16];
	__u8 dst[16];
	__u8 hop_limit; /* IPv4 TTL, IPv6 hop limit */
	__u8 icmp_type;
	__u8 frag;      /* enum frag_kind */
	__u8 ext;       /* EXT_* */
	__u32 frag_id;
	__u32 l4_off;
};

/* skb_family sets *family to 4 or 6 from skb's protocol; 0 for any other. */
static __always_inline int skb_family(struct __sk_buff *skb, __u8 *family)
{
	if (skb->protocol == bpf_htons(ETH_P_IP))
		*family = 4;
	else if (skb->protocol == bpf_htons(ETH_P_IPV6))
		*family = 6;
	else
		return 0;
	return 1;
}

static __always_inline int is_port_proto(__u8 proto)
{
	return proto == IPPROTO_TCP || proto == IPPROTO_UDP || proto == IPPROTO_SCTP;
}

static __always_inline int is_icmp(const struct packet *p)
{
	return p->family == 4 ? p->proto == IPPROTO_ICMP : p->proto == IPPROTO_ICMPV6;
}

static __always_inline int ip6_is_link_local(const __u8 *a)
{
	return a[0] == 0xfe && (a[1] & 0xc0) == 0x80;
}

static __always_inline int ip6_is_multicast(const __u8 *a)
{
	return a[0] == 0xff;
}

static __always_inline int ip6_is_unspecified(const __u8 *a)
{
	__u64 w[2];
	__builtin_memcpy(w, a, 16);
	return (w[0] | w[1]) == 0;
}

/* parse_l4 reads the L4 header at p->l4_off. For a quoted packet it reads
 * only the 8 bytes RFC 792 guarantees, and never TCP flags: a quoted RST
 * says nothing about the live flow. */
static __always_inline int parse_l4(PARSE_CTX *skb, struct packet *p, int quoted)
{
	__u8 hdr[8];

	if (p->frag == FRAG_LATER)
		return PARSE_OK;
	if (is_port_proto(p->proto)) {
		if (parse_load(skb, p->l4_off, hdr, 4) < 0)
			return PARSE_MALFORMED;
		__builtin_memcpy(&p->sport, &hdr[0], 2);
		__builtin_memcpy(&p->dport, &hdr[2], 2);
		if (p->proto == IPPROTO_TCP && !quoted &&
		    parse_load(skb, p->l4_off + 13, &p->tcp_flags, 1) < 0)
			return PARSE_MALFORMED;
		return PARSE_OK;
	}
	if (!is_icmp(p))
		return PARSE_OK;
	if (parse_load(skb, p->l4_off, hdr, sizeof(hdr)) < 0)
		return PARSE_MALFORMED;
	__u8 type = hdr[0];
	p->icmp_type = type;
	int echo, error;
	if (p->family == 4) {
		echo = type == 8 || type == 0;
		error = type == 3 || type == 11 || type == 12;
	} else {
		echo = type == 128 || type == 129;
		error = type >= 1 && type <= 4;
	}
	if (echo) {
		__builtin_memcpy(&p->sport, &hdr[4], 2);
		p->dport = p->sport;
	} else if (error && !quoted) {
		p->icmp_error = 1;
	}
	return PARSE_OK;
}

static __always_inline int is_ipv6_ext(__u8 next)
{
	return next == NEXTHDR_HOP || next == NEXTHDR_ROUTING || next == NEXTHDR_FRAGMENT ||
	       next == NEXTHDR_DEST || next == NEXTHDR_AUTH;
}

/* parse_ip parses the IP header at off and, unless p is a later fragment,
 * its L4 header. quoted parses the packet inside an ICMP error. */
static __always_inline int parse_ip(PARSE_CTX *skb, __u32 off, __u8 family,
				    struct packet *p, int quoted)
{
	p->family = family;
	if (family == 4) {
		__u8 h[20];
		if (parse_load(skb, off, h, sizeof(h)) < 0)
			return PARSE_MALFORMED;
		__u32 ihl = (h[0] & 0x0f) * 4;
		if ((h[0] >> 4) != 4 || ihl < 20)
			return PARSE_MALFORMED;
		p->proto = h[9];
		p->hop_limit = h[8];
		__builtin_memcpy(p->src, &h[12], 4);
		__builtin_memcpy(p->dst, &h[16], 4);
		__u16 frag = ((__u16)h[6] << 8) | h[7];
		if (frag & 0x3fff) {
			p->frag_id = ((__u32)h[4] << 8) | h[5];
			p->frag = (frag & 0x1fff) ? FRAG_LATER : FRAG_FIRST;
		}
		p->l4_off = off + ihl;
		return parse_l4(skb, p, quoted);
	}

	__u8 h[40];
	if (parse_load(skb, off, h, sizeof(h)) < 0)
		return PARSE_MALFORMED;
	if ((h[0] >> 4) != 6)
		return PARSE_MALFORMED;
	__u8 next = h[6];
	p->hop_limit = h[7];
	__builtin_memcpy(p->src, &h[8], 16);
	__builtin_memcpy(p->dst, &h[24], 16);
	off += 40;
#pragma unroll
	for (int i = 0; i < IPV6_MAX_EXT_HEADERS; i++) {
		if (!is_ipv6_ext(next))
			break;
		__u8 ext[8];
		if (next == NEXTHDR_FRAGMENT) {
			if (p->frag != FRAG_NONE ||
			    parse_load(skb, off, ext, sizeof(ext)) < 0)
				return PARSE_MALFORMED;
			__u16 offset = (((__u16)ext[2] << 8) | ext[3]) & 0xfff8;
			__u32 id;
			__builtin_memcpy(&id, &ext[4], 4);
			p->ext |= EXT_OTHER;
			if (offset) {
				p->frag = FRAG_LATER;
				p->frag_id = id;
				p->proto = ext[0];
				p->l4_off = off + 8;
				return PARSE_OK;
			}
			if (ext[3] & 1) {
				p->frag = FRAG_FIRST;
				p->frag_id = id;
			}
			off += 8;
		} else {
			if (parse_load(skb, off, ext, 2) < 0)
				return PARSE_MALFORMED;
			if (next == NEXTHDR_HOP) {
				/* RFC 8200: only directly after the IPv6 header. */
				if (i != 0)
					return PARSE_MALFORMED;
				p->ext |= EXT_HOP;
			} else {
				p->ext |= EXT_OTHER;
			}
			off += next == NEXTHDR_AUTH ? ((__u32)ext[1] + 2) * 4 : ((__u32)ext[1] + 1) * 8;
		}
		next = ext[0];
	}
	if (is_ipv6_ext(next))
		return PARSE_MALFORMED;
	p->proto = next;
	p->l4_off = off;
	return parse_l4(skb, p, quoted);
}

/* parse_quote parses the packet an ICMP error quotes (same family). */
static __always_inline int parse_quote(PARSE_CTX *skb, const struct packet *p,
				       struct packet *q)
{
	if (parse_ip(skb, p->l4_off + 8, p->family, q, 1) != PARSE_OK)
		return PARSE_MALFORMED;
	/* A quoted later fragment has no ports to match a flow with. */
	return q->frag == FRAG_LATER ? PARSE_MALFORMED : PARSE_OK;
}

/* is_link_control reports IPv6 link control that passes without policy:
 * neighbour discovery (RFC 4861: hop limit 255, which no router forwards,
 * no extension headers) and MLD (RFC 2710/3810: hop limit 1, link-local or
 * unspecified source, at most a hop-by-hop router alert), both only to a
 * link-local or multicast destination. Anything else, including IPv4
 * protocol 58 and unicast ND to a global address, goes through policy. */
static __always_inline int is_link_control(const struct packet *p)
{
	if (p->family != 6 || p->proto != IPPROTO_ICMPV6 || p->frag != FRAG_NONE)
		return 0;
	if (!ip6_is_link_local(p->dst) && !ip6_is_multicast(p->dst))
		return 0;
	__u8 t = p->icmp_type;
	if (t >= ICMP6_ROUTER_SOLICIT && t <= ICMP6_REDIRECT)
		return p->hop_limit == 255 && p->ext == 0;
	if ((t >= ICMP6_MLD_QUERY && t <= ICMP6_MLD_DONE) || t == ICMP6_MLD2_REPORT)
		return p->hop_limit == 1 && (p->ext & ~EXT_HOP) == 0 &&
		       (ip6_is_link_local(p->src) || ip6_is_unspecified(p->src));
	return 0;
}
