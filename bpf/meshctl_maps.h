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
 *   MC_VTEP_OUI        first two bytes of a node's VXLAN MAC (the other four: its private IPv4, or
 *                      the four words of its private IPv6 XORed: lib/encap.h, mc_vtep_id)
 *   MC_PROBE_PORT      UDP port of the agents' path probes (names probes in monitor events)
 */
#ifndef MESHCTL_MAPS_H
#define MESHCTL_MAPS_H

#define MC_LAYOUT_VERSION 4

#if !defined(MC_PIN_DIR) || !defined(MC_LOADER_LAYOUT) || !defined(MC_MARK) || !defined(MC_VXLAN_PORT) || \
    !defined(MC_VXLAN_VNI) || !defined(MC_VTEP_OUI) || !defined(MC_PROBE_PORT)
#error "load-time settings missing: the loader passes MC_PIN_DIR, MC_LOADER_LAYOUT, MC_MARK, MC_VXLAN_*, MC_VTEP_OUI and MC_PROBE_PORT"
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
    __u8 outer_family;  /* encapsulated: MC_FAMILY_V4 or MC_FAMILY_V6, the family of the outer header
                         * (outer_src and outer_dst); the pod packet inside may be either */
    __u8 flags;         /* MC_RT_* */
    __u8 pad;
    union mc_addr nexthop;
    union mc_addr outer_src; /* encapsulated: this node's private address */
    union mc_addr outer_dst; /* encapsulated: the peer's private address */
};

/* Flags of a route (mc_route_value.flags). MC_RT_TRANSLATE: the prefix is another cluster's and this
 * cluster has global ranges (the plan's FastPathEntry.translate): a packet to it leaves the cluster,
 * so a source in a mapped pod range is rewritten to its image (xlate, below). */
#define MC_RT_TRANSLATE 1

/* xlate: array of this cluster's global ranges (mesh.global_cidrs), one slot per IP family (a cluster
 * maps at most one pod range per family): its pod range and its global range, of one size. A source
 * leaving the cluster in the pod range becomes its image in the global range (MC_XL_OUT), a
 * destination arriving in the global range the pod again (MC_XL_IN): an image keeps the address's
 * host bits under the other range's first `plen` bits, so translation needs no state (lib/xlate.h).
 * An array, not an LPM trie: two lookups of a one-element trie cost more than the rest of the
 * translation. plen 0: the family has no range. */
#define MC_XLATE_SLOTS 2  /* MC_XLATE_V4, MC_XLATE_V6 */
#define MC_XLATE_V4 0
#define MC_XLATE_V6 1
#define MC_XL_OUT 1
#define MC_XL_IN 2

struct mc_xlate_value {
    __u32 plen;         /* the ranges' prefix length (address bits); 0: none of this family */
    __u32 pad;
    union mc_addr pod;  /* the pod range's first address */
    union mc_addr global; /* the global range's first address */
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

/* flowfilter: which tuples the flow LRUs (both families) may hold, so a packet whose tuple they
 * cannot hold (the common case of a direct packet) skips the LRU's hash lookup. A one-hash Bloom
 * filter of one byte per slot: a zero byte proves the LRUs lack the tuple; a set byte (a tracked
 * flow, or one the LRU has since evicted, or another tuple of the same slot) falls through to the
 * LRU lookup. Bytes, not bits: the programs set a slot with one plain byte store (no atomic OR,
 * which 5.10 lacks), so two CPUs never lose each other's slot.
 *
 * One array element in two halves and a selector, mmapped by the agent (BPF_F_MMAPABLE): the
 * programs read the half `active` names and set a new flow's slot in both (after its LRU
 * insert); the agent rebuilds the other half from the LRUs' live keys (zero it, then read the
 * keys, then set their slots: a flow the programs record meanwhile is in the keys or sets its
 * own slot after the zeroing) and switches `active` with one byte store, which clears the slots
 * of flows the LRUs no longer hold. `active` 0: the filter is off and every packet takes the LRU
 * lookup (a new map, or programs just replaced: until the agent's first rebuild after the links
 * run them, the flows older programs recorded have no slot).
 *
 * A slot: the top MC_FLOWFILTER_BITS bits of a multiply-xor hash over the key's 64-bit words
 * (h = (h ^ w) * MC_FLOWFILTER_MULT, from h = 0; the key as the LRU stores it, pad zero), which
 * the agent computes the same way (datapath/layout.py, flow_slot). */
#define MC_FLOWFILTER_BITS 20
#define MC_FLOWFILTER_SLOTS (1 << MC_FLOWFILTER_BITS) /* per half: 1 MiB */
#define MC_FLOWFILTER_MULT 0x9E3779B97F4A7C15ULL

struct mc_flowfilter {
    __u8 active;        /* 1 or 2: half 0 or 1 is the one to read; 0 (any other value): off, look every tuple up */
    __u8 pad[3];
    __u32 routes_gen;   /* the routes map's generation (route_cache, below); 0: the cache is off */
    __u8 slots[2 * MC_FLOWFILTER_SLOTS]; /* half h at h * MC_FLOWFILTER_SLOTS */
};

/* route_cache: per-CPU array, direct-mapped: the routes entry each CPU last found for a destination,
 * so the packets of a stream after its first skip the LPM trie's walk (the larger part of the direct
 * decision: ~50 ns at 100,000 entries here, where a slot hit costs a few). A slot holds the
 * destination, a copy of the entry, and the generation it was found under.
 *
 * The generation (flowfilter.routes_gen: the direct path reads that element anyway, so one lookup
 * serves both) is bumped by the agent after every write to routes, an update or a delete, which
 * retires every slot of every CPU at once. A program reads the generation before its trie lookup
 * and tags the slot it fills with that value: a lookup that raced a write is tagged with the
 * generation before it and is retired by the bump. The agent bumps it through the shared mapping
 * after the update syscall returned (microseconds, far beyond any CPU's reordering window), only on
 * store-ordered machines; elsewhere it stays 0, which fills no slot: every packet walks the trie.
 * A destination with no entry is not cached (its walk ends early: a miss is cheap). */
#define MC_ROUTE_CACHE_BITS 8
#define MC_ROUTE_CACHE_SLOTS (1 << MC_ROUTE_CACHE_BITS) /* per CPU: 24 KiB */
#define MC_ROUTE_CACHE_MULT 0x9E3779B1U /* the slot: the top bits of the address words' XOR times this */

struct mc_route_cache_slot {
    __u32 gen;          /* routes_gen when filled; never 0 for a filled slot */
    __u32 family;       /* MC_FAMILY_V4 / V6 of addr; 0: never filled */
    union mc_addr addr; /* the destination (IPv4 in the first 4 bytes, the rest zero) */
    struct mc_route_value value;
    __u64 fills;        /* how often this CPU filled the slot (trie walks that found an entry), ever */
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
#define MC_C_TRANSLATED 11 /* an event on the way, like decap: a source or destination (or an ICMP error's quoted
                            * packet) rewritten between a pod range and its global range (lib/xlate.h) */
#define MC_COUNTERS 12

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
#define MC_CFG_MONITOR 6 /* bit i set: monitor slot i is claimed (lib/monitor.h); 0: no event path at all */
#define MC_CFG_OBJECTS 7 /* where the loader took the programs from (shipped, compiled, cached); no program reads it */
#define MC_CFG_PRIVATE6 8 /* this node's private IPv6 in two slots (8: bytes 0-7, 9: bytes 8-15, each in
                           * packet order as a little-endian u64 reads them): the outer destination of
                           * encapsulated packets it accepts over IPv6; all zero accepts none */
#define MC_CFG_XLATE 10 /* 1: xlate holds this cluster's global ranges; 0: no translation (the programs skip it) */
#define MC_CONFIG_SLOTS 11

/* Monitor (`meshctl monitor`, lib/monitor.h, ctl/meshctl/datapath/monitor.py). New maps only: the
 * layouts above are untouched, so adding them needs no layout bump (a loader of this source
 * creates them next to the pinned maps it reopens).
 *
 *   config[MC_CFG_MONITOR]   the gate: a bitmask of claimed slots. Every program reads it first;
 *                            0 (no monitor) skips the whole event path: one array lookup per packet.
 *   mon_slots[i]             slot i's filter (source/destination prefix, a mask of event types)
 *                            and its token bucket (rate, and the bucket's state as one virtual
 *                            clock). The CLI writes the filter when it claims the slot; the
 *                            programs advance the clock, only for the events they let through.
 *   mon_ring<i>              slot i's own ring buffer (BPF_MAP_TYPE_RINGBUF): one reader each, so
 *                            two monitors never share a consumer position.
 *   mon_lost                 per-CPU array, MC_MON_LOST_KINDS counters per slot: events a slot's
 *                            filter matched but that were lost to its rate or to its full ring.
 *
 * A slot is claimed by flock(2) on the directory <pin dir>/monitor/slot<i> (bpffs holds no regular
 * files; a directory takes a lock), so a monitor that exits, is interrupted or crashes frees its
 * slot with its descriptors. The gate is rewritten under flock of <pin dir>/monitor from the slots
 * whose lock is held, so a crashed monitor's bit is cleared by the next monitor that starts or ends.
 * The programs loop over the MC_MON_SLOTS slots (a bounded, unrolled loop) for each event. */
#define MC_MON_SLOTS 4
#define MC_MON_RING_BYTES 1048576 /* per slot (1 MiB: ~8,000 events); a power of two, a multiple of the page size */

/* Where an event was seen (struct mc_event.hook). */
#define MC_HOOK_FROM_POD 1     /* tc ingress of a pod veth */
#define MC_HOOK_FROM_PRIVATE 2 /* tc ingress of the private NIC */
#define MC_HOOK_FLOW_EGRESS 3  /* tc egress: a packet leaving through the kernel */
#define MC_HOOK_FROM_TUNNEL 4  /* tc ingress of the tunnel device (kilo0): global destinations translated */
#define MC_HOOK_TUNNEL_EGRESS 5 /* tc egress of the tunnel device: sources leaving the cluster translated */

/* Event types (bit numbers of mc_mon_slot.types; `--type`). The event's type follows from its
 * outcome (MC_C_*) and whether it was decapsulated (mc_mon_type, lib/monitor.h). */
#define MC_T_DROP 0
#define MC_T_DIRECT 1
#define MC_T_ENCAP 2
#define MC_T_TUNNEL 3 /* `relay` is a tunnel event whose destination the plan reaches through a relay */
#define MC_T_LOCAL 4
#define MC_T_PASS 5
#define MC_T_COUNT 6

/* Why a packet was handed to the kernel or dropped (struct mc_event.reason); 0 for a forwarded one. */
#define MC_R_NONE 0
#define MC_R_NOT_IP 1       /* not IPv4/IPv6, or truncated or malformed */
#define MC_R_NO_ENTRY 2     /* no routes entry (from_pod) / not a local pod address (from_private) */
#define MC_R_TTL 3          /* TTL / hop limit <= 1: the kernel answers time exceeded */
#define MC_R_TOO_BIG 4      /* larger than the path MTU once encapsulated */
#define MC_R_FRAGMENT 5     /* larger than the path MTU, IPv4 without DF: left to the kernel to fragment */
#define MC_R_KERNEL_FLOW 6  /* a reply of a flow that left through the kernel (NAT, NodePort) */
#define MC_R_TUNNEL 7       /* a tunnel entry: WireGuard, through the kernel */
#define MC_R_LOCAL 8        /* a local entry: the kernel delivers it */
#define MC_R_HELPER 9       /* a helper failed (encapsulation, decapsulation, ICMP reply): dropped */
#define MC_R_REDIRECT 10    /* the redirect helper refused (no such device or next hop): dropped */
#define MC_R_EGRESS 11      /* left through the kernel (egress hook) */
#define MC_R_PROBE 12       /* a path probe (UDP to the agent's probe port, MC_PROBE_PORT): the agent answers */
#define MC_R_NEXTHOP 13     /* an IPv6 packet whose raw direct entry names an IPv4 next hop: no neighbour resolves it, left to the kernel */
#define MC_R_TUNNEL_IN 14   /* arrived through the tunnel device: the kernel delivers it */

/* mon_lost: counter index slot * MC_MON_LOST_KINDS + kind. */
#define MC_MON_LOST_RATE 0
#define MC_MON_LOST_BUFFER 1
#define MC_MON_LOST_KINDS 2

/* A monitor's address filter: family 0 matches everything; else the first `prefixlen` bits of
 * the source (destination) must equal addr's. */
struct mc_mon_prefix {
    __u32 family;
    __u32 prefixlen;
    union mc_addr addr;
};

struct mc_mon_slot {
    __u32 types;        /* bit MC_T_* set: events of that type are wanted */
    __u32 pad;
    __u64 cost_ns;      /* the bucket's time per event: 1e9 / rate; 0: unlimited */
    __u64 tat_ns;       /* the bucket as a virtual clock: when it would be full again (GCRA) */
    __u64 pad2;
    struct mc_mon_prefix src;
    struct mc_mon_prefix dst;
};
#define MC_MON_BURST_NS 1000000000ULL /* the bucket holds one second of events */

/* One event in a slot's ring buffer. Addresses are the packet's as the hook saw it (the inner
 * ones of an encapsulated packet); the outer ones are the entry's. */
struct mc_event {
    __u64 ts_ns;        /* bpf_ktime_get_ns (CLOCK_MONOTONIC) */
    __u32 ifindex;      /* the interface the hook ran on */
    __u32 len;          /* skb->len at the hook (the Ethernet frame, as a capture sees it) */
    __u32 out_ifindex;  /* where it was redirected; 0: handed to the kernel or dropped */
    __u32 mtu;          /* MC_R_TOO_BIG / MC_R_FRAGMENT: the MTU it did not fit */
    __u8 hook;          /* MC_HOOK_* */
    __u8 outcome;       /* MC_C_* (the counter this packet moved) */
    __u8 type;          /* MC_T_* */
    __u8 reason;        /* MC_R_* */
    __u8 family;        /* MC_FAMILY_V4 / V6; 0: not IP */
    __u8 proto;
    __u8 action;        /* the routes entry's MC_ACT_*; 0: none looked up or found */
    __u8 encap;         /* MC_ENCAP_* of the entry, or of the decapsulated packet */
    __u8 nh_family;
    __u8 decap;         /* 1: the packet arrived encapsulated and was unwrapped */
    __u8 outer_family;  /* encapsulated or decapsulated: MC_FAMILY_V4 / V6 of outer_src, outer_dst */
    __u8 xlated;        /* MC_XLATED_* bits: what the program rewrote (lib/xlate.h); 0: nothing */
    union mc_ports ports;
    union mc_addr saddr;
    union mc_addr daddr;
    union mc_addr nexthop;
    union mc_addr outer_src;
    union mc_addr outer_dst;
    union mc_addr xsaddr; /* the source after translation (MC_XLATED_SRC), else zero */
    union mc_addr xdaddr; /* the destination after translation (MC_XLATED_DST), else zero */
};
#define MC_XLATED_SRC 1   /* the source became its global image (leaving the cluster) */
#define MC_XLATED_DST 2   /* the destination, a global image, became the local pod (arriving) */
#define MC_XLATED_INNER 4 /* an ICMP error: the packet it quotes was translated the other way */

#endif
