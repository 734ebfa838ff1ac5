/* Connection tracking: per endpoint, per state lifetimes, tombstones for
 * revoked flows. Entries are a cache of verdicts that policy can re-create:
 * any packet policy allows re-creates a missing entry. An evicted or
 * expired entry costs a connection nothing while its next packet comes
 * from a side policy lets open it; a packet from the other side (a reply
 * into an isolated direction) is dropped until then (docs/policy.md). */
#pragma once

#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>

#include "../coordino.h"
#include "parse.h"
#include "policy.h"
#include "clock.h"
#include "memo.h"

/* max_entries is set by the loader (daemon flag --conntrack-size). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1 << 18);
	__type(key, struct ct_key);
	__type(value, struct ct_entry);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cdo_conntrack SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, CT_STAT_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cdo_ct_stats SEC(".maps");

#define SEC_NS 1000000000ULL
#define CT_TCP_UNREPLIED_NS (60 * SEC_NS)        /* SYN sent, nothing back yet */
#define CT_TCP_ESTABLISHED_NS (6 * 3600 * SEC_NS) /* both directions seen */
#define CT_CLOSING_NS (10 * SEC_NS)              /* FIN or RST seen */
#define CT_OTHER_UNREPLIED_NS (30 * SEC_NS)
#define CT_OTHER_REPLIED_NS (180 * SEC_NS)
/* Tombstones outlive TCP's longest retransmission interval (120 s), so a
 * revoked connection cannot be picked up again by its own retransmissions. */
#define CT_REVOKED_NS (300 * SEC_NS)
#define CT_REFRESH_NS SEC_NS

/* ct_memo: per CPU, ct_track's answer for the last packets of a few
 * established flows, so that a flow's next packets pass on one array slot
 * instead of the endpoint, source-address and conntrack lookups (the
 * dearest part of a verdict: docs/benchmarks.md). An answer holds only
 * while the policy revision it was given under is current: every change of
 * policy, endpoints, their addresses or identities moves the revision, as
 * it re-decides tracked flows. It also expires after CT_MEMO_TTL_NS, so
 * the flow's conntrack entry is refreshed and re-checked (eviction, expiry)
 * at least that often. Packets that change an entry's state (SYN, FIN,
 * RST), fragments and a closing flow are never answered from it. Nor is a
 * packet whose own side must re-create the entry if it is lost: a packet
 * answered from the memo re-creates nothing, so the other side's packets
 * (into an isolated direction) would be dropped meanwhile (ct_memo_safe).
 * Host routing keeps one more answer in the entry: that the host's
 * conntrack did not know the TCP flow (lib/hostroute.h, hr_flow_host_tracked). */
#define CT_MEMO_SLOT_BITS 8
#define CT_MEMO_SLOTS (1 << CT_MEMO_SLOT_BITS)
#define CT_MEMO_TTL_NS SEC_NS
/* Bounds the walk over every CPU's memo (ct_memo_forget_everywhere); the
 * walk stops at the first CPU id the kernel does not have. */
#define CT_MEMO_MAX_CPUS 8192

/* ct_memo_entry.flags */
#define CT_MEMO_HOST_UNTRACKED 1

struct ct_memo_entry {
	__u64 expires_ns;
	__u64 key[MEMO_KEY_WORDS]; /* ifindex, direction, protocol, family, ports, addresses */
	__u32 revision;
	__u16 reason;
	__u16 flags; /* CT_MEMO_* */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, CT_MEMO_SLOTS);
	__type(key, __u32);
	__type(value, struct ct_memo_entry);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cdo_flow_memo SEC(".maps");

enum ct_result {
	CT_NEW,
	CT_ESTABLISHED,
	CT_REPLY,
	CT_REVOKED_HIT,
	CT_DEFERRED, /* CT_SVC_PENDING flow, original direction: the service hook decides */
	CT_DEFERRED_REPLIED, /* the same, and replies passed: it was allowed before */
};

static __always_inline void ct_stat(__u32 slot)
{
	__u64 *v = bpf_map_lookup_elem(&cdo_ct_stats, &slot);
	if (v)
		(*v)++;
}

/* ct_memo_flow_key fills the memo's key of a flow seen in dir on ifindex. */
static __always_inline void ct_memo_flow_key(__u64 *key, __u32 ifindex, __u8 dir, __u8 proto,
					     __u8 family, __be16 sport, __be16 dport,
					     const __u8 *src, const __u8 *dst)
{
	key[0] = (__u64)ifindex | (__u64)dir << 32 | (__u64)proto << 40 | (__u64)family << 48;
	key[1] = (__u64)sport | (__u64)dport << 16;
	__builtin_memcpy(&key[2], src, 16);
	__builtin_memcpy(&key[4], dst, 16);
}

/* ct_memo_answers: a packet of proto with tcp_flags and fragment kind frag
 * may be answered from the memo. */
static __always_inline int ct_memo_answers(__u8 proto, __u8 tcp_flags, __u8 frag)
{
	if (frag != FRAG_NONE || (tcp_flags & (TCP_SYN | TCP_FIN | TCP_RST)))
		return 0;
	return proto == IPPROTO_TCP || proto == IPPROTO_UDP;
}

/* ct_memo_key fills the memo's key of p, seen in dir on ifindex; 0 when p
 * may not be answered from the memo. */
static __always_inline int ct_memo_key(__u64 *key, __u32 ifindex, __u8 dir, const struct packet *p)
{
	if (!ct_memo_answers(p->proto, p->tcp_flags, p->frag))
		return 0;
	ct_memo_flow_key(key, ifindex, dir, p->proto, p->family, p->sport, p->dport, p->src, p->dst);
	return 1;
}

static __always_inline struct ct_memo_entry *ct_memo_slot(const __u64 *key)
{
	__u32 slot = memo_slot(key, CT_MEMO_SLOT_BITS);
	return bpf_map_lookup_elem(&cdo_flow_memo, &slot);
}

/* ct_memo_find returns this CPU's live entry for key, or NULL. */
static __always_inline struct ct_memo_entry *ct_memo_find(const __u64 *key, __u32 revision, __u64 now)
{
	struct ct_memo_entry *e = ct_memo_slot(key);
	if (!e || now >= e->expires_ns || e->revision != revision || !memo_key_equal(e->key, key))
		return NULL;
	return e;
}

/* ct_memo_get returns the remembered verdict reason of p's flow, or -1. */
static __always_inline int ct_memo_get(__u32 ifindex, __u8 dir, const struct packet *p,
				       __u32 revision, __u64 now)
{
	__u64 key[MEMO_KEY_WORDS];
	if (!ct_memo_key(key, ifindex, dir, p))
		return -1;
	struct ct_memo_entry *e = ct_memo_find(key, revision, now);
	return e ? e->reason : -1;
}

/* ct_memo_put remembers reason as the answer to p's flow in p's direction. */
static __always_inline void ct_memo_put(__u32 ifindex, __u8 dir, const struct packet *p,
					__u32 revision, __u64 now, __u32 reason)
{
	__u64 key[MEMO_KEY_WORDS];
	if (!ct_memo_key(key, ifindex, dir, p))
		return;
	struct ct_memo_entry *e = ct_memo_slot(key);
	if (!e)
		return;
	__builtin_memcpy(e->key, key, sizeof(key));
	e->revision = revision;
	e->reason = reason;
	e->flags = 0;
	e->expires_ns = now + CT_MEMO_TTL_NS;
}

struct ct_memo_forget {
	__u64 key[MEMO_KEY_WORDS];
	__u32 slot;
};

static long ct_memo_forget_on(__u32 cpu, struct ct_memo_forget *f)
{
	struct ct_memo_entry *e = bpf_map_lookup_percpu_elem(&cdo_flow_memo, &f->slot, cpu);
	if (!e)
		return 1;
	if (memo_key_equal(e->key, f->key))
		e->expires_ns = 0;
	return 0;
}

/* ct_memo_forget_everywhere drops key's entry from every CPU's memo, for
 * an answer that a packet seen on one CPU makes wrong on all of them. */
static __always_inline void ct_memo_forget_everywhere(const __u64 *key)
{
	struct ct_memo_forget f;
	__builtin_memcpy(f.key, key, sizeof(f.key));
	f.slot = memo_slot(key, CT_MEMO_SLOT_BITS);
	bpf_loop(CT_MEMO_MAX_CPUS, ct_memo_forget_on, &f, 0);
}

static __always_inline int tcp_opening(const struct packet *p)
{
	return p->proto == IPPROTO_TCP && (p->tcp_flags & (TCP_SYN | TCP_ACK)) == TCP_SYN;
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

static __always_inline __u64 ct_lifetime(const struct ct_key *k, const struct ct_entry *e)
{
	if (e->flags & CT_REVOKED)
		return CT_REVOKED_NS;
	if (e->flags & CT_CLOSING)
		return CT_CLOSING_NS;
	int replied = e->flags & CT_REPLIED;
	if (k->proto == IPPROTO_TCP)
		return replied ? CT_TCP_ESTABLISHED_NS : CT_TCP_UNREPLIED_NS;
	return replied ? CT_OTHER_REPLIED_NS : CT_OTHER_UNREPLIED_NS;
}

/* ct_lookup finds the live entry of p's flow (seen in dir on ifindex) in
 * either orientation; *origin is the direction of the packet that created
 * it. An expired entry is removed and not returned. */
static __always_inline struct ct_entry *ct_lookup(__u32 ifindex, __u8 dir, const struct packet *p,
						  __u64 now, struct ct_key *k, __u8 *origin)
{
	*origin = dir;
	tuple_key(k, ifindex, dir, p, 0);
	struct ct_entry *e = bpf_map_lookup_elem(&cdo_conntrack, k);
	if (!e) {
		*origin = dir ^ 1;
		tuple_key(k, ifindex, dir ^ 1, p, 1);
		e = bpf_map_lookup_elem(&cdo_conntrack, k);
		if (!e)
			return NULL;
	}
	__u64 seen = e->last_seen_ns;
	if (now > seen && now - seen > ct_lifetime(k, e)) {
		bpf_map_delete_elem(&cdo_conntrack, k);
		ct_stat(CT_STAT_EXPIRED);
		return NULL;
	}
	return e;
}

/* ct_still_allowed re-decides a tracked flow after a policy change. An
 * ambiguous TCP entry (re-created mid-flow, either side may have opened
 * it) stays while either side could open it now. UDP entries are never
 * ambiguous (coordino.c); one an older version marked, adopted at an
 * upgrade, is judged by the side that created it like the others. */
static __always_inline int ct_still_allowed(const struct endpoint_info *ep, const struct ct_key *k,
					    const struct ct_entry *e,
					    const struct ipcache_value *remote)
{
	if (allowed(decide(ep, k->dir, remote, k->proto, k->dport)))
		return 1;
	return (e->flags & CT_AMBIGUOUS) && k->proto == IPPROTO_TCP &&
	       allowed(decide(ep, k->dir ^ 1, remote, k->proto, k->sport));
}

/* ct_memo_safe: p's answer may be remembered, since a loss of its flow's
 * entry e would be mended by the other side's next packet, which policy
 * lets open the flow. A reply's other side is the origin, which policy
 * lets open the flow as long as the entry is neither revoked nor ambiguous
 * (re-created mid-flow: its origin is a guess). The reply side is asked
 * once per entry and revision. */
static __always_inline int ct_memo_safe(const struct endpoint_info *ep, __u8 dir,
					const struct packet *p, __u8 origin, struct ct_entry *e)
{
	if (origin != dir)
		return !(e->flags & CT_AMBIGUOUS);
	if (!(e->flags & CT_REPLY_CHECKED)) {
		struct ipcache_value remote = remote_of(p, dir);
		if (allowed(decide(ep, dir ^ 1, &remote, p->proto, p->sport)))
			e->flags |= CT_REPLY_OPENS;
		e->flags |= CT_REPLY_CHECKED;
	}
	return e->flags & CT_REPLY_OPENS;
}

/* ct_track looks up p and updates its entry: re-decision after a policy
 * change, reply and closing state, last use; the answer is remembered
 * where that is safe. The peer's identity is looked up only for a
 * re-decision and once per revision for the memo: a flow's other packets
 * do not need it. */
static __always_inline int ct_track(const struct endpoint_info *ep, __u32 ifindex, __u8 dir,
				    const struct packet *p, __u32 revision, __u64 now)
{
	struct ct_key k;
	__u8 origin;
	struct ct_entry *e = ct_lookup(ifindex, dir, p, now, &k, &origin);
	if (!e)
		return CT_NEW;
	if (e->revision != revision) {
		struct ipcache_value remote = remote_of(p, dir);
		if (e->flags & CT_SERVICE) {
			/* Only the post-DNAT hook knows the backend (lib/service.h). */
			e->flags = (e->flags & ~CT_REVOKED) | CT_SVC_PENDING;
		} else if (ct_still_allowed(ep, &k, e, &remote)) {
			e->flags &= ~CT_REVOKED;
		} else if (!(e->flags & CT_REVOKED)) {
			e->flags |= CT_REVOKED;
			ct_stat(CT_STAT_REVOKED);
		}
		e->flags &= ~(CT_REPLY_CHECKED | CT_REPLY_OPENS);
		e->revision = revision;
	}
	if (e->flags & CT_REVOKED) {
		/* A fresh SYN opens a new connection on the tuple: decide anew. */
		if (tcp_opening(p)) {
			bpf_map_delete_elem(&cdo_conntrack, &k);
			return CT_NEW;
		}
		/* Keep the tombstone while the flow keeps trying. */
		e->last_seen_ns = now;
		return CT_REVOKED_HIT;
	}
	if (origin == dir && tcp_opening(p))
		e->flags &= ~(CT_CLOSING | CT_REPLIED);
	else if (origin != dir && !(e->flags & CT_REPLIED))
		e->flags |= CT_REPLIED;
	if ((p->tcp_flags & (TCP_FIN | TCP_RST)) && !(e->flags & CT_CLOSING))
		e->flags |= CT_CLOSING;
	if (now > e->last_seen_ns + CT_REFRESH_NS)
		e->last_seen_ns = now;
	if (origin == dir && (e->flags & CT_SVC_PENDING))
		return (e->flags & CT_REPLIED) ? CT_DEFERRED_REPLIED : CT_DEFERRED;
	if (!(e->flags & CT_CLOSING) && ct_memo_safe(ep, dir, p, origin, e))
		ct_memo_put(ifindex, dir, p, revision, now,
			    origin == dir ? REASON_ESTABLISHED : REASON_REPLY);
	return origin == dir ? CT_ESTABLISHED : CT_REPLY;
}

/* ct_related reports whether the flow an ICMP error quotes (q, which went
 * the other way, dir ^ 1) is tracked and still allowed. It changes nothing:
 * errors neither refresh nor close a flow. */
static __always_inline int ct_related(const struct endpoint_info *ep, __u32 ifindex, __u8 dir,
				      const struct packet *q, __u32 revision, __u64 now)
{
	struct ct_key k;
	__u8 origin;
	struct ct_entry *e = ct_lookup(ifindex, dir ^ 1, q, now, &k, &origin);
	if (!e || (e->flags & CT_REVOKED))
		return 0;
	if (e->revision == revision || (e->flags & CT_SERVICE))
		return 1;
	/* The peer is the quoted flow's, not the error's sender (a router). */
	struct ipcache_value remote = remote_of(q, dir ^ 1);
	return ct_still_allowed(ep, &k, e, &remote);
}

/* ct_create tracks p's flow with p's direction as origin. */
static __always_inline void ct_create(__u32 ifindex, __u8 dir, const struct packet *p,
				      __u32 revision, __u64 now, __u32 flags)
{
	struct ct_key k;
	struct ct_entry e = {.last_seen_ns = now, .revision = revision, .flags = flags};
	if (p->tcp_flags & (TCP_FIN | TCP_RST))
		e.flags |= CT_CLOSING;
	tuple_key(&k, ifindex, dir, p, 0);
	if (bpf_map_update_elem(&cdo_conntrack, &k, &e, BPF_ANY) == 0) {
		ct_stat(CT_STAT_CREATED);
		if (p->proto == IPPROTO_TCP && !tcp_opening(p))
			ct_stat(CT_STAT_PICKUP);
	}
}
