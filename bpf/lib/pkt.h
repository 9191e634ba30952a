// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Packet parsing: the one place that validates packet pointers. mc_parse hands the others typed
 * header pointers whose bounds the verifier already knows; nothing else compares against
 * data_end. Any helper that changes the packet (adjust_room, change_tail, store_bytes, pull_data)
 * invalidates every pointer: call mc_parse again before touching headers. */
#ifndef MC_LIB_PKT_H
#define MC_LIB_PKT_H

/* Bytes the programs read from the linear part at most: Ethernet, IPv4 header with options, ports. */
#define MC_PULL (ETH_HLEN + MC_IP_HLEN_MAX + 4)

/* Verifier: packet pointers kept in this struct on the stack keep the range mc_parse proved for
 * them, so the helpers below dereference p->ip4 / p->ip6 without checking data_end again. */
struct mc_pkt {
    struct ethhdr *eth;        /* NULL on a device without a link-layer header (kilo0: mc_parse_l3) */
    union {                    /* by family: exactly one is valid */
        struct iphdr *ip4;
        struct ipv6hdr *ip6;
    };
    union mc_ports ports;      /* 0 when the packet carries none (or a non-first fragment) */
    __u32 family;              /* MC_FAMILY_V4 / MC_FAMILY_V6 */
    __u32 l3_off;              /* offset of the IP header from skb->data: ETH_HLEN, or 0 (mc_parse_l3) */
    __u32 l4_off;              /* offset of the L4 header from skb->data */
    __u8 proto;                /* L4 protocol (IPv6: the first next header) */
};

static __always_inline int mc_has_ports(__u8 proto)
{
    return proto == IPPROTO_TCP || proto == IPPROTO_UDP || proto == IPPROTO_SCTP;
}

/* Fills `p` from a packet carrying IPv4 or IPv6 after `l2` bytes of link-layer header: an Ethernet
 * frame (ETH_HLEN: mc_parse), or an IP packet on a device without one (0, the protocol read from
 * skb->protocol: mc_parse_l3). `l2` is a constant in each caller. -1: another protocol, truncated or
 * malformed (the kernel deals with it). */
static __always_inline int mc_parse_from(struct __sk_buff *skb, struct mc_pkt *p, __u32 l2)
{
    void *data = (void *)(long)skb->data;
    void *end = (void *)(long)skb->data_end;
    if (data + MC_PULL > end && skb->len > end - data) {
        /* Headers partly outside the linear area (rare on veth): pull what we read. */
        bpf_skb_pull_data(skb, skb->len < MC_PULL ? skb->len : MC_PULL);
        data = (void *)(long)skb->data;
        end = (void *)(long)skb->data_end;
    }
    __be16 proto;
    if (l2) {
        struct ethhdr *eth = data;
        if ((void *)(eth + 1) > end)
            return -1;
        p->eth = eth;
        proto = eth->h_proto;
    } else {
        p->eth = NULL;
        proto = skb->protocol;
    }
    p->ports.both = 0;
    p->l3_off = l2;
    int frag = 0;
    void *l4;
    if (proto == bpf_htons(ETH_P_IP)) {
        struct iphdr *ip = data + l2;
        if ((void *)(ip + 1) > end || ip->version != 4 || ip->ihl < MC_IP_IHL_MIN)
            return -1;
        /* Verifier: the masked header length gives l4 a known upper bound (MC_IP_HLEN_MAX) for the
         * check below. */
        __u32 hl = (ip->ihl & 0xf) * 4;
        l4 = (void *)ip + hl;
        if (l4 > end)
            return -1; /* options cut off: malformed, the kernel drops it */
        p->ip4 = ip;
        p->family = MC_FAMILY_V4;
        p->proto = ip->protocol;
        p->l4_off = l2 + hl;
        frag = (ip->frag_off & bpf_htons(MC_IP_OFFSET)) != 0;
    } else if (proto == bpf_htons(ETH_P_IPV6)) {
        struct ipv6hdr *ip6 = data + l2;
        if ((void *)(ip6 + 1) > end || ip6->version != 6)
            return -1;
        l4 = ip6 + 1;
        p->ip6 = ip6;
        p->family = MC_FAMILY_V6;
        p->proto = ip6->nexthdr;
        p->l4_off = l2 + sizeof(*ip6);
    } else {
        return -1;
    }
    if (!frag && mc_has_ports(p->proto) && l4 + sizeof(union mc_ports) <= end)
        p->ports = *(union mc_ports *)l4;
    return 0;
}

/* An Ethernet frame (the pod veths and the private NIC). */
static __always_inline int mc_parse(struct __sk_buff *skb, struct mc_pkt *p)
{
    return mc_parse_from(skb, p, ETH_HLEN);
}

/* An IP packet on a device without a link-layer header: the tunnel device (WireGuard, kernel or
 * wireguard-go's tun), whose tc hooks see the IP header at skb->data. */
static __always_inline int mc_parse_l3(struct __sk_buff *skb, struct mc_pkt *p)
{
    return mc_parse_from(skb, p, 0);
}

/* The source address, in the 16-byte form of keys. */
static __always_inline void mc_saddr(const struct mc_pkt *p, union mc_addr *a)
{
    if (p->family == MC_FAMILY_V4)
        a->v4 = p->ip4->saddr;
    else
        __builtin_memcpy(a->bytes, p->ip6->saddr.s6_addr, 16);
}

/* The destination address, in the 16-byte form of keys. */
static __always_inline void mc_daddr(const struct mc_pkt *p, union mc_addr *a)
{
    if (p->family == MC_FAMILY_V4)
        a->v4 = p->ip4->daddr;
    else
        __builtin_memcpy(a->bytes, p->ip6->daddr.s6_addr, 16);
}

/* The packet's TOS (IPv4) or traffic class (IPv6): what an outer header copies. */
static __always_inline __u8 mc_tclass(const struct mc_pkt *p)
{
    if (p->family == MC_FAMILY_V4)
        return p->ip4->tos;
    return (p->ip6->priority << 4) | (p->ip6->flow_lbl[0] >> 4);
}

/* Decrements the TTL / hop limit as the kernel's forwarding would. -1: TTL <= 1 (the kernel must
 * answer with ICMP time exceeded). */
static __always_inline int mc_dec_ttl(struct mc_pkt *p)
{
    if (p->family == MC_FAMILY_V4) {
        struct iphdr *ip = p->ip4;
        if (ip->ttl <= 1)
            return -1;
        /* RFC 1624 incremental update: TTL is the high byte of its 16-bit word. */
        __u32 check = ip->check;
        check += bpf_htons(0x0100);
        ip->check = (__u16)(check + (check >= 0xFFFF));
        ip->ttl--;
        return 0;
    }
    if (p->ip6->hop_limit <= 1)
        return -1;
    p->ip6->hop_limit--;
    return 0;
}

#endif
