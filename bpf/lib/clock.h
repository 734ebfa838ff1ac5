/* The programs' clock. */
#pragma once

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

/* now_ns is CLOCK_MONOTONIC at the timer tick's resolution, all that
 * conntrack and fragment lifetimes, the conntrack refresh and the
 * drop-event window (seconds, or a tenth of one) need. The precise clock
 * reads the clock source on every packet: a sixth of a verdict's cost
 * (docs/benchmarks.md), more where that read traps to the hypervisor.
 * Flow events, which are few, keep the precise timestamp (events.h), and so
 * does the post-DNAT hook, whose program type may not read the coarse
 * clock: it runs once per deferred flow, and every comparison of a stored
 * time with now tolerates the tick between the two clocks. */
static __always_inline __u64 now_ns(void)
{
	return bpf_ktime_get_coarse_ns();
}
