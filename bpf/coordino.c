//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Coordino endpoint programs, attached to the host side of every pod
 * interface: cdo_from_ep on its ingress (the pod's egress) and cdo_to_ep on
 * its egress (the pod's ingress). Both enforce identity-based network policy
 * with connection tracking, count verdicts and report new flows. Allowed
 * packets return TC_ACT_UNSPEC (tcx: TCX_NEXT) so later programs still run. */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "coordino.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* Make these types visible in BTF so bpf2go can generate Go for them. */
const enum reason *unused_reason __attribute__((unused));
const enum direction *unused_direction __attribute__((unused));
const struct flow_event *unused_flow_event __attribute__((unused));

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
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1 << 18);
	__type(key, struct ct_key);
	__type(value, struct ct_entry);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cdo_conntrack SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cdo_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2 * REASON_SLOTS);
	__type(key, __u32);
	__type(value, struct counter);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cdo_counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cdo_flows SEC(".maps");

#ifndef IPPROTO_ICMPV6
#define IPPROTO_ICMPV6 58
#endif
#define ND_ROUTER_SOLICIT 133
#define ND_REDIRECT 137
/* Multicast listener discovery: link-local control like neighbour discovery. */
#define MLD_QUERY 130
#define MLD_DONE 132
#define MLD2_REPORT 143
#define CT_TCP_LIFETIME_NS (6ULL * 3600 * 1000000000ULL)
#define CT_CLOSING_LIFETIME_NS (10ULL * 1000000000ULL)
#define CT_OTHER_LIFETIME_NS (60ULL * 1000000000ULL)
#define CT_REFRESH_NS 1000000000ULL

/* Allowed-flow events wake the daemon only once this much is queued; below
 * it the daemon's periodic poll (daemon/datapath flowPollInterval) collects
 * them, so a burst of new connections costs one wakeup, not one each. */
#define FLOW_WAKEUP_BYTES (256 * 1024)

#define TCP_FIN 0x01
#define TCP_RST 0x04
#define TCP_SYN 0x02
#define TCP_ACK 0x10

enum parse_result {
	PARSE_OK,
	PARSE_NOT_IP,
	PARSE_MALFORMED,
	PARSE_NEIGHBOR,
};

/* A parsed packet; ICMP errors also carry the tuple of the packet they quote. */
struct packet {
	__u8 family;
	__u8 proto;
	__u8 tcp_flags;
	__u8 icmp_error;
	__be16 sport;
	__be16 dport;
	__u8 src[16];
	__u8 dst[16];
};

static __always_inline int is_port_proto(__u8 proto)
{
	return proto == IPPROTO_TCP || proto == IPPROTO_UDP || proto == IPPROTO_SCTP;
}

/* parse_l4 fills ports (or the ICMP echo id) of p from the L4 header at off.
 * Error messages set icmp_error and leave the quoted header at *inner. */
static __always_inline int parse_l4(struct __sk_buff *skb, __u32 off, struct packet *p,
				    __u32 *inner)
{
	__u8 hdr[8];

	if (is_port_proto(p->proto)) {
		if (bpf_skb_load_bytes(skb, off, hdr, p->proto == IPPROTO_TCP ? 8 : 4) < 0)
			return PARSE_MALFORMED;
		__builtin_memcpy(&p->sport, &hdr[0], 2);
		__builtin_memcpy(&p->dport, &hdr[2], 2);
		if (p->proto == IPPROTO_TCP) {
			if (bpf_skb_load_bytes(skb, off + 13, &p->tcp_flags, 1) < 0)
				return PARSE_MALFORMED;
		}
		return PARSE_OK;
	}
	if (p->proto == IPPROTO_ICMP || p->proto == IPPROTO_ICMPV6) {
		if (bpf_skb_load_bytes(skb, off, hdr, 8) < 0)
			return PARSE_MALFORMED;
		__u8 type = hdr[0];
		if (p->proto == IPPROTO_ICMP) {
			if (type == 8 || type == 0) { /* echo request / reply */
				__builtin_memcpy(&p->sport, &hdr[4], 2);
				p->dport = p->sport;
			} else if (type == 3 || type == 11 || type == 12) {
				p->icmp_error = 1;
				*inner = off + 8;
			}
		} else {
			if (type == 128 || type == 129) {
				__builtin_memcpy(&p->sport, &hdr[4], 2);
				p->dport = p->sport;
			} else if (type >= 1 && type <= 4) {
				p->icmp_error = 1;
				*inner = off + 8;
			} else if ((type >= ND_ROUTER_SOLICIT && type <= ND_REDIRECT) ||
				   (type >= MLD_QUERY && type <= MLD_DONE) || type == MLD2_REPORT) {
				return PARSE_NEIGHBOR;
			}
		}
	}
	return PARSE_OK;
}

/* parse_ip parses the IP header at off and its L4 header; it also parses the
 * packet quoted by an ICMP error, whose first 8 L4 bytes are always present. */
static __always_inline int parse_ip(struct __sk_buff *skb, __u32 off, __u8 family,
				    struct packet *p, __u32 *inner)
{
	p->family = family;
	if (family == 4) {
		__u8 h[20];
		if (bpf_skb_load_bytes(skb, off, h, sizeof(h)) < 0)
			return PARSE_MALFORMED;
		__u32 ihl = (h[0] & 0x0f) * 4;
		if ((h[0] >> 4) != 4 || ihl < 20)
			return PARSE_MALFORMED;
		p->proto = h[9];
		__builtin_memcpy(p->src, &h[12], 4);
		__builtin_memcpy(p->dst, &h[16], 4);
		/* Non-first fragments carry no ports: match them as port 0. */
		if (((h[6] & 0x1f) | h[7]) != 0)
			return PARSE_OK;
		return parse_l4(skb, off + ihl, p, inner);
	}

	__u8 h[40];
	if (bpf_skb_load_bytes(skb, off, h, sizeof(h)) < 0)
		return PARSE_MALFORMED;
	if ((h[0] >> 4) != 6)
		return PARSE_MALFORMED;
	__u8 next = h[6];
	__builtin_memcpy(p->src, &h[8], 16);
	__builtin_memcpy(p->dst, &h[24], 16);
	off += 40;
#pragma unroll
	for (int i = 0; i < 4; i++) {
		__u8 ext[2];
		if (next != 0 && next != 43 && next != 44 && next != 60 && next != 51)
			break;
		if (bpf_skb_load_bytes(skb, off, ext, sizeof(ext)) < 0)
			return PARSE_MALFORMED;
		if (next == 44) { /* fragment header */
			__u8 frag[4];
			if (bpf_skb_load_bytes(skb, off, frag, sizeof(frag)) < 0)
				return PARSE_MALFORMED;
			if (((frag[2] << 8) | (frag[3] & 0xf8)) != 0) {
				p->proto = ext[0];
				return PARSE_OK;
			}
			off += 8;
		} else if (next == 51) {
			off += (ext[1] + 2) * 4;
		} else {
			off += (ext[1] + 1) * 8;
		}
		next = ext[0];
	}
	p->proto = next;
	return parse_l4(skb, off, p, inner);
}

static __always_inline void count(__u8 dir, __u32 reason, __u32 len)
{
	__u32 idx = dir * REASON_SLOTS + reason;
	struct counter *c = bpf_map_lookup_elem(&cdo_counters, &idx);
	if (c) {
		c->packets++;
		c->bytes += len;
	}
}

static __always_inline struct ipcache_value lookup_identity(__u8 family, const __u8 *addr)
{
	struct ipcache_value world = {.identity = ID_WORLD, .cidr_identity = ID_WORLD};
	struct ipcache_key k = {.family = family};
	if (family == 4) {
		k.prefixlen = 32 + 32;
		__builtin_memcpy(k.addr, addr, 4);
	} else {
		k.prefixlen = 32 + 128;
		__builtin_memcpy(k.addr, addr, 16);
	}
	struct ipcache_value *v = bpf_map_lookup_elem(&cdo_ipcache, &k);
	return v ? *v : world;
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

/* decide returns the verdict reason for a new flow in direction dir. */
static __always_inline __u32 decide(const struct endpoint_info *ep, __u8 dir,
				    const struct ipcache_value *remote, __u8 proto, __be16 dport)
{
	/* Kubelet probes and other traffic from this node are always allowed. */
	if (dir == DIR_INGRESS && remote->identity == ID_HOST)
		return REASON_HOST;
	__u32 isolated = dir == DIR_INGRESS ? EP_INGRESS_ISOLATED : EP_EGRESS_ISOLATED;
	if (!(ep->flags & isolated))
		return REASON_NOT_ISOLATED;
	if (!is_port_proto(proto))
		dport = 0;
	if (policy_allows(ep->identity, remote, dir, proto, dport))
		return REASON_POLICY;
	return REASON_POLICY_DENIED;
}

static __always_inline void tuple_key(struct ct_key *k, __u32 ifindex, __u8 dir,
				      const struct packet *p, int reverse)
{
	k->ifindex = ifindex;
	k->dir = dir;
	k->proto = p->proto;
	k->family = p->family;
	k->pad = 0;
	if (!reverse) {
		k->sport = p->sport;
		k->dport = p->dport;
		__builtin_memcpy(k->src, p->src, 16);
		__builtin_memcpy(k->dst, p->dst, 16);
	} else {
		k->sport = p->dport;
		k->dport = p->sport;
		__builtin_memcpy(k->src, p->dst, 16);
		__builtin_memcpy(k->dst, p->src, 16);
	}
}

static __always_inline __u64 lifetime(const struct ct_key *k, const struct ct_entry *e)
{
	if (e->flags & CT_CLOSING)
		return CT_CLOSING_LIFETIME_NS;
	return k->proto == IPPROTO_TCP ? CT_TCP_LIFETIME_NS : CT_OTHER_LIFETIME_NS;
}

enum ct_state {
	CT_NEW,
	CT_ESTABLISHED,
	CT_REPLY,
	CT_REVOKED,
};

/* ct_check looks up the packet p seen in direction dir on ifindex. A tracked
 * flow checked against an older policy revision is re-decided first. */
static __always_inline int ct_check(const struct endpoint_info *ep, __u32 ifindex, __u8 dir,
				    const struct packet *p, const struct ipcache_value *remote,
				    __u32 revision,
				    __u64 now)
{
	struct ct_key k = {};
	int state = CT_ESTABLISHED;
	__u8 origin = dir;
	__be16 dport = p->dport;

	tuple_key(&k, ifindex, dir, p, 0);
	struct ct_entry *e = bpf_map_lookup_elem(&cdo_conntrack, &k);
	if (!e) {
		origin = dir ^ 1;
		dport = p->sport;
		state = CT_REPLY;
		tuple_key(&k, ifindex, origin, p, 1);
		e = bpf_map_lookup_elem(&cdo_conntrack, &k);
		if (!e)
			return CT_NEW;
	}
	if (now - e->last_seen_ns > lifetime(&k, e)) {
		bpf_map_delete_elem(&cdo_conntrack, &k);
		return CT_NEW;
	}
	if (e->revision != revision) {
		if (decide(ep, origin, remote, p->proto, dport) >= REASON_FIRST_DROP) {
			bpf_map_delete_elem(&cdo_conntrack, &k);
			return CT_REVOKED;
		}
		e->revision = revision;
	}
	if (p->tcp_flags & (TCP_FIN | TCP_RST))
		e->flags |= CT_CLOSING;
	if (now - e->last_seen_ns > CT_REFRESH_NS)
		e->last_seen_ns = now;
	return state;
}

static __always_inline void emit(struct __sk_buff *skb, const struct endpoint_info *ep, __u8 dir,
				 const struct packet *p, const struct ipcache_value *remote,
				 __u32 reason, __u64 now)
{
	/* Drops are rare and wanted at once: the default wakes the reader when
	 * it has caught up. Allowed flows are batched (FLOW_WAKEUP_BYTES). */
	__u64 wake = 0;
	if (reason < REASON_FIRST_DROP)
		wake = bpf_ringbuf_query(&cdo_flows, BPF_RB_AVAIL_DATA) >= FLOW_WAKEUP_BYTES ?
			       BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP;
	struct flow_event *ev = bpf_ringbuf_reserve(&cdo_flows, sizeof(*ev), 0);
	if (!ev) {
		count(dir, REASON_EVENT_LOST, 0);
		return;
	}
	ev->ts_ns = now;
	ev->ifindex = skb->ifindex;
	ev->local_id = ep ? ep->identity : 0;
	ev->remote_id = remote->identity;
	ev->family = p->family;
	ev->proto = p->proto;
	ev->dir = dir;
	ev->reason = reason;
	ev->sport = p->sport;
	ev->dport = p->dport;
	__builtin_memcpy(ev->src, p->src, 16);
	__builtin_memcpy(ev->dst, p->dst, 16);
	bpf_ringbuf_submit(ev, wake);
}

static __always_inline int verdict(struct __sk_buff *skb, __u8 dir, __u32 reason)
{
	count(dir, reason, skb->len);
	return reason >= REASON_FIRST_DROP ? TC_ACT_SHOT : TC_ACT_UNSPEC;
}

static __always_inline int handle(struct __sk_buff *skb, __u8 dir)
{
	struct packet p = {};
	__u32 inner = 0;
	__u8 family;

	if (skb->protocol == bpf_htons(ETH_P_IP))
		family = 4;
	else if (skb->protocol == bpf_htons(ETH_P_IPV6))
		family = 6;
	else
		return verdict(skb, dir, REASON_NOT_IP);

	__u32 ifindex = skb->ifindex;
	struct endpoint_info *ep = bpf_map_lookup_elem(&cdo_endpoints, &ifindex);
	if (!ep)
		return verdict(skb, dir, REASON_NO_ENDPOINT);

	int res = parse_ip(skb, ETH_HLEN, family, &p, &inner);
	if (res == PARSE_NEIGHBOR)
		return verdict(skb, dir, REASON_NEIGHBOR);
	if (res != PARSE_OK)
		return verdict(skb, dir, REASON_MALFORMED);

	__u64 now = bpf_ktime_get_ns();
	__u32 zero = 0;
	struct config *cfg = bpf_map_lookup_elem(&cdo_config, &zero);
	__u32 revision = cfg ? cfg->policy_revision : 0;
	struct ipcache_value remote = lookup_identity(family, dir == DIR_EGRESS ? p.dst : p.src);

	if (p.icmp_error) {
		/* The quoted packet went the other way through this endpoint. */
		struct packet q = {};
		__u32 unused = 0;
		if (parse_ip(skb, inner, family, &q, &unused) == PARSE_OK) {
			int st = ct_check(ep, ifindex, dir ^ 1, &q, &remote, revision, now);
			if (st == CT_ESTABLISHED || st == CT_REPLY)
				return verdict(skb, dir, REASON_RELATED);
		}
	}

	switch (ct_check(ep, ifindex, dir, &p, &remote, revision, now)) {
	case CT_ESTABLISHED:
		return verdict(skb, dir, REASON_ESTABLISHED);
	case CT_REPLY:
		return verdict(skb, dir, REASON_REPLY);
	case CT_REVOKED:
		emit(skb, ep, dir, &p, &remote, REASON_POLICY_REVOKED, now);
		return verdict(skb, dir, REASON_POLICY_REVOKED);
	}

	__u32 reason = decide(ep, dir, &remote, p.proto, p.dport);
	/* Only a TCP SYN opens a tracked connection: a mid-stream segment with
	 * no entry (e.g. the peer's retransmission after a revocation) passes
	 * on its own verdict but must not make the other side's packets replies. */
	int opens = p.proto != IPPROTO_TCP || (p.tcp_flags & (TCP_SYN | TCP_ACK)) == TCP_SYN;
	if (reason < REASON_FIRST_DROP && opens) {
		struct ct_key k = {};
		struct ct_entry e = {.last_seen_ns = now, .revision = revision};
		tuple_key(&k, ifindex, dir, &p, 0);
		bpf_map_update_elem(&cdo_conntrack, &k, &e, BPF_ANY);
	}
	/* Drops are always reported; allowed flows only when observed (see
	 * CFG_EMIT_ALLOWED): the counters below stay exact either way. */
	if (reason >= REASON_FIRST_DROP || (cfg && (cfg->flags & CFG_EMIT_ALLOWED)))
		emit(skb, ep, dir, &p, &remote, reason, now);
	return verdict(skb, dir, reason);
}

/* cdo_from_ep runs on the host interface's ingress: packets leaving the pod. */
SEC("tc")
int cdo_from_ep(struct __sk_buff *skb)
{
	return handle(skb, DIR_EGRESS);
}

/* cdo_to_ep runs on the host interface's egress: packets towards the pod. */
SEC("tc")
int cdo_to_ep(struct __sk_buff *skb)
{
	return handle(skb, DIR_INGRESS);
}
