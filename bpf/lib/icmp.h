// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Path MTU discovery through the fast path: a packet that would be too big once encapsulated is
 * answered as a router would, with ICMP "fragmentation needed" carrying the MTU left for it, so
 * the pod's stack lowers its path MTU (and TCP its segment size) for that destination. */
#ifndef MC_LIB_ICMP_H
#define MC_LIB_ICMP_H

/* Turns the packet `p` into `msg` (`len` bytes, an IP packet) behind an Ethernet header back to
 * its sender (MACs swapped). 0, or -1 when a helper failed (drop: the packet may be half
 * rewritten). */
static __always_inline int mc_rewrite_as_reply(struct __sk_buff *skb, const struct mc_pkt *p, void *msg, __u32 len)
{
    struct ethhdr eth = {};
    __builtin_memcpy(eth.h_dest, p->eth->h_source, ETH_ALEN);
    __builtin_memcpy(eth.h_source, p->eth->h_dest, ETH_ALEN);
    eth.h_proto = p->eth->h_proto;
    if (bpf_skb_change_tail(skb, ETH_HLEN + len, 0) < 0)
        return -1;
    if (bpf_skb_store_bytes(skb, 0, &eth, sizeof(eth), 0) < 0 || bpf_skb_store_bytes(skb, ETH_HLEN, msg, len, 0) < 0)
        return -1;
    return 0;
}

struct mc_icmp4_too_big {
    struct iphdr ip;
    struct icmphdr icmp;
    struct iphdr orig_ip; /* the offending packet's header and first 8 payload bytes (RFC 792) */
    __u8 orig_l4[8];
};

/* Rewrites the IPv4 packet `p` (no options) into the ICMP error from `from` to its sender; the
 * caller redirects it back out of the interface it came in on. 0, or -1 when it cannot (the packet
 * is then unchanged, or changed only if a helper failed halfway: drop). `p` is stale afterwards. */
static __always_inline int mc_icmp4_too_big(struct __sk_buff *skb, const struct mc_pkt *p, __u32 mtu, __be32 from)
{
    if (p->ip4->ihl != MC_IP_IHL_MIN)
        return -1;
    struct mc_icmp4_too_big m = {};
    /* One load for the header and the 8 bytes after it (they are adjacent in m). */
    if (bpf_skb_load_bytes(skb, ETH_HLEN, &m.orig_ip, sizeof(m.orig_ip) + sizeof(m.orig_l4)) < 0)
        return -1;
    m.icmp.type = ICMP_DEST_UNREACH;
    m.icmp.code = ICMP_FRAG_NEEDED;
    m.icmp.un.frag.mtu = bpf_htons(mtu);
    m.icmp.checksum = mc_csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)&m.icmp, sizeof(m) - sizeof(m.ip), 0));
    mc_ip4_header(&m.ip, IPPROTO_ICMP, sizeof(m), 0, from, m.orig_ip.saddr);
    return mc_rewrite_as_reply(skb, p, &m, sizeof(m));
}

/* ICMPv6 "packet too big": the offending packet's header and 8 bytes are enough for the pod's
 * stack to find its socket (RFC 4443 asks for as much as fits in 1280 bytes; Linux reads these). */
#define MC_ICMP6_QUOTE (sizeof(struct ipv6hdr) + 8)

struct mc_icmp6_too_big {
    struct ipv6hdr ip6;
    struct icmp6hdr icmp6;
    __u8 quote[MC_ICMP6_QUOTE];
};

/* The IPv6 pseudo-header of the ICMPv6 checksum (RFC 8200 8.1). */
struct mc_ip6_pseudo {
    struct in6_addr saddr;
    struct in6_addr daddr;
    __be32 len;
    __u8 zero[3];
    __u8 nexthdr;
};

/* The IPv6 form of mc_icmp4_too_big. Its source is the offending packet's destination: the node
 * has no IPv6 address of its own in the maps, and the pod's stack checks the quoted packet, not the
 * sender, before it lowers its path MTU. */
static __always_inline int mc_icmp6_too_big(struct __sk_buff *skb, const struct mc_pkt *p, __u32 mtu)
{
    struct mc_icmp6_too_big m = {};
    struct mc_ip6_pseudo ph = {};
    if (bpf_skb_load_bytes(skb, ETH_HLEN, m.quote, sizeof(m.quote)) < 0)
        return -1;
    __u16 plen = sizeof(m) - sizeof(m.ip6);
    m.ip6.version = 6;
    m.ip6.payload_len = bpf_htons(plen);
    m.ip6.nexthdr = IPPROTO_ICMPV6;
    m.ip6.hop_limit = MC_ICMP6_HOP_LIMIT;
    m.ip6.saddr = p->ip6->daddr;
    m.ip6.daddr = p->ip6->saddr;
    m.icmp6.icmp6_type = ICMPV6_PKT_TOOBIG;
    m.icmp6.icmp6_mtu = bpf_htonl(mtu);
    ph.saddr = m.ip6.saddr;
    ph.daddr = m.ip6.daddr;
    ph.len = bpf_htonl(plen);
    ph.nexthdr = IPPROTO_ICMPV6;
    __s64 sum = bpf_csum_diff(NULL, 0, (__be32 *)&ph, sizeof(ph), 0);
    m.icmp6.icmp6_cksum = mc_csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)&m.icmp6, plen, sum));
    return mc_rewrite_as_reply(skb, p, &m, sizeof(m));
}

#endif
