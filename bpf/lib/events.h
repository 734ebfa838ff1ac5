/* Events: exact per-reason counters and flow records on a ring buffer.
 * Counters count every packet; drop records are rate-limited per CPU so a
 * flood cannot pin the reader or grow the flow log without bound (the
 * suppressed ones are counted), and allowed-flow records are batched and
 * leave a quarter of the ring to drop records (the rest are counted lost). */
#pragma once

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "../coordino.h"
#include "parse.h"

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2 * REASON_SLOTS);
	__type(key, __u32);
	__type(value, struct counter);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cdo_verdicts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cdo_flows SEC(".maps");

/* Drop records: at most DROP_EVENTS_PER_WINDOW per CPU per window. */
#define DROP_EVENT_WINDOW_NS (100 * 1000000ULL)
#define DROP_EVENTS_PER_WINDOW 64

struct event_budget {
	__u64 window_start_ns;
	__u32 used;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct event_budget);
} cdo_ev_budget SEC(".maps");

/* Allowed-flow records wake the daemon only once this much is queued; below
 * it the daemon's periodic poll (daemon/datapath flowPollInterval) collects
 * them, so a burst of new connections costs one wakeup, not one each. */
#define FLOW_WAKEUP_BYTES (256 * 1024)

/* Allowed-flow records may fill the ring only to 3/4: a pod opening
 * allowed flows faster than the daemon reads must not crowd out the
 * (rate-limited) drop records of other pods. */
#define FLOW_ALLOWED_SHARE_NUM 3
#define FLOW_ALLOWED_SHARE_DEN 4

static __always_inline void count(__u8 dir, __u32 reason, __u32 len)
{
	__u32 idx = dir * REASON_SLOTS + reason;
	struct counter *c = bpf_map_lookup_elem(&cdo_verdicts, &idx);
	if (c) {
		c->packets++;
		c->bytes += len;
	}
}

/* drop_event_wake takes one drop record from this CPU's budget: it returns
 * the ring-buffer wakeup flag, or -1 when the budget is spent. Only the
 * window's first record wakes the reader; its poll collects the rest. */
static __always_inline __s64 drop_event_wake(__u64 now)
{
	__u32 zero = 0;
	struct event_budget *b = bpf_map_lookup_elem(&cdo_ev_budget, &zero);
	if (!b)
		return 0;
	if (now - b->window_start_ns > DROP_EVENT_WINDOW_NS) {
		b->window_start_ns = now;
		b->used = 0;
	}
	if (b->used >= DROP_EVENTS_PER_WINDOW)
		return -1;
	return b->used++ == 0 ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP;
}

/* emit_on reports p's verdict on the endpoint interface ifindex. */
static __always_inline void emit_on(__u32 ifindex, const struct endpoint_info *ep, __u8 dir,
				    const struct packet *p, __u32 remote_id, __u32 reason, __u64 now)
{
	__u64 wake;
	if (reason >= REASON_FIRST_DROP) {
		__s64 w = drop_event_wake(now);
		if (w < 0) {
			count(dir, REASON_EVENT_SUPPRESSED, 0);
			return;
		}
		wake = w;
	} else {
		__u64 queued = bpf_ringbuf_query(&cdo_flows, BPF_RB_AVAIL_DATA);
		__u64 size = bpf_ringbuf_query(&cdo_flows, BPF_RB_RING_SIZE);
		if (queued * FLOW_ALLOWED_SHARE_DEN >= size * FLOW_ALLOWED_SHARE_NUM) {
			count(dir, REASON_EVENT_LOST, 0);
			return;
		}
		wake = queued >= FLOW_WAKEUP_BYTES ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP;
	}
	struct flow_event *ev = bpf_ringbuf_reserve(&cdo_flows, sizeof(*ev), 0);
	if (!ev) {
		count(dir, REASON_EVENT_LOST, 0);
		return;
	}
	ev->ts_ns = bpf_ktime_get_ns();
	ev->ifindex = ifindex;
	ev->local_id = ep ? ep->identity : 0;
	ev->remote_id = remote_id;
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

static __always_inline void emit(struct __sk_buff *skb, const struct endpoint_info *ep, __u8 dir,
				 const struct packet *p, __u32 remote_id, __u32 reason, __u64 now)
{
	emit_on(skb->ifindex, ep, dir, p, remote_id, reason, now);
}
