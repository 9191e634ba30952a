// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Constants and helper declarations every part of the programs uses: the one place for header
 * field values that the UAPI headers the programs include do not define. No maps here: bcc
 * rewrites map calls only in the main file, so datapath.c declares the maps and the small
 * accessors that these headers call (mc_route_lookup, mc_count, ...). */
#ifndef MC_LIB_COMMON_H
#define MC_LIB_COMMON_H

/* Address families of bpf_redir_neigh.nh_family (linux/socket.h, not UAPI). */
#define MC_AF_INET 2
#define MC_AF_INET6 10

/* IPv4 header fields (net/ip.h, not UAPI). frag_off values are in host order: compare with
 * bpf_htons(...). */
#define MC_IP_DF 0x4000          /* frag_off: don't fragment */
#define MC_IP_MF 0x2000          /* frag_off: more fragments */
#define MC_IP_OFFSET 0x1fff      /* frag_off: fragment offset (8-byte units) */
#define MC_IP_IHL_MIN 5          /* ihl (32-bit words) of a header without options: 20 bytes */
#define MC_IP_HLEN_MAX 60        /* the longest header, options included (ihl 15) */
#define MC_TTL_OUTER 64          /* TTL / hop limit of the outer header we build */
#define MC_FLOW_LABEL_MASK 0xfffff /* IPv6 flow label: 20 bits */

/* Hop limit of the ICMPv6 errors we build (they go one hop, into the pod). */
#define MC_ICMP6_HOP_LIMIT 255

/* bcc 0.26 declares the old 3-argument form; the kernel's helper takes (ifindex, params, plen, flags). */
static long (*mc_redirect_neigh)(__u32 ifindex, struct bpf_redir_neigh *params, int plen, __u64 flags) =
    (void *)BPF_FUNC_redirect_neigh;

/* Decapsulation flags of bpf_skb_adjust_room (kernel >= 6.3): the IP version left after the outer
 * header goes. bcc 0.26's headers predate them; the values are the kernel's uapi. */
#define MC_ADJ_DECAP_L3_IPV4 (1ULL << 7)
#define MC_ADJ_DECAP_L3_IPV6 (1ULL << 8)

/* The ones' complement fold of a 32-bit partial sum (bpf_csum_diff's result) into a checksum. */
static __always_inline __u16 mc_csum_fold(__s64 sum)
{
    __u32 s = (__u32)sum;
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    return (__u16)~s;
}

/* A 20-byte IPv4 header from `src` to `dst` (DF set: the fast path never leaves fragmenting to the
 * underlay), checksum included. */
static __always_inline void mc_ip4_header(struct iphdr *ip, __u8 proto, __u16 tot_len, __u8 tos, __be32 src,
                                          __be32 dst)
{
    ip->version = 4;
    ip->ihl = MC_IP_IHL_MIN;
    ip->tos = tos;
    ip->tot_len = bpf_htons(tot_len);
    ip->id = 0;
    ip->frag_off = bpf_htons(MC_IP_DF);
    ip->ttl = MC_TTL_OUTER;
    ip->protocol = proto;
    ip->check = 0;
    ip->saddr = src;
    ip->daddr = dst;
    ip->check = mc_csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)ip, sizeof(*ip), 0));
}

/* A 40-byte IPv6 header from `src` to `dst` around `payload_len` bytes of `nexthdr`: traffic class
 * `tclass` (the pod packet's, as the IPv4 outer copies its TOS), flow label from the flow hash (so
 * fabrics spreading by flow label keep one flow on one path). */
static __always_inline void mc_ip6_header(struct ipv6hdr *ip6, __u8 nexthdr, __u16 payload_len, __u8 tclass,
                                          __u32 hash, const union mc_addr *src, const union mc_addr *dst)
{
    __u32 label = hash & MC_FLOW_LABEL_MASK;
    ip6->version = 6;
    ip6->priority = tclass >> 4;
    ip6->flow_lbl[0] = ((tclass & 0xf) << 4) | (label >> 16);
    ip6->flow_lbl[1] = (label >> 8) & 0xff;
    ip6->flow_lbl[2] = label & 0xff;
    ip6->payload_len = bpf_htons(payload_len);
    ip6->nexthdr = nexthdr;
    ip6->hop_limit = MC_TTL_OUTER;
    __builtin_memcpy(ip6->saddr.s6_addr, src->bytes, 16);
    __builtin_memcpy(ip6->daddr.s6_addr, dst->bytes, 16);
}

#endif
