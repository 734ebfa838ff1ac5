/* The kfuncs the programs may call, declared once. Each is weak: a program
 * calls one only where the loader found it (the daemon's kernel probe,
 * bpf/coordino_probe.c, tells), so a kernel without it still loads the rest. */
#pragma once

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

/* nf_conntrack's lookup, built into the kernel or living in its module.
 * nf_conn is opaque here: a forward declaration would not match the
 * kernel's struct in the loader's kfunc type check. */
struct nf_conn {
	int unused;
};
struct bpf_ct_opts {
	__s32 netns_id;
	__s32 error;
	__u8 l4proto;
	__u8 dir;
	__u16 ct_zone_id;
	__u8 ct_zone_dir;
	__u8 reserved[3];
};
/* The options' size passed: their first 12 bytes, without the zone fields
 * 6.6 added. 6.1 refuses any other size (every lookup then fails with
 * -EINVAL, which the guard reads as "tracked"); later kernels take both. */
#define BPF_CT_OPTS_SZ 12
extern struct nf_conn *bpf_skb_ct_lookup(struct __sk_buff *skb, struct bpf_sock_tuple *tuple,
					 __u32 tuple__sz, struct bpf_ct_opts *opts,
					 __u32 opts__sz) __ksym __weak;
extern void bpf_ct_release(struct nf_conn *ct) __ksym __weak;
