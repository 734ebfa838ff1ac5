//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* The daemon's kernel probe (daemon/kernel): one tiny program per kfunc the
 * datapath may call. A program loads exactly where the kernel offers its
 * kfunc to that program type, which is the question; none is ever
 * attached. The kfunc declarations are the programs' own (lib/kfuncs.h),
 * so a probe and its user cannot disagree. */
#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>

#include "lib/kfuncs.h"
#include "lib/adjroom.h"

char __license[] SEC("license") = "Dual BSD/GPL";

extern int bpf_dynptr_from_skb(struct __sk_buff *skb, __u64 flags,
			       struct bpf_dynptr *ptr__uninit) __ksym __weak;

/* probe_ct_lookup: host routing's conntrack question (lib/hostroute.h). */
SEC("tc")
int probe_ct_lookup(struct __sk_buff *skb)
{
	struct bpf_sock_tuple t = {};
	struct bpf_ct_opts opts = {.netns_id = -1, .l4proto = IPPROTO_TCP};
	struct nf_conn *ct = bpf_skb_ct_lookup(skb, &t, sizeof(t.ipv4), &opts, BPF_CT_OPTS_SZ);
	if (ct)
		bpf_ct_release(ct);
	return 0;
}

/* probe_dynptr_from_skb: how the post-DNAT program reads packets
 * (coordino_svc.c); tc programs got it in the same release as netfilter
 * programs. */
SEC("tc")
int probe_dynptr_from_skb(struct __sk_buff *skb)
{
	struct bpf_dynptr ptr;
	bpf_dynptr_from_skb(skb, 0, &ptr);
	return 0;
}

/* probe_decap_flags: whether bpf_skb_adjust_room takes the decapsulation
 * flags (6.3), run on a test frame: 1 when it does. */
SEC("tc")
int probe_decap_flags(struct __sk_buff *skb)
{
	return bpf_skb_adjust_room(skb, -8, BPF_ADJ_ROOM_MAC,
				   BPF_F_ADJ_ROOM_FIXED_GSO | TUNNEL_DECAP_L3_IPV4) == 0;
}
