// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Encapsulated direct paths: the pod packet wrapped in an outer IPv4 header between the two nodes'
 * private addresses, as VXLAN (UDP, passes every cloud fabric) or IP-in-IP (20 bytes cheaper).
 *
 * Both are built here with bpf_skb_adjust_room, not by a tunnel device: the packet leaves with one
 * redirect to the private NIC like a raw direct packet (no device, route lookup or netfilter pass
 * for the outer header), and the same code serves IPIP on a kernel that has no ipip device. The
 * receiving side decapsulates in from_private whatever sent it: this code or a kernel VXLAN device
 * of a node in kernel-routes mode (the same port, VNI and MAC convention: its fallback,
 * meshctl.node.tunnels). */
#ifndef MC_LIB_ENCAP_H
#define MC_LIB_ENCAP_H

/* The VXLAN header (RFC 7348); the kernel's names for its fields (net/vxlan.h) are not UAPI. */
struct mc_vxlanhdr {
    __be32 flags;  /* MC_VXLAN_FLAG_VNI: the VNI field is valid */
    __be32 vni;    /* MC_VXLAN_VNI_FIELD */
};
#define MC_VXLAN_FLAG_VNI 0x08000000          /* flags: the I bit (host order) */
#define MC_VXLAN_VNI_FIELD (MC_VXLAN_VNI << 8) /* vni: the mesh's 24-bit VNI, then a reserved byte (host order) */

/* What a VXLAN encapsulation puts between the outer Ethernet header and the pod's IP header. */
struct mc_vxlan_outer {
    struct iphdr ip;
    struct udphdr udp;
    struct mc_vxlanhdr vx;
    struct ethhdr eth; /* inner Ethernet: VTEP MACs, so a kernel VXLAN device accepts the frame */
};
/* 50 bytes: the struct's size would count its 2 bytes of tail padding. */
#define MC_VXLAN_OVERHEAD (__builtin_offsetof(struct mc_vxlan_outer, eth) + sizeof(struct ethhdr))
#define MC_IPIP_OVERHEAD sizeof(struct iphdr)

/* The VXLAN UDP source port range (the kernel's default ephemeral range), chosen by flow hash so
 * that fabrics spreading by 5-tuple keep one flow on one path. */
#define MC_VXLAN_SPORT_MIN 32768
#define MC_VXLAN_SPORT_MAX 60999

static __always_inline __u32 mc_encap_overhead(__u8 kind)
{
    return kind == MC_ENCAP_VXLAN ? MC_VXLAN_OVERHEAD : MC_IPIP_OVERHEAD;
}

/* The inner-Ethernet flag of a VXLAN encapsulation, where the kernel takes it (lib/features.h). */
#if MC_HAVE_ADJ_ROOM_L2_ETH
#define MC_ADJ_ROOM_L2_ETH BPF_F_ADJ_ROOM_ENCAP_L2_ETH
#else
#define MC_ADJ_ROOM_L2_ETH 0
#endif

/* A node's VXLAN MAC: MC_VTEP_OUI, then its private IPv4 address. */
static __always_inline void mc_vtep_mac(__u8 *mac, __be32 addr)
{
    mac[0] = (MC_VTEP_OUI >> 8) & 0xff;
    mac[1] = MC_VTEP_OUI & 0xff;
    __builtin_memcpy(mac + 2, &addr, 4);
}

/* Wraps the packet `p` for the encapsulated entry `r` (after the Ethernet header, whose protocol
 * becomes IPv4). GSO packets keep every segment within the MTU: adjust_room lowers gso_size by the
 * overhead and marks the tunnel type, so segmentation (or the peer's TSO) builds the outer headers
 * of each segment. 0, or -1 when a helper failed. `p` is stale afterwards. */
static __always_inline int mc_encap(struct __sk_buff *skb, const struct mc_pkt *p, const struct mc_route_value *r)
{
    __u8 tos = p->family == MC_FAMILY_V4 ? p->ip4->tos : 0;
    __be16 inner = p->eth->h_proto;
    __u32 inner_len = skb->len - ETH_HLEN;
    __be32 src = r->outer_src.v4, dst = r->outer_dst.v4;
    __be16 outer_proto = bpf_htons(ETH_P_IP);

    if (r->encap == MC_ENCAP_VXLAN) {
        struct mc_vxlan_outer h = {};
        __u32 hash = bpf_get_hash_recalc(skb);
        __u16 sport = MC_VXLAN_SPORT_MIN + (((__u64)hash * (MC_VXLAN_SPORT_MAX - MC_VXLAN_SPORT_MIN)) >> 32);
        __u32 tot = inner_len + MC_VXLAN_OVERHEAD;
        mc_ip4_header(&h.ip, IPPROTO_UDP, tot, tos, src, dst);
        h.udp.source = bpf_htons(sport);
        h.udp.dest = bpf_htons(MC_VXLAN_PORT);
        h.udp.len = bpf_htons(tot - sizeof(struct iphdr));
        h.udp.check = 0; /* allowed over IPv4; segments of a GSO packet get their length from GSO */
        h.vx.flags = bpf_htonl(MC_VXLAN_FLAG_VNI);
        h.vx.vni = bpf_htonl(MC_VXLAN_VNI_FIELD);
        mc_vtep_mac(h.eth.h_source, src);
        mc_vtep_mac(h.eth.h_dest, dst);
        h.eth.h_proto = inner;
        __u64 flags = BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 | BPF_F_ADJ_ROOM_ENCAP_L4_UDP | MC_ADJ_ROOM_L2_ETH |
                      BPF_F_ADJ_ROOM_ENCAP_L2(ETH_HLEN);
        if (bpf_skb_adjust_room(skb, MC_VXLAN_OVERHEAD, BPF_ADJ_ROOM_MAC, flags) < 0)
            return -1;
        if (bpf_skb_store_bytes(skb, ETH_HLEN, &h, MC_VXLAN_OVERHEAD, 0) < 0)
            return -1;
    } else {
        struct iphdr h = {};
        /* IPv4 pods: IP-in-IP; IPv6 pods: IPv6 in IPv4 ("sit"). */
        __u8 proto = inner == bpf_htons(ETH_P_IP) ? IPPROTO_IPIP : IPPROTO_IPV6;
        mc_ip4_header(&h, proto, inner_len + MC_IPIP_OVERHEAD, tos, src, dst);
        if (bpf_skb_adjust_room(skb, MC_IPIP_OVERHEAD, BPF_ADJ_ROOM_MAC, BPF_F_ADJ_ROOM_ENCAP_L3_IPV4) < 0)
            return -1;
        if (bpf_skb_store_bytes(skb, ETH_HLEN, &h, MC_IPIP_OVERHEAD, 0) < 0)
            return -1;
    }
    if (bpf_skb_store_bytes(skb, __builtin_offsetof(struct ethhdr, h_proto), &outer_proto, sizeof(outer_proto), 0) < 0)
        return -1;
    return 0;
}

/* What a VXLAN packet carries after its UDP header. Read with bpf_skb_load_bytes (bounds checked
 * by the helper) rather than through packet pointers: lies beyond what mc_parse validated, and
 * needs no second pointer check. */
struct mc_vxlan_inner {
    struct mc_vxlanhdr vx;
    struct ethhdr eth;
};

/* An encapsulated packet addressed to this node is unwrapped in place: 1 (and `p` describes the
 * inner packet), 0 when `p` is not one (untouched), -1 when unwrapping failed (drop). Accepted:
 * IPIP / IPv6-in-IPv4 and VXLAN on our port and VNI, outer destination == MC_CFG_PRIVATE4, not
 * fragmented, no IP options (neither sender builds them). */
static __always_inline int mc_decap(struct __sk_buff *skb, struct mc_pkt *p)
{
    if (p->family != MC_FAMILY_V4)
        return 0;
    struct iphdr *ip = p->ip4;
    __u8 proto = ip->protocol;
    int vxlan = proto == IPPROTO_UDP && p->ports.dport == bpf_htons(MC_VXLAN_PORT);
    if (!vxlan && proto != IPPROTO_IPIP && proto != IPPROTO_IPV6)
        return 0;
    if (ip->ihl != MC_IP_IHL_MIN || (ip->frag_off & bpf_htons(MC_IP_OFFSET | MC_IP_MF)) ||
        ip->daddr != (__be32)mc_config(MC_CFG_PRIVATE4))
        return 0;
    __be16 inner = proto == IPPROTO_IPIP ? bpf_htons(ETH_P_IP) : bpf_htons(ETH_P_IPV6);
    __u32 len = MC_IPIP_OVERHEAD;
    if (vxlan) {
        struct mc_vxlan_inner v;
        if (bpf_skb_load_bytes(skb, p->l4_off + sizeof(struct udphdr), &v, sizeof(v)) < 0)
            return 0;
        if (!(v.vx.flags & bpf_htonl(MC_VXLAN_FLAG_VNI)) || v.vx.vni != bpf_htonl(MC_VXLAN_VNI_FIELD))
            return 0;
        inner = v.eth.h_proto;
        len = MC_VXLAN_OVERHEAD;
    }
    if (inner != bpf_htons(ETH_P_IP) && inner != bpf_htons(ETH_P_IPV6))
        return 0;
#if MC_HAVE_ADJ_ROOM_DECAP_L3
    /* The flag names the IP version left after the pop; only a change of version needs it. */
    __u64 flags = inner == bpf_htons(ETH_P_IPV6) ? MC_ADJ_DECAP_L3_IPV6 : 0;
    if (bpf_skb_adjust_room(skb, -(__s32)len, BPF_ADJ_ROOM_MAC, flags) < 0)
        return -1;
#else
    /* Before 6.3 the pop cannot change the IP version: an IPv6 packet inside IPv4 is turned into
     * an IPv6 skb first (bpf_skb_change_proto pushes the 20 bytes the IPv6 header is longer, right
     * after the Ethernet header, and sets the protocol), then the pop takes those 20 bytes too. */
    if (inner == bpf_htons(ETH_P_IPV6)) {
        if (bpf_skb_change_proto(skb, bpf_htons(ETH_P_IPV6), 0) < 0)
            return -1;
        len += sizeof(struct ipv6hdr) - sizeof(struct iphdr);
    }
    if (bpf_skb_adjust_room(skb, -(__s32)len, BPF_ADJ_ROOM_MAC, 0) < 0)
        return -1;
#endif
    if (bpf_skb_store_bytes(skb, __builtin_offsetof(struct ethhdr, h_proto), &inner, sizeof(inner), 0) < 0)
        return -1;
    return mc_parse(skb, p) < 0 ? -1 : 1;
}

#endif
