/* Path MTU discovery through the fast path: a packet that would be too big once encapsulated is
 * answered as a router would, with ICMP "fragmentation needed" carrying the MTU left for it, so
 * the pod's stack lowers its path MTU (and TCP its segment size) for that destination. */
#ifndef MC_LIB_ICMP_H
#define MC_LIB_ICMP_H

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
    if (p->ip4->ihl != 5)
        return -1;
    struct mc_icmp4_too_big m = {};
    struct ethhdr eth = {};
    __builtin_memcpy(eth.h_dest, p->eth->h_source, ETH_ALEN);
    __builtin_memcpy(eth.h_source, p->eth->h_dest, ETH_ALEN);
    eth.h_proto = bpf_htons(ETH_P_IP);
    /* One load for the header and the 8 bytes after it (they are adjacent in m). */
    if (bpf_skb_load_bytes(skb, ETH_HLEN, &m.orig_ip, sizeof(m.orig_ip) + sizeof(m.orig_l4)) < 0)
        return -1;
    m.icmp.type = ICMP_DEST_UNREACH;
    m.icmp.code = ICMP_FRAG_NEEDED;
    m.icmp.un.frag.mtu = bpf_htons(mtu);
    m.icmp.checksum = mc_csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)&m.icmp, sizeof(m) - sizeof(m.ip), 0));
    mc_ip4_header(&m.ip, IPPROTO_ICMP, sizeof(m), 0, from, m.orig_ip.saddr);
    if (bpf_skb_change_tail(skb, ETH_HLEN + sizeof(m), 0) < 0)
        return -1;
    if (bpf_skb_store_bytes(skb, 0, &eth, sizeof(eth), 0) < 0 ||
        bpf_skb_store_bytes(skb, ETH_HLEN, &m, sizeof(m), 0) < 0)
        return -1;
    return 0;
}

#endif
