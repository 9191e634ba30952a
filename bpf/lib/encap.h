// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Encapsulated direct paths: the pod packet wrapped in an outer IPv4 or IPv6 header between the two
 * nodes' private addresses (the entry's outer_family), as VXLAN (UDP, passes every cloud fabric)
 * or IP-in-IP (20 bytes cheaper over IPv4, 40 over IPv6).
 *
 * Outer IPv4: VXLAN (50 bytes), IPIP (protocol 4) for IPv4 pods and 6in4 (protocol 41) for IPv6
 * pods. Outer IPv6: VXLAN (70 bytes; UDP checksum 0, RFC 6935: receivers must allow it, the kernel
 * fallback's device does with udp6zerocsumrx), IPv4-in-IPv6 (next header 4) for IPv4 pods and
 * IPv6-in-IPv6 (next header 41) for IPv6 pods: what Linux's ip6tnl `mode any` sends and accepts.
 *
 * Both are built here with bpf_skb_adjust_room, not by a tunnel device: the packet leaves with one
 * redirect to the private NIC like a raw direct packet (no device, route lookup or netfilter pass
 * for the outer header), and the same code serves IPIP on a kernel that has no ipip device. The
 * receiving side decapsulates in from_private whatever sent it: this code or a kernel VXLAN / ipip
 * / ip6tnl device of a node in kernel-routes mode (the same port, VNI and MAC convention: its
 * fallback, meshctl.node.tunnels). */
#ifndef MC_LIB_ENCAP_H
#define MC_LIB_ENCAP_H

/* The VXLAN header (RFC 7348); the kernel's names for its fields (net/vxlan.h) are not UAPI. */
struct mc_vxlanhdr {
    __be32 flags;  /* MC_VXLAN_FLAG_VNI: the VNI field is valid */
    __be32 vni;    /* MC_VXLAN_VNI_FIELD */
};
#define MC_VXLAN_FLAG_VNI 0x08000000          /* flags: the I bit (host order) */
#define MC_VXLAN_VNI_FIELD (MC_VXLAN_VNI << 8) /* vni: the mesh's 24-bit VNI, then a reserved byte (host order) */

/* What VXLAN puts after the outer IP header and before the pod's IP header. */
struct mc_vxlan_tail {
    struct udphdr udp;
    struct mc_vxlanhdr vx;
    struct ethhdr eth; /* inner Ethernet: VTEP MACs, so a kernel VXLAN device accepts the frame */
};
/* 30 bytes: the struct's size would count its 2 bytes of tail padding. */
#define MC_VXLAN_TAIL_LEN (__builtin_offsetof(struct mc_vxlan_tail, eth) + sizeof(struct ethhdr))

/* A VXLAN encapsulation as one buffer, per outer family. */
struct mc_vxlan_outer {
    struct iphdr ip;
    struct mc_vxlan_tail t;
};
struct mc_vxlan6_outer {
    struct ipv6hdr ip;
    struct mc_vxlan_tail t;
};
#define MC_VXLAN_OVERHEAD (sizeof(struct iphdr) + MC_VXLAN_TAIL_LEN)    /* 50 */
#define MC_VXLAN6_OVERHEAD (sizeof(struct ipv6hdr) + MC_VXLAN_TAIL_LEN) /* 70 */
#define MC_IPIP_OVERHEAD sizeof(struct iphdr)                           /* 20 */
#define MC_IPIP6_OVERHEAD sizeof(struct ipv6hdr)                        /* 40 */

/* The VXLAN UDP source port range (the kernel's default ephemeral range), chosen by flow hash so
 * that fabrics spreading by 5-tuple keep one flow on one path. */
#define MC_VXLAN_SPORT_MIN 32768
#define MC_VXLAN_SPORT_MAX 60999

/* The bytes an encapsulation of `kind` with an outer header of `outer_family` adds. */
static __always_inline __u32 mc_encap_overhead(__u8 kind, __u8 outer_family)
{
    __u32 ip = outer_family == MC_FAMILY_V6 ? sizeof(struct ipv6hdr) : sizeof(struct iphdr);
    return kind == MC_ENCAP_VXLAN ? ip + MC_VXLAN_TAIL_LEN : ip;
}

/* The inner-Ethernet flag of a VXLAN encapsulation, where the kernel takes it (lib/features.h). */
#if MC_HAVE_ADJ_ROOM_L2_ETH
#define MC_ADJ_ROOM_L2_ETH BPF_F_ADJ_ROOM_ENCAP_L2_ETH
#else
#define MC_ADJ_ROOM_L2_ETH 0
#endif

/* A node's VXLAN MAC: MC_VTEP_OUI, then `id` (mc_vtep_id) as it sits in memory. */
static __always_inline void mc_vtep_mac(__u8 *mac, __be32 id)
{
    mac[0] = (MC_VTEP_OUI >> 8) & 0xff;
    mac[1] = MC_VTEP_OUI & 0xff;
    __builtin_memcpy(mac + 2, &id, 4);
}

/* The four bytes of a node's VXLAN MAC after the OUI, from its private address of `family`: the
 * IPv4 address, or the four words of the IPv6 address XORed (layout.vtep_mac: fd10:1::4 and
 * fd10:2::4 differ, their last four bytes would not). */
static __always_inline __be32 mc_vtep_id(const union mc_addr *a, __u8 family)
{
    if (family == MC_FAMILY_V6)
        return a->words[0] ^ a->words[1] ^ a->words[2] ^ a->words[3];
    return a->words[0];
}

/* The VXLAN header after the outer IP header: `payload` bytes of UDP. */
static __always_inline void mc_vxlan_tail(struct mc_vxlan_tail *t, __u32 hash, __u32 payload, __be16 inner,
                                          const struct mc_route_value *r)
{
    __u16 sport = MC_VXLAN_SPORT_MIN + (((__u64)hash * (MC_VXLAN_SPORT_MAX - MC_VXLAN_SPORT_MIN)) >> 32);
    t->udp.source = bpf_htons(sport);
    t->udp.dest = bpf_htons(MC_VXLAN_PORT);
    t->udp.len = bpf_htons(payload);
    /* 0: no checksum. Allowed over IPv4; over IPv6 allowed for tunnels (RFC 6935/6936) by receivers
     * that accept it (our from_private never checks it; a kernel VXLAN device needs udp6zerocsumrx,
     * which the fallback sets). GSO segments keep it 0 (adjust_room marks UDP_TUNNEL, not _CSUM). */
    t->udp.check = 0;
    t->vx.flags = bpf_htonl(MC_VXLAN_FLAG_VNI);
    t->vx.vni = bpf_htonl(MC_VXLAN_VNI_FIELD);
    mc_vtep_mac(t->eth.h_source, mc_vtep_id(&r->outer_src, r->outer_family));
    mc_vtep_mac(t->eth.h_dest, mc_vtep_id(&r->outer_dst, r->outer_family));
    t->eth.h_proto = inner;
}

/* Wraps the packet `p` for the encapsulated entry `r` (after the Ethernet header, whose protocol
 * becomes the outer family's). GSO packets keep every segment within the MTU: adjust_room lowers
 * gso_size by the overhead and marks the tunnel type (UDP_TUNNEL, IPXIP4 or IPXIP6), so
 * segmentation (or the peer's TSO) builds the outer headers of each segment. 0, or -1 when a
 * helper failed. `p` is stale afterwards. */
static __always_inline int mc_encap(struct __sk_buff *skb, const struct mc_pkt *p, const struct mc_route_value *r)
{
    __u8 tos = mc_tclass(p);
    __be16 inner = p->eth->h_proto;
    __u32 inner_len = skb->len - ETH_HLEN;
    int v6 = r->outer_family == MC_FAMILY_V6;
    __be16 outer_proto = v6 ? bpf_htons(ETH_P_IPV6) : bpf_htons(ETH_P_IP);
    __u64 l3 = v6 ? BPF_F_ADJ_ROOM_ENCAP_L3_IPV6 : BPF_F_ADJ_ROOM_ENCAP_L3_IPV4;
    __u32 hash = bpf_get_hash_recalc(skb);
    int ret;

    if (r->encap == MC_ENCAP_VXLAN) {
        __u64 flags = l3 | BPF_F_ADJ_ROOM_ENCAP_L4_UDP | MC_ADJ_ROOM_L2_ETH | BPF_F_ADJ_ROOM_ENCAP_L2(ETH_HLEN);
        __u32 payload = inner_len + MC_VXLAN_TAIL_LEN;
        if (v6) {
            struct mc_vxlan6_outer h = {};
            mc_ip6_header(&h.ip, IPPROTO_UDP, payload, tos, hash, &r->outer_src, &r->outer_dst);
            mc_vxlan_tail(&h.t, hash, payload, inner, r);
            if (bpf_skb_adjust_room(skb, MC_VXLAN6_OVERHEAD, BPF_ADJ_ROOM_MAC, flags) < 0)
                return -1;
            ret = bpf_skb_store_bytes(skb, ETH_HLEN, &h, MC_VXLAN6_OVERHEAD, 0);
        } else {
            struct mc_vxlan_outer h = {};
            mc_ip4_header(&h.ip, IPPROTO_UDP, payload + sizeof(struct iphdr), tos, r->outer_src.v4, r->outer_dst.v4);
            mc_vxlan_tail(&h.t, hash, payload, inner, r);
            if (bpf_skb_adjust_room(skb, MC_VXLAN_OVERHEAD, BPF_ADJ_ROOM_MAC, flags) < 0)
                return -1;
            ret = bpf_skb_store_bytes(skb, ETH_HLEN, &h, MC_VXLAN_OVERHEAD, 0);
        }
    } else {
        /* IPv4 pods: protocol / next header 4; IPv6 pods: 41 (6in4 over IPv4, ip6ip6 over IPv6). */
        __u8 proto = inner == bpf_htons(ETH_P_IP) ? IPPROTO_IPIP : IPPROTO_IPV6;
        if (v6) {
            struct ipv6hdr h = {};
            mc_ip6_header(&h, proto, inner_len, tos, hash, &r->outer_src, &r->outer_dst);
            if (bpf_skb_adjust_room(skb, MC_IPIP6_OVERHEAD, BPF_ADJ_ROOM_MAC, l3) < 0)
                return -1;
            ret = bpf_skb_store_bytes(skb, ETH_HLEN, &h, MC_IPIP6_OVERHEAD, 0);
        } else {
            struct iphdr h = {};
            mc_ip4_header(&h, proto, inner_len + MC_IPIP_OVERHEAD, tos, r->outer_src.v4, r->outer_dst.v4);
            if (bpf_skb_adjust_room(skb, MC_IPIP_OVERHEAD, BPF_ADJ_ROOM_MAC, l3) < 0)
                return -1;
            ret = bpf_skb_store_bytes(skb, ETH_HLEN, &h, MC_IPIP_OVERHEAD, 0);
        }
    }
    if (ret < 0)
        return -1;
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

/* Whether `a` is this node's private IPv6 address (MC_CFG_PRIVATE6; all zero: none). */
static __always_inline int mc_is_private6(const struct in6_addr *a)
{
    __u64 hi = mc_config(MC_CFG_PRIVATE6), lo = mc_config(MC_CFG_PRIVATE6 + 1);
    __u64 ahi, alo;
    __builtin_memcpy(&ahi, a->s6_addr, 8);
    __builtin_memcpy(&alo, a->s6_addr + 8, 8);
    return (hi | lo) != 0 && ahi == hi && alo == lo;
}

/* An encapsulated packet addressed to this node is unwrapped in place: 1 (and `p` describes the
 * inner packet), 0 when `p` is not one (untouched), -1 when unwrapping failed (drop). Accepted,
 * under either outer family: IP-in-IP (4) / IPv6-in-IP (41) and VXLAN on our port and VNI; outer
 * destination == MC_CFG_PRIVATE4 / MC_CFG_PRIVATE6; IPv4: not fragmented, no options; IPv6: no
 * extension header (neither sender builds them; a fragment's next header is 44). */
static __always_inline int mc_decap(struct __sk_buff *skb, struct mc_pkt *p)
{
    __u8 proto = p->proto;
    int vxlan = proto == IPPROTO_UDP && p->ports.dport == bpf_htons(MC_VXLAN_PORT);
    if (!vxlan && proto != IPPROTO_IPIP && proto != IPPROTO_IPV6)
        return 0;
    __be16 outer;
    __u32 len;
    if (p->family == MC_FAMILY_V4) {
        struct iphdr *ip = p->ip4;
        if (ip->ihl != MC_IP_IHL_MIN || (ip->frag_off & bpf_htons(MC_IP_OFFSET | MC_IP_MF)) ||
            ip->daddr != (__be32)mc_config(MC_CFG_PRIVATE4))
            return 0;
        outer = bpf_htons(ETH_P_IP);
        len = MC_IPIP_OVERHEAD;
    } else {
        if (!mc_is_private6(&p->ip6->daddr))
            return 0;
        outer = bpf_htons(ETH_P_IPV6);
        len = MC_IPIP6_OVERHEAD;
    }
    __be16 inner = proto == IPPROTO_IPIP ? bpf_htons(ETH_P_IP) : bpf_htons(ETH_P_IPV6);
    if (vxlan) {
        struct mc_vxlan_inner v;
        if (bpf_skb_load_bytes(skb, p->l4_off + sizeof(struct udphdr), &v, sizeof(v)) < 0)
            return 0;
        if (!(v.vx.flags & bpf_htonl(MC_VXLAN_FLAG_VNI)) || v.vx.vni != bpf_htonl(MC_VXLAN_VNI_FIELD))
            return 0;
        inner = v.eth.h_proto;
        len += MC_VXLAN_TAIL_LEN;
    }
    if (inner != bpf_htons(ETH_P_IP) && inner != bpf_htons(ETH_P_IPV6))
        return 0;
#if MC_HAVE_ADJ_ROOM_DECAP_L3
    /* The flag names the IP version left after the pop; only a change of version needs it. */
    __u64 flags = inner == outer ? 0 : inner == bpf_htons(ETH_P_IPV6) ? MC_ADJ_DECAP_L3_IPV6 : MC_ADJ_DECAP_L3_IPV4;
    if (bpf_skb_adjust_room(skb, -(__s32)len, BPF_ADJ_ROOM_MAC, flags) < 0)
        return -1;
#else
    /* Before 6.3 the pop cannot change the IP version: the skb is turned into one of the inner
     * version first. bpf_skb_change_proto right after the Ethernet header pushes the 20 bytes the
     * IPv6 header is longer (IPv6 inside IPv4: the pop takes them too) or pops 20 bytes of the
     * outer IPv6 header (IPv4 inside IPv6: the pop takes 20 fewer), and sets the protocol. */
    if (inner != outer) {
        if (bpf_skb_change_proto(skb, inner, 0) < 0)
            return -1;
        if (inner == bpf_htons(ETH_P_IPV6))
            len += sizeof(struct ipv6hdr) - sizeof(struct iphdr);
        else
            len -= sizeof(struct ipv6hdr) - sizeof(struct iphdr);
    }
    if (bpf_skb_adjust_room(skb, -(__s32)len, BPF_ADJ_ROOM_MAC, 0) < 0)
        return -1;
#endif
    if (bpf_skb_store_bytes(skb, __builtin_offsetof(struct ethhdr, h_proto), &inner, sizeof(inner), 0) < 0)
        return -1;
    return mc_parse(skb, p) < 0 ? -1 : 1;
}

#endif
