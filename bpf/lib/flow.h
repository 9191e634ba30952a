// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Flow tracking for flows that left through the kernel (kube-proxy NAT, NodePort, ...): the egress
 * program records the tuple of their replies, and the forwarding programs hand those replies back
 * to the kernel (its conntrack and reverse NAT) instead of bypassing it. */
#ifndef MC_LIB_FLOW_H
#define MC_LIB_FLOW_H

enum mc_flow_side {
    MC_FLOW_AS_SEEN = 0, /* the packet's own tuple */
    MC_FLOW_REPLY = 1,   /* the tuple of the packet's reply (addresses and ports swapped) */
};

enum mc_flow_op {
    MC_FLOW_LOOKUP = 0,
    MC_FLOW_RECORD = 1,  /* add the tuple when it is missing */
};

/* One step of the flow filter's hash over a key's 64-bit words (meshctl_maps.h, flowfilter),
 * written out per key size below, and one branch per half in mc_flow_maybe: 5.10's verifier
 * refused a loop over the words (bcc left it a loop) with the half computed as ~active & 1
 * ("unbounded min value" for the slot's offset). */
static __always_inline __u64 mc_flow_mix(__u64 h, __u64 w)
{
    return (h ^ w) * MC_FLOWFILTER_MULT;
}

static __always_inline __u32 mc_flow_top(__u64 h)
{
    return h >> (64 - MC_FLOWFILTER_BITS);
}

/* 0 when the filter proves the flow LRUs lack every tuple of `slot`; 1 when they may hold one, or
 * the filter is off. One branch per half, so each access has a constant base. */
static __always_inline int mc_flow_maybe(__u32 slot)
{
    const struct mc_flowfilter *f = mc_flowfilter();
    if (!f)
        return 1;
    slot &= MC_FLOWFILTER_SLOTS - 1;
    if (f->active == 1)
        return f->slots[slot];
    if (f->active == 2)
        return f->slots[MC_FLOWFILTER_SLOTS + slot];
    return 1;
}

/* Sets `slot` in both halves, so the half the agent rebuilds keeps a flow recorded meanwhile. */
static __always_inline void mc_flow_mark(__u32 slot)
{
    struct mc_flowfilter *f = mc_flowfilter();
    if (!f)
        return;
    slot &= MC_FLOWFILTER_SLOTS - 1;
    f->slots[slot] = 1;
    f->slots[MC_FLOWFILTER_SLOTS + slot] = 1;
}

/* The keys as the hash reads them: their 64-bit words (the union aligns them for 8-byte loads). */
union mc_flow4_words {
    struct mc_flow4_key k;
    __u64 w[2];
};

union mc_flow6_words {
    struct mc_flow6_key k;
    __u64 w[5];
};

_Static_assert(sizeof(struct mc_flow4_key) == sizeof(__u64[2]), "the hash reads the IPv4 key as two words");
_Static_assert(sizeof(struct mc_flow6_key) == sizeof(__u64[5]), "the hash reads the IPv6 key as five words");

static __always_inline __u32 mc_flow4_slot(const union mc_flow4_words *u)
{
    return mc_flow_top(mc_flow_mix(mc_flow_mix(0, u->w[0]), u->w[1]));
}

static __always_inline __u32 mc_flow6_slot(const union mc_flow6_words *u)
{
    __u64 h = mc_flow_mix(mc_flow_mix(0, u->w[0]), u->w[1]);
    return mc_flow_top(mc_flow_mix(mc_flow_mix(mc_flow_mix(h, u->w[2]), u->w[3]), u->w[4]));
}

/* 1 when the flow LRU holds the tuple. MC_FLOW_LOOKUP (a forwarding program, every packet): the
 * filter test, and the LRU lookup only where the filter cannot prove the tuple absent.
 * MC_FLOW_RECORD (the egress tracker): the LRU lookup (a tracked flow's packets find their tuple,
 * so a filter test would only add to them), and for a missing tuple the insert and its slot. */
static __always_inline int mc_flow(const struct mc_pkt *p, enum mc_flow_side side, enum mc_flow_op op)
{
    union mc_ports ports = p->ports;
    if (side == MC_FLOW_REPLY) {
        ports.sport = p->ports.dport;
        ports.dport = p->ports.sport;
    }
    struct mc_flow_value v = {};
    if (p->family == MC_FAMILY_V4) {
        union mc_flow4_words u = {};
        u.k.saddr = side == MC_FLOW_REPLY ? p->ip4->daddr : p->ip4->saddr;
        u.k.daddr = side == MC_FLOW_REPLY ? p->ip4->saddr : p->ip4->daddr;
        u.k.ports = ports;
        u.k.proto = p->proto;
        if (op == MC_FLOW_LOOKUP && !mc_flow_maybe(mc_flow4_slot(&u)))
            return 0;
        if (mc_flow4_lookup(&u.k))
            return 1;
        if (op == MC_FLOW_RECORD) {
            v.created_ns = bpf_ktime_get_ns();
            mc_flow4_update(&u.k, &v);
            mc_flow_mark(mc_flow4_slot(&u));
        }
        return 0;
    }
    union mc_flow6_words u = {};
    struct in6_addr *s = side == MC_FLOW_REPLY ? &p->ip6->daddr : &p->ip6->saddr;
    struct in6_addr *d = side == MC_FLOW_REPLY ? &p->ip6->saddr : &p->ip6->daddr;
    __builtin_memcpy(u.k.saddr.bytes, s->s6_addr, 16);
    __builtin_memcpy(u.k.daddr.bytes, d->s6_addr, 16);
    u.k.ports = ports;
    u.k.proto = p->proto;
    if (op == MC_FLOW_LOOKUP && !mc_flow_maybe(mc_flow6_slot(&u)))
        return 0;
    if (mc_flow6_lookup(&u.k))
        return 1;
    if (op == MC_FLOW_RECORD) {
        v.created_ns = bpf_ktime_get_ns();
        mc_flow6_update(&u.k, &v);
        mc_flow_mark(mc_flow6_slot(&u));
    }
    return 0;
}

/* Whether the packet is a reply of a flow that left through the kernel. */
static __always_inline int mc_flow_is_kernel_reply(const struct mc_pkt *p)
{
    return mc_flow(p, MC_FLOW_AS_SEEN, MC_FLOW_LOOKUP);
}

/* Records the reply tuple of a packet leaving through the kernel; 1 when the flow was new. */
static __always_inline int mc_flow_track(const struct mc_pkt *p)
{
    return !mc_flow(p, MC_FLOW_REPLY, MC_FLOW_RECORD);
}

#endif
