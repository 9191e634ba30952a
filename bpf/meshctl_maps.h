// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* meshctl fast path: every pinned map's layout, in one place.
 *
 * ctl/meshctl/datapath/layout.py mirrors this file field by field (tests compare the two through
 * the kernel's view of the compiled maps). Change a layout -> bump MC_LAYOUT_VERSION: an agent
 * that finds pinned maps of another version migrates (new maps, links switched to the new
 * programs) instead of misreading them.
 *
 * Load-time settings come from the loader as cflags (-DNAME=value), never from editing the text:
 *   MC_PIN_DIR         "<pin root>/<node>": where the maps are pinned
 *   MC_LOADER_LAYOUT   the layout version the loader's Python mirror speaks (checked below)
 *   MC_MARK            skb->mark bit of packets from_pod redirected
 *   MC_VXLAN_PORT      UDP destination port of VXLAN (host order)
 *   MC_VXLAN_VNI       VXLAN network identifier of the mesh
 *   MC_VTEP_OUI        first two bytes of a node's VXLAN MAC (the other four: its private IPv4)
 */
#ifndef MESHCTL_MAPS_H
#define MESHCTL_MAPS_H

#define MC_LAYOUT_VERSION 2

#if !defined(MC_PIN_DIR) || !defined(MC_LOADER_LAYOUT) || !defined(MC_MARK) || !defined(MC_VXLAN_PORT) || \
    !defined(MC_VXLAN_VNI) || !defined(MC_VTEP_OUI)
#error "load-time settings missing: the loader passes MC_PIN_DIR, MC_LOADER_LAYOUT, MC_MARK, MC_VXLAN_* and MC_VTEP_OUI"
#endif
#if MC_LOADER_LAYOUT != MC_LAYOUT_VERSION
#error "datapath/layout.py and meshctl_maps.h disagree on the layout version"
#endif

/* Map sizes. routes: plan entries (one per node pod CIDR). pods: local pod addresses.
 * flows4/flows6: reversed 5-tuples of flows that left through the kernel (LRU), per family. */
#define MC_ROUTES_MAX 131072
#define MC_PODS_MAX 16384
#define MC_FLOWS_MAX 65536

/* Address families as stored in keys (not AF_*: these are 4 and 6 on purpose, readable in dumps). */
#define MC_FAMILY_V4 4
#define MC_FAMILY_V6 6

/* An IPv4 or IPv6 address in 16 bytes; IPv4 uses the first 4 (v4), the rest stays zero. */
union mc_addr {
    __u8 bytes[16];
    __be32 v4;
    __be32 words[4];
};

/* routes: LPM trie. prefixlen counts the 32 family bits plus the address bits, so IPv4 and IPv6
 * prefixes live in one trie and never match each other. */
struct mc_route_key {
    __u32 prefixlen;
    __u32 family;
    union mc_addr addr;
};

/* Actions of a route (the plan's FastPathEntry.action). */
#define MC_ACT_LOCAL 1
#define MC_ACT_DIRECT 2
#define MC_ACT_TUNNEL 3

/* Encapsulation of a direct route (the plan's FastPathEntry.encap.kind); 0: raw. */
#define MC_ENCAP_NONE 0
#define MC_ENCAP_VXLAN 1
#define MC_ENCAP_IPIP 2

struct mc_route_value {
    __u32 action;
    __u32 ifindex;      /* direct: the private NIC to redirect to */
    __u32 nh_family;    /* 0: no next hop (on-link, or the kernel's route to outer_dst), else MC_FAMILY_V4/V6 */
    __u8 encap;         /* MC_ENCAP_* */
    __u8 outer_family;  /* encapsulated: MC_FAMILY_V4 (outer headers are IPv4) */
    __u16 pad;
    union mc_addr nexthop;
    union mc_addr outer_src; /* encapsulated: this node's private address */
    union mc_addr outer_dst; /* encapsulated: the peer's private address */
};

/* pods: local pod address -> host-side veth (for bpf_redirect_peer). */
struct mc_pod_key {
    __u32 family;
    union mc_addr addr;
};

struct mc_pod_value {
    __u32 ifindex;
    __u32 pad;
};

/* Source and destination port as they sit in the packet (network order), or both as one word. */
union mc_ports {
    struct {
        __be16 sport;
        __be16 dport;
    };
    __u32 both;
};

/* flows4 / flows6: the tuple of an expected reply (src/dst swapped from the packet that left).
 * Two maps so the IPv4 key, hashed on every fast-path packet, stays 16 bytes. Ports are 0 for
 * protocols without ports and for non-first fragments. */
struct mc_flow4_key {
    __be32 saddr;
    __be32 daddr;
    union mc_ports ports;
    __u8 proto;
    __u8 pad[3];
};

struct mc_flow6_key {
    union mc_addr saddr;
    union mc_addr daddr;
    union mc_ports ports;
    __u8 proto;
    __u8 pad[3];
};

struct mc_flow_value {
    __u64 created_ns;
};

/* counters: per-CPU array, one slot per outcome. Every packet a program sees moves exactly one
 * outcome slot (0-7, 8, 10); `decap` (9) counts an event on the way: a decapsulated packet also
 * moves the outcome of its inner packet (peer, flow or pass). */
#define MC_C_DIRECT 0  /* from_pod: redirected raw to the private NIC */
#define MC_C_TUNNEL 1  /* from_pod: tunnel entry, left to the kernel (kilo0) */
#define MC_C_LOCAL 2   /* from_pod: local entry, left to the kernel */
#define MC_C_PASS 3    /* no entry, TTL <= 1, non-IP, truncated or too big without DF: left to the kernel */
#define MC_C_FLOW 4    /* reply of a kernel-tracked flow handed to the stack */
#define MC_C_ERROR 5   /* a helper failed */
#define MC_C_PEER 6    /* from_private: redirected into a local pod */
#define MC_C_TRACKED 7 /* egress: a new flow recorded */
#define MC_C_ENCAP 8   /* from_pod: encapsulated (VXLAN or IPIP) and redirected to the private NIC */
#define MC_C_DECAP 9   /* from_private: an encapsulated packet for this node, decapsulated */
#define MC_C_TOO_BIG 10 /* from_pod: too big once encapsulated, DF: ICMP "fragmentation needed" sent back */
#define MC_COUNTERS 11

struct mc_counter {
    __u64 packets;
    __u64 bytes;
};

/* config: array of u64 slots. The slot numbers never change, whatever the layout version. */
#define MC_CFG_LAYOUT 0
#define MC_CFG_SOURCE_HASH 1
#define MC_CFG_MARK 2
#define MC_CFG_CLSACT 3   /* 1: the loader fell back to clsact filters (no tcx) */
#define MC_CFG_PRIVATE4 4 /* this node's private IPv4 (network order in the low 32 bits): the outer
                           * destination of encapsulated packets it accepts; 0 accepts none */
#define MC_CFG_PRIVATE_MTU 5 /* the private NIC's MTU: what an encapsulated packet must fit when the
                              * kernel has no bpf_check_mtu (before 5.12, MC_HAVE_CHECK_MTU 0) */
#define MC_CONFIG_SLOTS 8

#endif
