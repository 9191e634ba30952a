// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Global ranges (mesh.global_cidrs, docs/clustermesh.md): clusters whose pod ranges overlap join
 * one to one. Other clusters see a pod of this cluster at its image in the cluster's global range
 * (the same host bits); the translation is stateless and done once at each end:
 *
 *   out (a packet to another cluster's pod: its routes entry has MC_RT_TRANSLATE)
 *       a source in a mapped pod range becomes its image; an ICMP error's quoted packet (which
 *       went the other way) has its destination rewritten the same way.
 *   in  (whatever arrives: from_private, from_tunnel)
 *       a destination in this cluster's global range becomes the local pod again; an ICMP error's
 *       quoted packet has its source rewritten back.
 *
 * Checksums follow each rewrite: the IPv4 header's, the L4 one over the pseudo-header (TCP, UDP,
 * ICMPv6; not ICMPv4, which has none; not a non-first fragment, which carries no L4 header; a first
 * fragment's covers the whole datagram, so the same update is right), the quoted IPv4 header's, and
 * for a quoted IPv6 header the ICMPv6 checksum (ICMPv4's stays right: the quoted header's address and
 * its checksum change by opposite amounts). The quoted packet's own L4 checksum is left as its sender
 * computed it: no stack reads it. IPv6 extension headers other than a fragment header are not walked:
 * such packets get their addresses translated and their L4 checksum left (neither end sends them).
 *
 * The packet's own addresses are rewritten through the parsed pointers, the IPv4 header checksum by
 * RFC 1624 arithmetic and the L4 one with bpf_l4_csum_replace (which keeps CHECKSUM_PARTIAL and
 * CHECKSUM_COMPLETE packets right, as the kernel's NAT does); a quoted packet, beyond what mc_parse
 * validated, with bpf_skb_load/store_bytes and bpf_l3/l4_csum_replace. Helpers invalidate packet
 * pointers, so each function reads what it needs of `p` first and the caller parses again when
 * anything was rewritten. Nothing here needs a helper newer than 4.x. */
#ifndef MC_LIB_XLATE_H
#define MC_LIB_XLATE_H

/* Offsets inside the IP headers (uapi structs, as constants: the helpers take offsets). */
#define MC_IP4_CSUM 10
#define MC_IP4_SADDR 12
#define MC_IP4_DADDR 16
#define MC_IP6_SADDR 8
#define MC_IP6_DADDR 24
#define MC_TCP_CSUM 16
#define MC_UDP_CSUM 6
#define MC_ICMP_CSUM 2
#define MC_ICMP_HLEN 8        /* an ICMP error's header; the quoted packet follows */
#define MC_IP6_FRAG_HLEN 8    /* the IPv6 fragment header */
#define MC_IP6_FRAG_OFFSET 0xfff8 /* its fragment offset bits (host order) */

/* Which address of a header. */
enum mc_xl_side {
    MC_XL_SRC = 0,
    MC_XL_DST = 1,
};

/* The IPv6 fragment header (RFC 8200 4.5; the kernel's struct frag_hdr is not UAPI). */
struct mc_ip6_frag {
    __u8 nexthdr;
    __u8 reserved;
    __be16 frag_off;
    __be32 id;
};

static __always_inline int mc_icmp_is_error(__u32 family, __u8 type)
{
    if (family == MC_FAMILY_V4)
        return type == ICMP_DEST_UNREACH || type == ICMP_TIME_EXCEEDED || type == ICMP_PARAMETERPROB;
    return type == ICMPV6_DEST_UNREACH || type == ICMPV6_PKT_TOOBIG || type == ICMPV6_TIME_EXCEED ||
           type == ICMPV6_PARAMPROB;
}

/* The network mask of word `w` of an address under a prefix of `plen` bits (network order). */
static __always_inline __u32 mc_prefix_mask(__u32 plen, int w)
{
    __s32 bits = (__s32)plen - 32 * w;
    return bits >= 32 ? 0xffffffff : bits <= 0 ? 0 : bpf_htonl(~((1U << (32 - bits)) - 1));
}

/* Whether `a` lies in the range starting at `net` with `plen` bits (IPv4 uses word 0; the others
 * are zero on both sides). */
static __always_inline int mc_in_range(const union mc_addr *a, const union mc_addr *net, __u32 plen)
{
    __u32 diff = 0;
#pragma unroll
    for (int w = 0; w < 4; w++)
        diff |= (a->words[w] ^ net->words[w]) & mc_prefix_mask(plen, w);
    return diff == 0;
}

/* This node's ranges of `family` when `a` lies in the one `kind` translates from (the pod range for
 * MC_XL_OUT, the global range for MC_XL_IN), or NULL. */
static __always_inline const struct mc_xlate_value *mc_xlate_find(__u32 family, const union mc_addr *a, __u32 kind)
{
    const struct mc_xlate_value *v = mc_xlate_lookup(family == MC_FAMILY_V4 ? MC_XLATE_V4 : MC_XLATE_V6);
    if (!v || v->plen == 0)
        return NULL;
    return mc_in_range(a, kind == MC_XL_OUT ? &v->pod : &v->global, v->plen) ? v : NULL;
}

/* `a` becomes its image under `v` the way `kind` goes: its host bits under the first v->plen bits
 * of the other range. */
static __always_inline void mc_xlate_image(const struct mc_xlate_value *v, __u32 kind, union mc_addr *a)
{
    const union mc_addr *to = kind == MC_XL_OUT ? &v->global : &v->pod;
#pragma unroll
    for (int w = 0; w < 4; w++) {
        __u32 mask = mc_prefix_mask(v->plen, w);
        a->words[w] = (a->words[w] & ~mask) | (to->words[w] & mask);
    }
}

/* Where the packet's L4 checksum over the pseudo-header sits (offset from skb->data), with the
 * flags of its update in *flags; 0 when it has none to update (ICMPv4, a non-first fragment, another
 * protocol). Reads p->ip4: call before any helper. */
static __always_inline __u32 mc_l4_csum_off(struct __sk_buff *skb, const struct mc_pkt *p, __u64 *flags)
{
    __u8 proto = p->proto;
    __u32 l4 = p->l4_off;
    if (p->family == MC_FAMILY_V4) {
        if (p->ip4->frag_off & bpf_htons(MC_IP_OFFSET))
            return 0;
    } else if (proto == IPPROTO_FRAGMENT) {
        struct mc_ip6_frag f;
        if (bpf_skb_load_bytes(skb, l4, &f, sizeof(f)) < 0 || (f.frag_off & bpf_htons(MC_IP6_FRAG_OFFSET)))
            return 0;
        proto = f.nexthdr;
        l4 += MC_IP6_FRAG_HLEN;
    }
    *flags = BPF_F_PSEUDO_HDR;
    if (proto == IPPROTO_TCP)
        return l4 + MC_TCP_CSUM;
    if (proto == IPPROTO_UDP) {
        *flags |= BPF_F_MARK_MANGLED_0; /* a UDP checksum of 0 (none, over IPv4) stays 0 */
        return l4 + MC_UDP_CSUM;
    }
    if (proto == IPPROTO_ICMPV6)
        return l4 + MC_ICMP_CSUM;
    return 0;
}

/* RFC 1624 incremental update of a ones' complement checksum for one 32-bit field that changes from
 * `from` to `to` (as two 16-bit words, in the order they sit in the packet: the sum does not depend
 * on the byte order, so the raw values serve). */
static __always_inline __u16 mc_csum_replace4(__u16 check, __be32 from, __be32 to)
{
    __u32 s = (__u16)~check;
    s += (~from & 0xffff) + (~from >> 16) + (to & 0xffff) + (to >> 16);
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    return (__u16)~s;
}

/* Writes address `to` (in place of `from`) as the packet's source or destination and fixes the
 * checksums that cover it (`csum`: mc_l4_csum_off's answer, `flags` its flags). The address and the
 * IPv4 header's checksum are written through `p`'s pointers (RFC 1624, as mc_dec_ttl does: a helper
 * call each would cost more than the rest of the translation); the L4 checksum with
 * bpf_l4_csum_replace, which knows whether the packet's checksum is partial or complete, last (it
 * invalidates the pointers). 0, or -1 when the helper failed. */
static __always_inline int mc_xlate_write(struct __sk_buff *skb, const struct mc_pkt *p, enum mc_xl_side side,
                                          const union mc_addr *from, const union mc_addr *to, __u32 csum, __u64 flags)
{
    if (p->family == MC_FAMILY_V4) {
        struct iphdr *ip = p->ip4;
        if (side == MC_XL_SRC)
            ip->saddr = to->v4;
        else
            ip->daddr = to->v4;
        ip->check = mc_csum_replace4(ip->check, from->v4, to->v4);
        if (csum && bpf_l4_csum_replace(skb, csum, from->v4, to->v4, flags | sizeof(to->v4)) < 0)
            return -1;
        return 0;
    }
    struct in6_addr *a = side == MC_XL_SRC ? &p->ip6->saddr : &p->ip6->daddr;
    __builtin_memcpy(a->s6_addr, to->bytes, sizeof(to->bytes));
    if (csum) {
        /* Verifier: bpf_csum_diff reads both addresses from the stack (multiples of 4 bytes). */
        __s64 diff = bpf_csum_diff((__be32 *)from->words, sizeof(from->words), (__be32 *)to->words,
                                   sizeof(to->words), 0);
        if (bpf_l4_csum_replace(skb, csum, 0, diff, flags) < 0)
            return -1;
    }
    return 0;
}

/* The packet an ICMP error quotes (after its 8-byte header at `l4`): its `side` address, when it
 * lies in an xlate range of `kind`, is rewritten to its image, with the quoted IPv4 header's
 * checksum or the ICMPv6 checksum. 1 rewritten, 0 not an error or nothing to rewrite, -1 a helper failed. */
static __always_inline int mc_xlate_quoted(struct __sk_buff *skb, __u32 family, __u32 l4, enum mc_xl_side side,
                                           __u32 kind, union mc_addr *seen)
{
    __u8 type;
    if (bpf_skb_load_bytes(skb, l4, &type, sizeof(type)) < 0 || !mc_icmp_is_error(family, type))
        return 0;
    __u32 inner = l4 + MC_ICMP_HLEN;
    union mc_addr from = {};
    union mc_addr to;
    const struct mc_xlate_value *v;
    if (family == MC_FAMILY_V4) {
        __u32 off = inner + (side == MC_XL_SRC ? MC_IP4_SADDR : MC_IP4_DADDR);
        if (bpf_skb_load_bytes(skb, off, &from.v4, sizeof(from.v4)) < 0)
            return 0; /* quotes less than a header: nothing to translate */
        v = mc_xlate_find(family, &from, kind);
        if (!v)
            return 0;
        to = from;
        mc_xlate_image(v, kind, &to);
        if (bpf_skb_store_bytes(skb, off, &to.v4, sizeof(to.v4), 0) < 0 ||
            bpf_l3_csum_replace(skb, inner + MC_IP4_CSUM, from.v4, to.v4, sizeof(to.v4)) < 0)
            return -1;
        *seen = to;
        return 1;
    }
    __u32 off = inner + (side == MC_XL_SRC ? MC_IP6_SADDR : MC_IP6_DADDR);
    if (bpf_skb_load_bytes(skb, off, from.bytes, sizeof(from.bytes)) < 0)
        return 0;
    v = mc_xlate_find(family, &from, kind);
    if (!v)
        return 0;
    to = from;
    mc_xlate_image(v, kind, &to);
    __s64 diff = bpf_csum_diff((__be32 *)from.words, sizeof(from.words), (__be32 *)to.words, sizeof(to.words), 0);
    if (bpf_skb_store_bytes(skb, off, to.bytes, sizeof(to.bytes), 0) < 0 ||
        bpf_l4_csum_replace(skb, l4 + MC_ICMP_CSUM, 0, diff, 0) < 0)
        return -1;
    *seen = to;
    return 1;
}

/* Whether the packet is ICMP (of its family) and not a non-first fragment: it may be an error
 * quoting a packet. Reads p->ip4: call before any helper. */
static __always_inline int mc_maybe_icmp_error(const struct mc_pkt *p)
{
    if (p->family == MC_FAMILY_V4)
        return p->proto == IPPROTO_ICMP && !(p->ip4->frag_off & bpf_htons(MC_IP_OFFSET));
    return p->proto == IPPROTO_ICMPV6;
}

/* Translates the packet one way: the `side` address of the packet when it lies in an xlate range of
 * `kind`, and the other address of the packet an ICMP error quotes. MC_XLATED_* bits of what was
 * rewritten (the monitor's note gets the new addresses), or -1 when a helper failed (drop: the
 * packet may be half rewritten). When anything was rewritten `p` is parsed again with `l2` bytes
 * of link-layer header (a constant in each program, as mc_parse_from wants); -1 if that fails. */
static __always_inline int mc_xlate(struct __sk_buff *skb, struct mc_pkt *p, enum mc_xl_side side, __u32 kind,
                                    struct mc_note *n, __u32 l2)
{
    union mc_addr from = {};
    if (side == MC_XL_SRC)
        mc_saddr(p, &from);
    else
        mc_daddr(p, &from);
    __u32 family = p->family, l4 = p->l4_off;
    int icmp = mc_maybe_icmp_error(p);
    int done = 0;
    const struct mc_xlate_value *v = mc_xlate_find(family, &from, kind);
    if (v) {
        union mc_addr to = from;
        mc_xlate_image(v, kind, &to);
        __u64 flags = 0;
        __u32 csum = mc_l4_csum_off(skb, p, &flags);
        if (mc_xlate_write(skb, p, side, &from, &to, csum, flags) < 0)
            return -1;
        mc_note_xlated(n, side == MC_XL_SRC ? MC_XLATED_SRC : MC_XLATED_DST, &to);
        done |= side == MC_XL_SRC ? MC_XLATED_SRC : MC_XLATED_DST;
    }
    if (icmp) {
        union mc_addr quoted = {};
        int q = mc_xlate_quoted(skb, family, l4, side == MC_XL_SRC ? MC_XL_DST : MC_XL_SRC, kind, &quoted);
        if (q < 0)
            return -1;
        if (q) {
            mc_note_xlated(n, MC_XLATED_INNER, &quoted);
            done |= MC_XLATED_INNER;
        }
    }
    if (done) {
        mc_count(MC_C_TRANSLATED, n->len);
        if (mc_parse_from(skb, p, l2) < 0)
            return -1;
    }
    return done;
}

/* Whether this node has global ranges to translate (config[MC_CFG_XLATE]): without, the programs
 * never look xlate up. */
static __always_inline int mc_xlate_on(void)
{
    return mc_config(MC_CFG_XLATE) != 0;
}

/* Leaving the cluster: the source of a packet to another cluster's pod (`r` flagged MC_RT_TRANSLATE). */
static __always_inline int mc_xlate_out(struct __sk_buff *skb, struct mc_pkt *p, struct mc_note *n, __u32 l2)
{
    return mc_xlate(skb, p, MC_XL_SRC, MC_XL_OUT, n, l2);
}

/* Arriving from another cluster: a destination in this cluster's global range. */
static __always_inline int mc_xlate_in(struct __sk_buff *skb, struct mc_pkt *p, struct mc_note *n, __u32 l2)
{
    return mc_xlate(skb, p, MC_XL_DST, MC_XL_IN, n, l2);
}

#endif
