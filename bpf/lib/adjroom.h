/* bpf_skb_adjust_room flags newer than the uapi headers the programs
 * build against. */
#pragma once

/* BPF_F_ADJ_ROOM_DECAP_L3_IPV4/6 (Linux 6.3): the decapsulated packet's
 * family becomes skb->protocol. Older kernels refuse the flags and the
 * VXLAN device decapsulates instead (the daemon's probe tells). */
#define TUNNEL_DECAP_L3_IPV4 (1ULL << 7)
#define TUNNEL_DECAP_L3_IPV6 (1ULL << 8)
