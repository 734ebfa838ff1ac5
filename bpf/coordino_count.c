//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Entry counts of every BPF map, for the daemon's metrics: a bpf_map
 * iterator that writes each map's ID and bpf_map_sum_elem_count (kernel
 * 6.6+). Counting the conntrack table otherwise means reading all of it.
 * Loaded on its own, so a kernel without the kfunc only loses this. */
#include <linux/bpf.h>
#include <linux/types.h>
#include <bpf/bpf_helpers.h>

char __license[] SEC("license") = "Dual BSD/GPL";

/* The kernel's types, as far as read here (CO-RE). */
struct seq_file;
struct bpf_iter_meta {
	struct seq_file *seq;
} __attribute__((preserve_access_index));
struct bpf_map {
	__u32 id;
} __attribute__((preserve_access_index));
struct bpf_iter__bpf_map {
	struct bpf_iter_meta *meta;
	struct bpf_map *map;
} __attribute__((preserve_access_index));

extern __s64 bpf_map_sum_elem_count(const struct bpf_map *map) __ksym;

/* map_count is one record of the iterator's output. */
struct map_count {
	__u32 id;
	__u32 pad;
	__s64 count;
};

/* Make the record's type visible in BTF so bpf2go generates Go for it. */
const struct map_count *unused_map_count __attribute__((unused));

SEC("iter/bpf_map")
int cdo_map_counts(struct bpf_iter__bpf_map *ctx)
{
	struct bpf_map *map = ctx->map;
	if (!map)
		return 0;
	struct map_count c = {.id = map->id, .count = bpf_map_sum_elem_count(map)};
	bpf_seq_write(ctx->meta->seq, &c, sizeof(c));
	return 0;
}
