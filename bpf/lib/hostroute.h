/* eBPF host routing: pod-to-pod packets between this node's pods and other
 * nodes' pod blocks skip the host's routing and forwarding path (and the
 * second veth crossing) once the endpoint's policy allowed them:
 *  - ingress: a packet arriving from another node for a local primary
 *    endpoint is judged by that endpoint's ingress policy right on the
 *    uplink's tc ingress, then handed to the pod's interface with
 *    bpf_redirect_peer;
 *  - egress: a packet a pod sends to another node's block leaves through
 *    the FIB's next hop with bpf_redirect_neigh (or, in vxlan routing, by
 *    the eBPF tunnel: lib/tunnel.h).
 * Only TCP and UDP, unfragmented, whose flow the host's conntrack does not
 * know (a flow kube-proxy or any other host NAT translated must meet its
 * translation on the normal path), with a TTL/hop limit above 1 (the stack
 * answers the others with ICMP). Everything else takes the normal path. */
#pragma once

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "../coordino.h"
#include "clock.h"
#include "policy.h"
#include "memo.h"
#include "kfuncs.h"
#include "conntrack.h"

#ifndef AF_INET
#define AF_INET 2
#endif
#ifndef AF_INET6
#define AF_INET6 10
#endif
#ifndef ENOENT
#define ENOENT 2
#endif
#define HR_PACKET_HOST 0 /* skb->pkt_type of frames addressed to this host */

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1 << 17);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct local_ep_key);
	__type(value, struct local_ep);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cdo_local_eps SEC(".maps");

/* peer_blocks: the other nodes' pod blocks (ipcache_key layout), written
 * from the peer set by the daemon's router. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 1 << 16);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct ipcache_key);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cdo_peer_blocks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, HR_STAT_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cdo_hostroute_stats SEC(".maps");

/* The host conntrack lookup (nf_conntrack's kfunc). Weak, and called only
 * where the loader found it (cdo_have_ct_lookup, from the daemon's kernel
 * probe): otherwise the fast path stays off (hr_host_tracked answers
 * "tracked"), since host NAT could appear at any time after the programs
 * loaded. A load-time constant rather than bpf_ksym_exists(): when the kfunc
 * lives in a module (nf_conntrack built as one, as distributions do), the
 * loader encodes that test as an instruction older kernels' verifiers refuse
 * ("BPF_LD_IMM64 uses reserved fields"); a constant branch is pruned as dead
 * code on every kernel, and so is the call it guards. */
volatile const __u8 cdo_have_ct_lookup = 0;

/* hr_packet: what host routing reads of a packet. */
struct hr_packet {
	__u8 family;
	__u8 proto;
	__u8 ttl;
	__u8 tcp_flags;
	__be16 sport;
	__be16 dport;
	__u8 src[16];
	__u8 dst[16];
};

/* fib_cache: per CPU, the FIB's answers to the last lookups of a few
 * flows (hr_fib). A FIB lookup is the dearest part of host routing's way
 * out (docs/benchmarks.md); a flow's every packet asks the same question.
 * The daemon empties it on every route, rule, nexthop or link change in
 * the host's namespace, and an answer older than HR_FIB_TTL_NS is asked
 * again, so a change the daemon misses (it is down) holds for at most that
 * long. */
#define HR_FIB_SLOT_BITS 6
#define HR_FIB_SLOTS (1 << HR_FIB_SLOT_BITS)
#define HR_FIB_TTL_NS 1000000000ULL

union hr_fib_params {
	struct bpf_fib_lookup p;
	__u64 w[8]; /* w[0..MEMO_KEY_WORDS-1]: the lookup's input (family to destination) */
};

struct hr_fib_entry {
	__u64 expires_ns;
	__u64 in[MEMO_KEY_WORDS]; /* hr_fib_params.w[0..MEMO_KEY_WORDS-1] */
	__u64 out[8]; /* the answer, a struct bpf_fib_lookup */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, HR_FIB_SLOTS);
	__type(key, __u32);
	__type(value, struct hr_fib_entry);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cdo_fib_cache SEC(".maps");

static __always_inline void hr_count(__u32 stat)
{
	__u64 *c = bpf_map_lookup_elem(&cdo_hostroute_stats, &stat);
	if (c)
		*c += 1;
}

/* hostroute_config returns the configuration when host routing is on. */
static __always_inline const struct config *hostroute_config(void)
{
	__u32 zero = 0;
	struct config *cfg = bpf_map_lookup_elem(&cdo_config, &zero);
	return cfg && (cfg->flags & CFG_HOST_ROUTING) ? cfg : NULL;
}

/* hr_parse_at reads the unfragmented TCP or UDP packet of EtherType proto
 * at l3_off, without IPv4 options or IPv6 extension headers; 0 for anything
 * else. */
static __always_inline int hr_parse_at(struct __sk_buff *skb, __u32 l3_off, __be16 proto,
				       struct hr_packet *h)
{
	__u32 l4_off;
	if (proto == bpf_htons(ETH_P_IP)) {
		__u8 ip[20];
		if (bpf_skb_load_bytes(skb, l3_off, ip, sizeof(ip)) < 0)
			return 0;
		if (ip[0] != 0x45 || (((ip[6] << 8) | ip[7]) & 0x3fff)) /* options, MF, offset */
			return 0;
		h->family = 4;
		h->ttl = ip[8];
		h->proto = ip[9];
		__builtin_memcpy(h->src, &ip[12], 4);
		__builtin_memcpy(h->dst, &ip[16], 4);
		l4_off = l3_off + 20;
	} else if (proto == bpf_htons(ETH_P_IPV6)) {
		__u8 ip[40];
		if (bpf_skb_load_bytes(skb, l3_off, ip, sizeof(ip)) < 0 || (ip[0] >> 4) != 6)
			return 0;
		h->family = 6;
		h->proto = ip[6];
		h->ttl = ip[7];
		__builtin_memcpy(h->src, &ip[8], 16);
		__builtin_memcpy(h->dst, &ip[24], 16);
		l4_off = l3_off + 40;
	} else {
		return 0;
	}
	/* Ports, and TCP's flags at offset 13. */
	__u8 l4[14];
	if (h->proto == IPPROTO_TCP) {
		if (bpf_skb_load_bytes(skb, l4_off, l4, 14) < 0)
			return 0;
		h->tcp_flags = l4[13];
	} else if (h->proto != IPPROTO_UDP || bpf_skb_load_bytes(skb, l4_off, l4, 4) < 0) {
		return 0;
	}
	__builtin_memcpy(&h->sport, &l4[0], 2);
	__builtin_memcpy(&h->dport, &l4[2], 2);
	return h->ttl > 1;
}

/* hr_parse reads an Ethernet frame's packet (hr_parse_at). */
static __always_inline int hr_parse(struct __sk_buff *skb, struct hr_packet *h)
{
	return hr_parse_at(skb, ETH_HLEN, skb->protocol, h);
}

/* hr_host_tracked reports whether the host's conntrack has an entry for
 * h's flow, in either direction (its lookup matches both tuples): then the
 * flow may carry a NAT binding and the normal path must handle it. Without
 * the kfunc (cdo_have_ct_lookup), or on a failed lookup, it answers yes. */
static __always_inline int hr_host_tracked(struct __sk_buff *skb, const struct hr_packet *h)
{
	if (!cdo_have_ct_lookup)
		return 1;
	struct bpf_sock_tuple t = {};
	__u32 tsize;
	if (h->family == 4) {
		__builtin_memcpy(&t.ipv4.saddr, h->src, 4);
		__builtin_memcpy(&t.ipv4.daddr, h->dst, 4);
		t.ipv4.sport = h->sport;
		t.ipv4.dport = h->dport;
		tsize = sizeof(t.ipv4);
	} else {
		__builtin_memcpy(t.ipv6.saddr, h->src, 16);
		__builtin_memcpy(t.ipv6.daddr, h->dst, 16);
		t.ipv6.sport = h->sport;
		t.ipv6.dport = h->dport;
		tsize = sizeof(t.ipv6);
	}
	struct bpf_ct_opts opts = {.netns_id = -1, .l4proto = h->proto};
	struct nf_conn *ct = bpf_skb_ct_lookup(skb, &t, tsize, &opts, BPF_CT_OPTS_SZ);
	if (ct) {
		bpf_ct_release(ct);
		hr_count(HR_STAT_HOST_TRACKED);
		return 1;
	}
	return opts.error != -ENOENT;
}

/* hr_flow: a host-routing candidate and, for its flow's established
 * packets, this CPU's memo entry (lib/conntrack.h) when it has one: the
 * policy's verdict, and whether the host's conntrack knew the flow. */
struct hr_flow {
	struct hr_packet h;
	struct ct_memo_entry *memo;
	__u64 key[MEMO_KEY_WORDS];
};

/* hr_flow_memo looks up f's memo entry as the packet's endpoint (on
 * ifindex, in dir) would: the same key and revision as handle(). */
static __always_inline void hr_flow_memo(struct hr_flow *f, const struct config *cfg, __u32 ifindex,
					 __u8 dir)
{
	const struct hr_packet *h = &f->h;
	ct_memo_flow_key(f->key, ifindex, dir, h->proto, h->family, h->sport, h->dport, h->src, h->dst);
	if (ct_memo_answers(h->proto, h->tcp_flags, FRAG_NONE))
		f->memo = ct_memo_find(f->key, cfg->policy_revision, now_ns());
}

/* hr_flow_of parses skb's packet into f and looks up its memo entry as the
 * endpoint on ifindex sees it in dir; 0 when host routing cannot carry it. */
static __always_inline int hr_flow_of(struct __sk_buff *skb, const struct config *cfg, __u32 ifindex,
				      __u8 dir, struct hr_flow *f)
{
	if (!hr_parse(skb, &f->h))
		return 0;
	hr_flow_memo(f, cfg, ifindex, dir);
	return 1;
}

/* hr_flow_host_tracked is hr_host_tracked, remembered for a TCP flow in
 * its memo entry: an established TCP flow the host's conntrack did not know
 * when last asked is not asked again while the entry lives (at most
 * CT_MEMO_TTL_NS). Its answer only changes when a new connection starts on
 * the same addresses and ports, say one a host NAT translated onto them
 * (a Service's backend answering from the same port): its first packet
 * here carries SYN, and drops the answer from every CPU's memo before the
 * host's conntrack is asked. UDP has no such first packet: asked every
 * time. */
static __always_inline int hr_flow_host_tracked(struct __sk_buff *skb, struct hr_flow *f)
{
	int tcp = f->h.proto == IPPROTO_TCP;
	if (tcp && (f->h.tcp_flags & TCP_SYN))
		ct_memo_forget_everywhere(f->key);
	else if (tcp && f->memo && (f->memo->flags & CT_MEMO_HOST_UNTRACKED))
		return 0;
	if (hr_host_tracked(skb, &f->h))
		return 1;
	if (tcp && f->memo)
		f->memo->flags |= CT_MEMO_HOST_UNTRACKED;
	return 0;
}

/* hr_fib is bpf_fib_lookup(skb, &f->p, BPF_FIB_LOOKUP_SKIP_NEIGH): the
 * next hop for bpf_redirect_neigh to resolve, and the egress device's MTU,
 * against which skb is checked as the lookup checks it. A success is
 * remembered in this CPU's cdo_fib_cache and answers the same input again
 * until it expires or the daemon empties the cache. */
static __always_inline int hr_fib(struct __sk_buff *skb, union hr_fib_params *f)
{
	__u32 slot = memo_slot(f->w, HR_FIB_SLOT_BITS);
	struct hr_fib_entry *e = bpf_map_lookup_elem(&cdo_fib_cache, &slot);
	__u64 now = now_ns();
	if (e && now < e->expires_ns && memo_key_equal(e->in, f->w)) {
		__builtin_memcpy(f->w, e->out, sizeof(f->w));
		/* The lookup's own check: is_skb_forwardable(). */
		if (skb->len <= f->p.mtu_result + ETH_HLEN + 4 || skb->gso_size)
			return BPF_FIB_LKUP_RET_SUCCESS;
		return BPF_FIB_LKUP_RET_FRAG_NEEDED;
	}
	__u64 in[MEMO_KEY_WORDS];
	__builtin_memcpy(in, f->w, sizeof(in));
	int rc = bpf_fib_lookup(skb, &f->p, sizeof(f->p), BPF_FIB_LOOKUP_SKIP_NEIGH);
	if (rc == BPF_FIB_LKUP_RET_SUCCESS && e) {
		__builtin_memcpy(e->in, in, sizeof(in));
		__builtin_memcpy(e->out, f->w, sizeof(e->out));
		e->expires_ns = now + HR_FIB_TTL_NS;
	}
	return rc;
}

/* hr_dec_ttl_at does the router's TTL (IPv4, with the header checksum) or
 * hop limit decrement of h, at l3_off; hr_parse saw it above 1. */
static __always_inline int hr_dec_ttl_at(struct __sk_buff *skb, __u32 l3_off, const struct hr_packet *h)
{
	__u8 ttl = h->ttl - 1;
	if (h->family == 6)
		return bpf_skb_store_bytes(skb, l3_off + 7, &ttl, 1, 0);
	/* TTL and protocol share the checksummed 16-bit word at offset 8. */
	__be16 old = bpf_htons(((__u16)h->ttl << 8) | h->proto);
	__be16 new = bpf_htons(((__u16)ttl << 8) | h->proto);
	if (bpf_l3_csum_replace(skb, l3_off + 10, old, new, 2) < 0)
		return -1;
	return bpf_skb_store_bytes(skb, l3_off + 8, &ttl, 1, 0);
}

static __always_inline int hr_dec_ttl(struct __sk_buff *skb, const struct hr_packet *h)
{
	return hr_dec_ttl_at(skb, ETH_HLEN, h);
}

/* hr_block_key is the key that finds addr (of family) in a map of blocks. */
static __always_inline struct ipcache_key hr_block_key(__u8 family, const __u8 *addr)
{
	struct ipcache_key k = {.prefixlen = 32 + (family == 4 ? 32 : 128), .family = family};
	__builtin_memcpy(k.addr, addr, 16);
	return k;
}

/* hr_in_peer_block: addr (of family) is in another node's pod block. */
static __always_inline int hr_in_peer_block(__u8 family, const __u8 *addr)
{
	struct ipcache_key k = hr_block_key(family, addr);
	return bpf_map_lookup_elem(&cdo_peer_blocks, &k) != NULL;
}

/* hr_from_peer: h comes from another node's pod block. Host routing
 * carries pod-to-pod traffic only; other sources keep the host's filters. */
static __always_inline int hr_from_peer(const struct hr_packet *h)
{
	return hr_in_peer_block(h->family, h->src);
}

/* hr_local_ep returns a copy of the local primary endpoint owning h's
 * destination, or 0. */
static __always_inline int hr_local_ep(const struct hr_packet *h, struct local_ep *out)
{
	struct local_ep_key k = {.family = h->family};
	__builtin_memcpy(k.addr, h->dst, 16);
	struct local_ep *e = bpf_map_lookup_elem(&cdo_local_eps, &k);
	if (!e)
		return 0;
	*out = *e;
	return 1;
}

/* hr_into_pod rewrites the frame as the host veth would send it and
 * redirects it into the pod's namespace; TC_ACT_UNSPEC (normal path) if a
 * rewrite fails. */
static __always_inline int hr_into_pod(struct __sk_buff *skb, const struct hr_packet *h,
				       const struct local_ep *ep)
{
	__u8 macs[12];
	__builtin_memcpy(macs, ep->pod_mac, 6);
	__builtin_memcpy(&macs[6], ep->host_mac, 6);
	if (bpf_skb_store_bytes(skb, 0, macs, sizeof(macs), 0) < 0 || hr_dec_ttl(skb, h) < 0)
		return TC_ACT_UNSPEC;
	hr_count(HR_STAT_IN_REDIRECTED);
	return bpf_redirect_peer(ep->ifindex, 0);
}

/* hr_route_out sends a pod's packet h, arriving on ifindex, to another
 * node's block through the FIB's next hop; TC_ACT_UNSPEC (normal path)
 * when it cannot. */
static __always_inline int hr_route_out(struct __sk_buff *skb, __u32 ifindex, const struct hr_packet *h)
{
	union hr_fib_params fib = {.p = {
		.l4_protocol = h->proto,
		.sport = h->sport,
		.dport = h->dport,
		.ifindex = ifindex,
	}};
	if (h->family == 4) {
		fib.p.family = AF_INET;
		__builtin_memcpy(&fib.p.ipv4_src, h->src, 4);
		__builtin_memcpy(&fib.p.ipv4_dst, h->dst, 4);
	} else {
		fib.p.family = AF_INET6;
		__builtin_memcpy(fib.p.ipv6_src, h->src, 16);
		__builtin_memcpy(fib.p.ipv6_dst, h->dst, 16);
	}
	/* A packet over the next hop's MTU gets FRAG_NEEDED and the normal
	 * path's ICMP. */
	if (hr_fib(skb, &fib) != BPF_FIB_LKUP_RET_SUCCESS) {
		hr_count(HR_STAT_NO_ROUTE);
		return TC_ACT_UNSPEC;
	}
	struct bpf_redir_neigh nh = {};
	if (fib.p.family == AF_INET) {
		nh.nh_family = AF_INET;
		nh.ipv4_nh = fib.p.ipv4_dst;
	} else {
		nh.nh_family = AF_INET6;
		__builtin_memcpy(nh.ipv6_nh, fib.p.ipv6_dst, 16);
	}
	if (hr_dec_ttl(skb, h) < 0)
		return TC_ACT_UNSPEC;
	hr_count(HR_STAT_OUT_REDIRECTED);
	return bpf_redirect_neigh(fib.p.ifindex, &nh, sizeof(nh), 0);
}
