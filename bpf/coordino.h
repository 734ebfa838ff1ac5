/* Shared definitions of Coordino's datapath: map layouts read and written by
 * both the BPF programs and the Go loader (daemon/datapath). Changing a
 * layout is a breaking change for pinned maps: bump the map name. */
#pragma once

#include <linux/types.h>

/* Reserved identities. Pod identities start at ID_FIRST_POD; CIDR identities
 * (ipBlock peers) have ID_CIDR_FLAG set. */
#define ID_ANY 0       /* wildcard remote in the policy map, never assigned */
#define ID_HOST 1      /* this node */
#define ID_WORLD 2     /* anything the ipcache does not know */
#define ID_REMOTE_NODE 3 /* another node's address (from the peers list) */
#define ID_FIRST_POD 256
#define ID_CIDR_FLAG 0x01000000

/* Direction from the endpoint's (pod's) point of view. */
enum direction {
	DIR_INGRESS = 0, /* towards the pod: egress of the host veth */
	DIR_EGRESS = 1,  /* from the pod: ingress of the host veth */
};

/* Why a packet was passed or dropped. Reasons before REASON_FIRST_DROP pass.
 * Values are stable: flow consumers and counters keep their meaning. */
enum reason {
	REASON_POLICY = 0,       /* new flow allowed by a policy rule */
	REASON_NOT_ISOLATED = 1, /* new flow, direction not isolated */
	REASON_HOST = 2,         /* new flow from the pod's own node */
	REASON_ESTABLISHED = 3,  /* conntrack hit, original direction */
	REASON_REPLY = 4,        /* conntrack hit, reply direction */
	REASON_RELATED = 5,      /* ICMP error quoting a tracked flow */
	REASON_NOT_IP = 6,       /* ARP and other non-IP frames */
	REASON_NEIGHBOR = 7,     /* IPv6 neighbour discovery and MLD on the link */
	REASON_FIRST_DROP = 8,
	REASON_POLICY_DENIED = 8, /* new flow no policy allows */
	REASON_POLICY_REVOKED = 9, /* tracked flow no longer allowed */
	REASON_NO_ENDPOINT = 10,  /* attached interface missing from endpoints */
	REASON_MALFORMED = 11,    /* truncated or invalid headers */
	REASON_SPOOFED = 12,      /* pod sent from, or claimed (ARP/ND), an address not its own */
	REASON_FRAGMENT = 13,     /* later fragment whose first fragment was not seen */
	REASON_MAX = 14,
	REASON_EVENT_LOST = 14,   /* counter slot: flow event ring buffer full */
	REASON_EVENT_SUPPRESSED = 15, /* counter slot: drop event over the rate limit */
	REASON_NODE_ISOLATED = 16, /* pod -> node port no NodeIsolationPolicy allows */
	REASON_NODE_TO_NODE_DENIED = 17, /* node -> node port no NodeIsolationPolicy allows */
	REASON_NODEISO_END = 18,  /* first slot past the node isolation reasons */
	REASON_ADMIN_DENY = 18,   /* new flow an Admin tier ClusterNetworkPolicy rule denies */
	REASON_TUNNEL_INJECTION = 19, /* VXLAN to a node's port from a pod, or from no peer node */
	REASON_SERVICE_UNENFORCEABLE = 20, /* Service traffic of an egress-isolated pod, no post-DNAT hook */
	REASON_BASELINE_DENY = 21, /* new flow a Baseline tier rule denies (no NetworkPolicy isolates the pod) */
	REASON_SLOTS = 32,        /* counter slots per direction, with room to grow */
};

#define EP_INGRESS_ISOLATED 1
#define EP_EGRESS_ISOLATED 2
/* Some ClusterNetworkPolicy has rules for the pod in the direction: new
 * flows consult the policy map even where no NetworkPolicy isolates it. */
#define EP_INGRESS_TIERED 4
#define EP_EGRESS_TIERED 8
#define EP_EGRESS_ENFORCED (EP_EGRESS_ISOLATED | EP_EGRESS_TIERED)

/* endpoints: host-side ifindex -> endpoint. */
struct endpoint_info {
	__u32 identity;
	__u32 flags; /* EP_*_ISOLATED: some policy selects the pod for it; EP_*_TIERED */
};

/* ipcache: LPM trie keyed by (family, address prefix). prefixlen counts the
 * 32 family bits plus the address bits. IPv4 uses addr[0..3]. */
struct ipcache_key {
	__u32 prefixlen;
	__u32 family; /* 4 or 6 */
	__u8 addr[16];
};

/* identity is the pod, host or CIDR identity of the longest prefix;
 * cidr_identity is the longest ipBlock prefix containing the address, so
 * ipBlock rules also match pod and node addresses. */
struct ipcache_value {
	__u32 identity;
	__u32 cidr_identity;
};

/* policy: LPM trie of allowed (local, remote, direction, protocol, port).
 * All fields but the port are matched exactly (prefix 80 bits) or down to
 * "any protocol" (72 bits); a port range is stored as the few port prefixes
 * that cover it, so any rule set costs at most three lookups per new flow
 * (the remote identity, its CIDR identity, then ID_ANY). */
struct policy_key {
	__u32 prefixlen;
	__u32 local_id;
	__u32 remote_id;
	__u8 dir;
	__u8 proto;
	__be16 port;
};

#define POLICY_PREFIX_FULL 96
#define POLICY_PREFIX_ANY_PROTO 72
#define POLICY_PREFIX_PROTO 80

/* The ClusterNetworkPolicy tiers are folded into the values (see
 * daemon/policy/tiers.go): each key carries the deciding tier rule of all
 * keys containing it, and whether a NetworkPolicy allows there. Keys of the
 * Baseline tier have DIR_BASELINE set in dir. A NetworkPolicy-only key has
 * flags 0. */
#define POLICY_NO_ALLOW 1      /* no NetworkPolicy allow covers the key */
#define POLICY_ACTION_SHIFT 1  /* 2 bits: 0 none, 1 Accept, 2 Deny, 3 Pass */
#define POLICY_RANK_SHIFT 3    /* 15 bits: priority * 25 + rule index */
#define POLICY_ACCEPT 1
#define POLICY_DENY 2
#define POLICY_PASS 3
#define DIR_BASELINE 2

struct policy_value {
	__u32 flags; /* POLICY_* */
};

/* conntrack: per endpoint and origin direction, keyed by the original tuple.
 * Endpoints with an isolated direction (or while allowed flows are observed)
 * track every allowed flow; the others only TCP connections, from their SYN. */
struct ct_key {
	__u32 ifindex;
	__u8 dir;   /* direction of the packet that created the entry */
	__u8 proto;
	__u8 family;
	__u8 pad;
	__be16 sport;
	__be16 dport;
	__u8 src[16];
	__u8 dst[16];
};

#define CT_CLOSING 1   /* FIN or RST seen: short lifetime */
#define CT_REPLIED 2   /* a packet in the reply direction was seen */
#define CT_REVOKED 4   /* tombstone: policy revoked the flow, drop it both ways */
#define CT_AMBIGUOUS 8 /* TCP re-created mid-flow while both directions were allowed */
#define CT_SERVICE 16  /* to a Service address: decided on the translated destination */
#define CT_SVC_PENDING 32 /* CT_SERVICE flow waiting for the post-DNAT hook's decision */
#define CT_SVC_ALLOWED 64 /* the post-DNAT hook allowed the flow at least once */
#define CT_REPLY_CHECKED 128 /* CT_REPLY_OPENS is known for the entry's revision */
#define CT_REPLY_OPENS 256   /* policy would let the reply side open the flow too */

struct ct_entry {
	__u64 last_seen_ns;
	__u32 revision; /* policy revision the flow was last checked against */
	__u32 flags;    /* CT_* */
};

/* ct_stats: per-CPU counters of conntrack activity, exported as metrics. */
enum ct_stat {
	CT_STAT_CREATED = 0, /* entries created */
	CT_STAT_PICKUP = 1,  /* created from a mid-flow packet: the entry was evicted or expired */
	CT_STAT_EXPIRED = 2, /* entries found expired and removed */
	CT_STAT_REVOKED = 3, /* flows revoked by a policy change */
	CT_STAT_SLOTS = 8,
};

/* ep_addrs: the addresses each endpoint may send from (anti-spoofing),
 * written by the daemon when it attaches the endpoint. */
struct ep_addr_key {
	__u32 ifindex;
	__u8 family; /* 4 or 6 */
	__u8 pad[3];
	__u8 addr[16];
};

/* config flags. CFG_EMIT_ALLOWED: some observer (flow log, FollowFlows
 * client) wants allowed new flows; without it only drops are reported, so an
 * unobserved node pays no ring-buffer write or daemon wakeup per connection. */
#define CFG_EMIT_ALLOWED 1
/* CFG_SERVICE_HOOK: the post-DNAT netfilter program is attached, so Service
 * traffic of egress-isolated pods is deferred to it instead of dropped. */
#define CFG_SERVICE_HOOK 2
/* CFG_SERVICE_MATCH: with CFG_SERVICE_HOOK, the post-DNAT decision runs in
 * an nftables chain right after DNAT, through the xtables BPF match
 * (coordino_svcmatch.c), where the kernel has no BPF netfilter links. It
 * keeps no state: a deferred flow stays pending and each of its packets is
 * decided there, marked MARK_SVC_DEFERRED by the tc program (with
 * MARK_SVC_NEW for the packet that opened it, MARK_SVC_REPLIED once replies
 * passed: a denial is then a revocation), which also names the packet's
 * endpoint in cdo_svc_pending by its source (lib/service.h). The stage
 * clears the three bits. */
#define CFG_SERVICE_MATCH 8
#define MARK_SVC_DEFERRED 0x00200000
#define MARK_SVC_NEW 0x00400000
#define MARK_SVC_REPLIED 0x00800000

/* config: single-slot array written by the daemon. flags took the place of
 * padding, so the layout (and pinned maps) are unchanged. */
struct config {
	__u32 policy_revision;
	__u32 flags; /* CFG_* */
};

/* verdicts: per-CPU array indexed by dir * REASON_SLOTS + reason. */
struct counter {
	__u64 packets;
	__u64 bytes;
};

/* flows: ring buffer record of a new flow's verdict. */
struct flow_event {
	__u64 ts_ns;
	__u32 ifindex;
	__u32 local_id;
	__u32 remote_id;
	__u8 family;
	__u8 proto;
	__u8 dir;
	__u8 reason;
	__be16 sport;
	__be16 dport;
	__u8 src[16];
	__u8 dst[16];
};

/* Node isolation (lib/nodeiso.h). The cdo_nodeiso map reuses policy_key;
 * pod -> host entries use local_id NODEISO_LOCAL_POD (no pod identity is 0:
 * rules apply to every pod). nodeiso_config.flags say which directions a
 * NodeIsolationPolicy isolates. */
#define NODEISO_LOCAL_POD 0
enum nodeiso_flag {
	NODEISO_POD_TO_HOST = 1,  /* pods open flows to node addresses only on allowed ports */
	NODEISO_NODE_TO_NODE = 2, /* nodes accept flows from other nodes only on allowed ports */
};

struct nodeiso_config {
	__u32 flags; /* NODEISO_* */
};

/* CFG_HOST_ROUTING: eBPF host routing (lib/hostroute.h) is on: pod-to-pod
 * packets between this node's pods and other nodes' blocks skip the host's
 * forwarding path when the host's conntrack does not know their flow. */
#define CFG_HOST_ROUTING 4

/* local_eps: this node's primary endpoints by address, for host routing's
 * ingress redirect into the pod. Written on attach, removed on detach. */
struct local_ep_key {
	__u8 family; /* 4 or 6 */
	__u8 pad[3];
	__u8 addr[16];
};

struct local_ep {
	__u32 ifindex;     /* host veth */
	__u8 pod_mac[6];   /* the pod side's MAC: destination of redirected frames */
	__u8 host_mac[6];  /* the host veth's MAC: their source */
};

/* hostroute_stats: per-CPU packet counters of host routing. */
enum hostroute_stat {
	HR_STAT_IN_REDIRECTED = 0,  /* to a local pod, redirected into its netns */
	HR_STAT_OUT_REDIRECTED = 1, /* to another node's pod, redirected to the uplink */
	HR_STAT_HOST_TRACKED = 2,   /* the host's conntrack knows the flow: normal path */
	HR_STAT_NO_ROUTE = 3,       /* the FIB had no usable next hop: normal path */
	HR_STAT_ENCAPSULATED = 4,   /* of those redirected out, VXLAN-encapsulated by the program */
	HR_STAT_DECAPSULATED = 5,   /* of those redirected in, VXLAN-decapsulated by the program */
	HR_STAT_SLOTS = 8,
};

/* The eBPF VXLAN tunnel and the VXLAN guard (lib/tunnel.h). tunnel_config:
 * single-slot array; tunnel_peers: the other nodes' blocks (ipcache_key
 * layout) with the VTEP that reaches each. Addresses and port in network
 * order. TUNNEL_ON: the programs encapsulate and decapsulate (src, mac
 * set). TUNNEL_GUARD: VXLAN on port is accepted from peer nodes only, and
 * no pod may send to a node's VXLAN port. */
#define TUNNEL_ON 1
#define TUNNEL_GUARD 2

struct tunnel_config {
	__u32 flags; /* TUNNEL_ON */
	__u32 vni;
	__be32 src;  /* this node's underlay address: outer source, and the destination decapsulated */
	__be16 port; /* UDP destination port */
	__u8 mac[6]; /* this node's VXLAN device MAC: inner source */
};

struct tunnel_peer {
	__be32 vtep; /* the peer's underlay address */
	__u8 mac[6]; /* its VXLAN device MAC: inner destination */
	__u8 pad[2];
};
