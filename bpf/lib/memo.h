/* Per-CPU memos keyed by six 64-bit words (host routing's FIB answers,
 * conntrack's answers): a key picks its slot by a Fibonacci hash of the
 * words, and a slot answers only the key it holds in full. */
#pragma once

#include <linux/types.h>

#define MEMO_KEY_WORDS 6

/* memo_slot picks one of 1 << bits slots for key. */
static __always_inline __u32 memo_slot(const __u64 *key, int bits)
{
	__u64 x = key[0] ^ key[1] ^ key[2] ^ key[3] ^ key[4] ^ key[5];
	return (x * 0x9E3779B97F4A7C15ULL) >> (64 - bits);
}

/* memo_key_equal: the slot's key held is key. */
static __always_inline int memo_key_equal(const __u64 *held, const __u64 *key)
{
	return held[0] == key[0] && held[1] == key[1] && held[2] == key[2] &&
	       held[3] == key[3] && held[4] == key[4] && held[5] == key[5];
}
