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

/* 1 when the flow LRU holds the tuple; with MC_FLOW_RECORD a missing tuple is added (a lookup per
 * packet, an update per flow). */
static __always_inline int mc_flow(const struct mc_pkt *p, enum mc_flow_side side, enum mc_flow_op op)
{
    union mc_ports ports = p->ports;
    if (side == MC_FLOW_REPLY) {
        ports.sport = p->ports.dport;
        ports.dport = p->ports.sport;
    }
    struct mc_flow_value v = {};
    if (p->family == MC_FAMILY_V4) {
        struct mc_flow4_key k = {};
        k.saddr = side == MC_FLOW_REPLY ? p->ip4->daddr : p->ip4->saddr;
        k.daddr = side == MC_FLOW_REPLY ? p->ip4->saddr : p->ip4->daddr;
        k.ports = ports;
        k.proto = p->proto;
        if (mc_flow4_lookup(&k))
            return 1;
        if (op == MC_FLOW_RECORD) {
            v.created_ns = bpf_ktime_get_ns();
            mc_flow4_update(&k, &v);
        }
        return 0;
    }
    struct mc_flow6_key k = {};
    struct in6_addr *s = side == MC_FLOW_REPLY ? &p->ip6->daddr : &p->ip6->saddr;
    struct in6_addr *d = side == MC_FLOW_REPLY ? &p->ip6->saddr : &p->ip6->daddr;
    __builtin_memcpy(k.saddr.bytes, s->s6_addr, 16);
    __builtin_memcpy(k.daddr.bytes, d->s6_addr, 16);
    k.ports = ports;
    k.proto = p->proto;
    if (mc_flow6_lookup(&k))
        return 1;
    if (op == MC_FLOW_RECORD) {
        v.created_ns = bpf_ktime_get_ns();
        mc_flow6_update(&k, &v);
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
