/* meshctl fast path: every pinned map's layout, in one place.
 *
 * ctl/meshctl/datapath/layout.py mirrors this file field by field (tests compare the two through
 * bcc's view of the compiled structs). Change a layout -> bump MC_LAYOUT_VERSION: an agent that
 * finds pinned maps of another version migrates (new maps, links switched to the new programs)
 * instead of misreading them.
 */
#ifndef MESHCTL_MAPS_H
#define MESHCTL_MAPS_H

#define MC_LAYOUT_VERSION 1

/* Map sizes. routes: plan entries (one per node pod CIDR). pods: local pod addresses.
 * flows4/flows6: reversed 5-tuples of flows that left through the kernel (LRU), per family. */
#define MC_ROUTES_MAX 131072
#define MC_PODS_MAX 16384
#define MC_FLOWS_MAX 65536

/* skb->mark bit set on packets from_pod redirected, so the egress tracker skips (and clears) them. */
#ifndef MC_MARK
#define MC_MARK 0x00100000
#endif

/* Address families as stored in keys (not AF_*: these are 4 and 6 on purpose, readable in dumps). */
#define MC_FAMILY_V4 4
#define MC_FAMILY_V6 6

/* routes: LPM trie. prefixlen counts the 32 family bits plus the address bits, so IPv4 and IPv6
 * prefixes live in one trie and never match each other. IPv4 addresses use addr[0..3]. */
struct mc_route_key {
    __u32 prefixlen;
    __u32 family;
    __u8 addr[16];
};

/* Actions of a route (the plan's FastPathEntry.action). */
#define MC_ACT_LOCAL 1
#define MC_ACT_DIRECT 2
#define MC_ACT_TUNNEL 3

struct mc_route_value {
    __u32 action;
    __u32 ifindex;   /* direct: the private NIC to redirect to */
    __u32 nh_family; /* 0: no next hop (on-link), else MC_FAMILY_V4/V6 */
    __u32 pad;
    __u8 nexthop[16];
};

/* pods: local pod address -> host-side veth (for bpf_redirect_peer). */
struct mc_pod_key {
    __u32 family;
    __u8 addr[16];
};

struct mc_pod_value {
    __u32 ifindex;
    __u32 pad;
};

/* flows4 / flows6: the tuple of an expected reply (src/dst swapped from the packet that left).
 * Two maps so the IPv4 key, hashed on every fast-path packet, stays 16 bytes. Ports are in
 * network order, 0 for protocols without ports and for non-first fragments. */
struct mc_flow4_key {
    __u32 saddr;
    __u32 daddr;
    __u16 sport;
    __u16 dport;
    __u8 proto;
    __u8 pad[3];
};

struct mc_flow6_key {
    __u8 saddr[16];
    __u8 daddr[16];
    __u16 sport;
    __u16 dport;
    __u8 proto;
    __u8 pad[3];
};

struct mc_flow_value {
    __u64 created_ns;
};

/* counters: per-CPU array, one slot per outcome. */
#define MC_C_DIRECT 0  /* from_pod: redirected to the private NIC */
#define MC_C_TUNNEL 1  /* from_pod: tunnel entry, left to the kernel (kilo0) */
#define MC_C_LOCAL 2   /* from_pod: local entry, left to the kernel */
#define MC_C_PASS 3    /* no entry, TTL <= 1, non-IP or truncated: left to the kernel */
#define MC_C_FLOW 4    /* reply of a kernel-tracked flow handed to the stack */
#define MC_C_ERROR 5   /* a helper failed */
#define MC_C_PEER 6    /* from_private: redirected into a local pod */
#define MC_C_TRACKED 7 /* egress: a new flow recorded */
#define MC_COUNTERS 8

struct mc_counter {
    __u64 packets;
    __u64 bytes;
};

/* config: array of u64 slots. The slot numbers never change, whatever the layout version. */
#define MC_CFG_LAYOUT 0
#define MC_CFG_SOURCE_HASH 1
#define MC_CFG_MARK 2
#define MC_CFG_CLSACT 3 /* 1: the loader fell back to clsact filters (no tcx) */
#define MC_CONFIG_SLOTS 8

#endif
