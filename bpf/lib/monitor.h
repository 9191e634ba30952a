// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Packet events for `meshctl monitor` (map layout and slot design: meshctl_maps.h, "Monitor").
 *
 * Each program keeps a `struct mc_note` on its stack. Its first field is the gate, read once per
 * packet from config[MC_CFG_MONITOR] before anything else of the event path; when it is 0 (no
 * monitor attached) nothing below runs but tests of that stack value. When a slot is claimed the
 * note collects the packet's tuple and the decision as the program makes it, and the program's
 * entry point hands it to mc_mon_emit once the verdict is known: for each claimed slot, the
 * slot's filter (in the kernel), then its token bucket, then its ring buffer. An event a filter
 * matched and that a bucket or a full ring lost is counted in mon_lost, never dropped silently.
 *
 * The maps are reached through accessors of datapath.c (mc_mon_slot, mc_mon_output,
 * mc_mon_count_lost): bcc rewrites map calls only in the main file. */
#ifndef MC_LIB_MONITOR_H
#define MC_LIB_MONITOR_H

struct mc_note {
    __u64 slots;         /* config[MC_CFG_MONITOR]: 0, nothing but len is used */
    __u32 len;           /* skb->len as the program was called (what the counters count) */
    struct mc_event ev;  /* filled only when slots != 0 */
};

/* The gate: the claimed slots' bitmask; and, when there are any, a clean event. */
static __always_inline void mc_note_init(struct mc_note *n, struct __sk_buff *skb, __u8 hook)
{
    n->slots = mc_config(MC_CFG_MONITOR);
    n->len = skb->len;
    if (!n->slots)
        return;
    __builtin_memset(&n->ev, 0, sizeof(n->ev));
    n->ev.hook = hook;
    n->ev.ifindex = skb->ifindex;
    n->ev.len = skb->len;
}

/* The packet's tuple (call right after mc_parse, before anything changes the packet). */
static __always_inline void mc_note_pkt(struct mc_note *n, const struct mc_pkt *p)
{
    if (!n->slots)
        return;
    n->ev.family = p->family;
    n->ev.proto = p->proto;
    n->ev.ports = p->ports;
    if (p->family == MC_FAMILY_V4) {
        n->ev.saddr.v4 = p->ip4->saddr;
        n->ev.daddr.v4 = p->ip4->daddr;
    } else {
        __builtin_memcpy(n->ev.saddr.bytes, p->ip6->saddr.s6_addr, 16);
        __builtin_memcpy(n->ev.daddr.bytes, p->ip6->daddr.s6_addr, 16);
    }
}

/* The routes entry the decision came from. */
static __always_inline void mc_note_route(struct mc_note *n, const struct mc_route_value *r)
{
    if (!n->slots)
        return;
    n->ev.action = r->action;
    n->ev.encap = r->encap;
    n->ev.nh_family = r->nh_family;
    n->ev.out_ifindex = r->ifindex;
    __builtin_memcpy(&n->ev.nexthop, &r->nexthop, sizeof(r->nexthop));
    __builtin_memcpy(&n->ev.outer_src, &r->outer_src, sizeof(r->outer_src));
    __builtin_memcpy(&n->ev.outer_dst, &r->outer_dst, sizeof(r->outer_dst));
    n->ev.outer_family = r->outer_family;
}

/* The packet was decapsulated: the tuple noted so far was the outer one (IPv4 or IPv6), `p`
 * parses the inner packet now. */
static __always_inline void mc_note_decap(struct mc_note *n, const struct mc_pkt *p)
{
    if (!n->slots)
        return;
    n->ev.decap = 1;
    n->ev.encap = n->ev.proto == IPPROTO_UDP ? MC_ENCAP_VXLAN : MC_ENCAP_IPIP;
    n->ev.outer_family = n->ev.family;
    __builtin_memcpy(&n->ev.outer_src, &n->ev.saddr, sizeof(n->ev.saddr));
    __builtin_memcpy(&n->ev.outer_dst, &n->ev.daddr, sizeof(n->ev.daddr));
    __builtin_memset(&n->ev.saddr, 0, sizeof(n->ev.saddr));
    __builtin_memset(&n->ev.daddr, 0, sizeof(n->ev.daddr));
    mc_note_pkt(n, p);
}

/* A translation (lib/xlate.h): `bit` (MC_XLATED_*) and the address it made; a quoted packet's
 * (MC_XLATED_INNER) is not kept, the bit says it was translated. */
static __always_inline void mc_note_xlated(struct mc_note *n, __u8 bit, const union mc_addr *a)
{
    if (!n->slots)
        return;
    n->ev.xlated |= bit;
    if (bit == MC_XLATED_SRC)
        n->ev.xsaddr = *a;
    else if (bit == MC_XLATED_DST)
        n->ev.xdaddr = *a;
}

/* The interface the packet is redirected to (when no routes entry names it). */
static __always_inline void mc_note_out(struct mc_note *n, __u32 ifindex)
{
    if (n->slots)
        n->ev.out_ifindex = ifindex;
}

static __always_inline void mc_note_mtu(struct mc_note *n, __u32 mtu)
{
    if (n->slots)
        n->ev.mtu = mtu;
}

/* The decision: the counter it moves (MC_C_*), why (MC_R_*), and where it went (0: the kernel). */
static __always_inline void mc_note_end(struct mc_note *n, __u32 outcome, __u32 reason)
{
    if (!n->slots)
        return;
    n->ev.outcome = outcome;
    n->ev.reason = reason;
    if (outcome != MC_C_DIRECT && outcome != MC_C_ENCAP && outcome != MC_C_PEER && outcome != MC_C_TOO_BIG)
        n->ev.out_ifindex = 0;
}

/* The event type (MC_T_*) of a decision. */
static __always_inline __u32 mc_mon_type(const struct mc_event *ev)
{
    switch (ev->outcome) {
    case MC_C_DIRECT:
        return MC_T_DIRECT;
    case MC_C_PEER:
        return ev->decap ? MC_T_ENCAP : MC_T_DIRECT;
    case MC_C_ENCAP:
        return MC_T_ENCAP;
    case MC_C_TUNNEL:
        return MC_T_TUNNEL;
    case MC_C_LOCAL:
        return MC_T_LOCAL;
    case MC_C_ERROR:
    case MC_C_TOO_BIG:
        return MC_T_DROP;
    default:
        return MC_T_PASS;
    }
}

/* Whether the first f->prefixlen bits of `a` are f's (family 0: any address). */
static __always_inline int mc_mon_prefix_match(const struct mc_mon_prefix *f, __u32 family, const union mc_addr *a)
{
    if (f->family == 0)
        return 1;
    if (f->family != family)
        return 0;
#pragma unroll
    for (int w = 0; w < 4; w++) {
        __s32 bits = (__s32)f->prefixlen - 32 * w;
        if (bits <= 0)
            break;
        __u32 mask = bits >= 32 ? 0xffffffff : bpf_htonl(~((1U << (32 - bits)) - 1));
        if ((a->words[w] ^ f->addr.words[w]) & mask)
            return 0;
    }
    return 1;
}

/* The token bucket of a slot: 1 when an event may go out now. The bucket is kept as the
 * generic cell rate algorithm's virtual clock `tat` (the time the bucket would be full again):
 * an event may go when tat - now leaves room for one more event's cost within the burst, and it
 * advances tat by its cost. A refused event writes nothing, so a busy node's CPUs do not fight
 * over the slot's cache line for events nobody sees. The clock is updated without a lock (5.10
 * has no atomic compare-and-exchange for programs): two CPUs racing may let an event too many
 * through, never lose count (the caller counts what it refuses). */
static __always_inline int mc_mon_take(struct mc_mon_slot *s, __u64 now)
{
    __u64 cost = s->cost_ns;
    if (cost == 0)
        return 1;
    __u64 tat = s->tat_ns;
    if (tat < now)
        tat = now;
    if (tat - now + cost > MC_MON_BURST_NS)
        return 0;
    s->tat_ns = tat + cost;
    return 1;
}

/* Hands the note's event to every claimed slot whose filter matches it. */
static __always_inline void mc_mon_emit(struct mc_note *n)
{
    struct mc_event *ev = &n->ev;
    ev->type = mc_mon_type(ev);
    if (ev->reason == MC_R_NO_ENTRY && ev->proto == IPPROTO_UDP && ev->ports.dport == bpf_htons(MC_PROBE_PORT))
        ev->reason = MC_R_PROBE;
    ev->ts_ns = bpf_ktime_get_ns();
#pragma unroll
    for (__u32 i = 0; i < MC_MON_SLOTS; i++) {
        if (!(n->slots & (1ULL << i)))
            continue;
        struct mc_mon_slot *s = mc_mon_slot(i);
        /* A translated address matches in either form (the pod's own, or its image). */
        if (!s || !(s->types & (1U << ev->type)) ||
            !(mc_mon_prefix_match(&s->src, ev->family, &ev->saddr) ||
              ((ev->xlated & MC_XLATED_SRC) && mc_mon_prefix_match(&s->src, ev->family, &ev->xsaddr))) ||
            !(mc_mon_prefix_match(&s->dst, ev->family, &ev->daddr) ||
              ((ev->xlated & MC_XLATED_DST) && mc_mon_prefix_match(&s->dst, ev->family, &ev->xdaddr))))
            continue;
        if (!mc_mon_take(s, ev->ts_ns))
            mc_mon_count_lost(i, MC_MON_LOST_RATE);
        else if (mc_mon_output(i, ev) < 0)
            mc_mon_count_lost(i, MC_MON_LOST_BUFFER);
    }
}

#endif
