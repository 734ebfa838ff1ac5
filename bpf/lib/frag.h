/* Fragment tracking: later fragments carry no L4 header, so the ports of
 * the first fragment are remembered by (interface, addresses, protocol, IP
 * ID) and lent to the rest. A later fragment whose first fragment was not
 * seen (or not allowed) gets no ports and is dropped where ports matter:
 * fail closed, the sender's retransmission recovers. */
#pragma once

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "parse.h"

struct frag_key {
	__u32 ifindex;
	__u8 family;
	__u8 proto;
	__u8 pad[2];
	__u32 id;
	__u8 src[16];
	__u8 dst[16];
};

struct frag_ports {
	__u64 seen_ns;
	__be16 sport;
	__be16 dport;
	__u32 pad;
};

/* IPv6 reassembly gives up after 60 s (IPv4: 30 s). */
#define FRAG_LIFETIME_NS (60 * 1000000000ULL)

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct frag_key);
	__type(value, struct frag_ports);
} cdo_frags SEC(".maps");

static __always_inline void frag_key_of(struct frag_key *k, __u32 ifindex, const struct packet *p)
{
	__builtin_memset(k, 0, sizeof(*k));
	k->ifindex = ifindex;
	k->family = p->family;
	k->proto = p->proto;
	k->id = p->frag_id;
	__builtin_memcpy(k->src, p->src, 16);
	__builtin_memcpy(k->dst, p->dst, 16);
}

/* frag_remember stores the ports of an allowed first fragment. */
static __always_inline void frag_remember(__u32 ifindex, const struct packet *p, __u64 now)
{
	struct frag_key k;
	struct frag_ports v = {.seen_ns = now, .sport = p->sport, .dport = p->dport};
	frag_key_of(&k, ifindex, p);
	bpf_map_update_elem(&cdo_frags, &k, &v, BPF_ANY);
}

/* frag_forget drops what frag_remember stored for p's datagram: its later
 * fragments get no ports, so they drop where ports matter. */
static __always_inline void frag_forget(__u32 ifindex, const struct packet *p)
{
	struct frag_key k;
	frag_key_of(&k, ifindex, p);
	bpf_map_delete_elem(&cdo_frags, &k);
}

/* frag_ports_of lends a later fragment its first fragment's ports. */
static __always_inline int frag_ports_of(__u32 ifindex, struct packet *p, __u64 now)
{
	struct frag_key k;
	frag_key_of(&k, ifindex, p);
	struct frag_ports *v = bpf_map_lookup_elem(&cdo_frags, &k);
	if (!v || (now > v->seen_ns && now - v->seen_ns > FRAG_LIFETIME_NS))
		return 0;
	p->sport = v->sport;
	p->dport = v->dport;
	return 1;
}
