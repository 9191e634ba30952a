/* meshctl fast path: three tc programs sharing the pinned maps of meshctl_maps.h.
 *
 *   from_pod      tc ingress of each host-side pod veth. LPM lookup of the destination; `direct`
 *                 entries are forwarded straight to the private NIC with bpf_redirect_neigh (TTL
 *                 decremented, packet marked); everything else goes to the kernel untouched.
 *   from_private  tc ingress of the private NIC. A destination that is a local pod goes straight
 *                 into the pod with bpf_redirect_peer; everything else goes to the kernel.
 *   flow_egress   tc egress of the private NIC, the tunnel device and each pod veth. Records the
 *                 reversed tuple of every flow that left through the kernel (it may be NATed there:
 *                 kube-proxy), so its replies are handed back to the kernel instead of bypassing it.
 *
 * The kernel's routes stay the source of truth: any packet these programs do not recognise gets
 * TC_ACT_OK and the same treatment as with no program at all.
 *
 * The loader prepends `#define MC_PIN_DIR "<pin root>/<node>"`.
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/in.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/ipv6.h>
#include <uapi/linux/pkt_cls.h>

#include "meshctl_maps.h"

#define MC_AF_INET 2
#define MC_AF_INET6 10
#define MC_L3 ETH_HLEN
/* Bytes the programs read from the linear part at most: Ethernet, IPv4 header with options, L4 ports. */
#define MC_NEED (ETH_HLEN + 60 + 4)

BPF_TABLE_PINNED("lpm_trie", struct mc_route_key, struct mc_route_value, routes, MC_ROUTES_MAX,
                 MC_PIN_DIR "/routes", BPF_F_NO_PREALLOC);
BPF_TABLE_PINNED("hash", struct mc_pod_key, struct mc_pod_value, pods, MC_PODS_MAX, MC_PIN_DIR "/pods");
BPF_TABLE_PINNED("lru_hash", struct mc_flow4_key, struct mc_flow_value, flows4, MC_FLOWS_MAX,
                 MC_PIN_DIR "/flows4");
BPF_TABLE_PINNED("lru_hash", struct mc_flow6_key, struct mc_flow_value, flows6, MC_FLOWS_MAX,
                 MC_PIN_DIR "/flows6");
BPF_TABLE_PINNED("percpu_array", __u32, struct mc_counter, counters, MC_COUNTERS, MC_PIN_DIR "/counters");
BPF_TABLE_PINNED("array", __u32, __u64, config, MC_CONFIG_SLOTS, MC_PIN_DIR "/config");

/* bcc 0.26 declares the old 3-argument form; the kernel's helper takes (ifindex, params, plen, flags). */
static long (*mc_redirect_neigh)(__u32 ifindex, struct bpf_redir_neigh *params, int plen, __u64 flags) =
    (void *)BPF_FUNC_redirect_neigh;

/* What mc_headers found: nothing is copied out of the packet until a branch needs it. */
struct mc_l3 {
    __u32 family;
    __u32 l4;   /* offset of the L4 header from skb->data */
    __u8 proto;
    __u8 frag;  /* a non-first IPv4 fragment: no ports */
};

static __always_inline void mc_count(__u32 slot, __u32 len)
{
    struct mc_counter *c = counters.lookup(&slot);
    if (c) {
        c->packets += 1;
        c->bytes += len;
    }
}

/* -1: not IPv4/IPv6, truncated or malformed (the kernel deals with it). */
static __always_inline int mc_headers(struct __sk_buff *skb, struct mc_l3 *h)
{
    void *data = (void *)(long)skb->data;
    void *end = (void *)(long)skb->data_end;
    if (data + MC_NEED > end && skb->len > end - data) {
        /* Headers partly outside the linear area (rare on veth): pull what we read. */
        bpf_skb_pull_data(skb, skb->len < MC_NEED ? skb->len : MC_NEED);
        data = (void *)(long)skb->data;
        end = (void *)(long)skb->data_end;
    }
    struct ethhdr *eth = data;
    if ((void *)(eth + 1) > end)
        return -1;
    if (eth->h_proto == bpf_htons(ETH_P_IP)) {
        struct iphdr *ip = (void *)(eth + 1);
        if ((void *)(ip + 1) > end || ip->version != 4 || ip->ihl < 5)
            return -1;
        __u32 hl = ip->ihl * 4;
        if ((void *)ip + hl > end)
            return -1; /* options cut off: malformed, the kernel drops it */
        h->family = MC_FAMILY_V4;
        h->proto = ip->protocol;
        h->l4 = MC_L3 + hl;
        h->frag = (ip->frag_off & bpf_htons(0x1fff)) != 0;
        return 0;
    }
    if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
        struct ipv6hdr *ip6 = (void *)(eth + 1);
        if ((void *)(ip6 + 1) > end || ip6->version != 6)
            return -1;
        h->family = MC_FAMILY_V6;
        h->proto = ip6->nexthdr;
        h->l4 = MC_L3 + sizeof(*ip6);
        h->frag = 0;
        return 0;
    }
    return -1;
}

/* Source and destination ports as they sit in the packet (one u32), 0 when there are none. */
static __always_inline __u32 mc_ports(struct __sk_buff *skb, struct mc_l3 *h)
{
    if (h->frag || (h->proto != IPPROTO_TCP && h->proto != IPPROTO_UDP && h->proto != IPPROTO_SCTP))
        return 0;
    void *data = (void *)(long)skb->data;
    void *end = (void *)(long)skb->data_end;
    void *l4 = data + (h->l4 & 0x7f);
    if (l4 + 4 > end)
        return 0;
    return *(__u32 *)l4;
}

/* Whether the flow LRU holds this packet's tuple (reverse=0) or its reply's (reverse=1); with
 * `record`, a missing tuple is added (a lookup per packet, an update per flow). */
static __always_inline int mc_flow(struct __sk_buff *skb, struct mc_l3 *h, int reverse, int record)
{
    __u32 ports = mc_ports(skb, h);
    if (reverse)
        ports = (ports >> 16) | (ports << 16);
    void *data = (void *)(long)skb->data;
    void *end = (void *)(long)skb->data_end;
    struct mc_flow_value v = {};
    if (h->family == MC_FAMILY_V4) {
        struct iphdr *ip = data + MC_L3;
        if ((void *)(ip + 1) > end)
            return 0;
        struct mc_flow4_key k = {};
        k.saddr = reverse ? ip->daddr : ip->saddr;
        k.daddr = reverse ? ip->saddr : ip->daddr;
        *(__u32 *)&k.sport = ports;
        k.proto = h->proto;
        if (flows4.lookup(&k))
            return 1;
        if (record) {
            v.created_ns = bpf_ktime_get_ns();
            flows4.update(&k, &v);
        }
        return 0;
    }
    struct ipv6hdr *ip6 = data + MC_L3;
    if ((void *)(ip6 + 1) > end)
        return 0;
    struct mc_flow6_key k = {};
    __builtin_memcpy(k.saddr, reverse ? &ip6->daddr : &ip6->saddr, 16);
    __builtin_memcpy(k.daddr, reverse ? &ip6->saddr : &ip6->daddr, 16);
    *(__u32 *)&k.sport = ports;
    k.proto = h->proto;
    if (flows6.lookup(&k))
        return 1;
    if (record) {
        v.created_ns = bpf_ktime_get_ns();
        flows6.update(&k, &v);
    }
    return 0;
}

/* The destination address into `addr` (16 bytes, IPv4 in the first 4). -1 if not readable. */
static __always_inline int mc_daddr(struct __sk_buff *skb, __u32 family, __u8 *addr)
{
    void *data = (void *)(long)skb->data;
    void *end = (void *)(long)skb->data_end;
    if (family == MC_FAMILY_V4) {
        struct iphdr *ip = data + MC_L3;
        if ((void *)(ip + 1) > end)
            return -1;
        *(__u32 *)addr = ip->daddr;
        return 0;
    }
    struct ipv6hdr *ip6 = data + MC_L3;
    if ((void *)(ip6 + 1) > end)
        return -1;
    __builtin_memcpy(addr, &ip6->daddr, 16);
    return 0;
}

/* Decrements the TTL / hop limit as the kernel's forwarding would. -1: TTL <= 1 (the kernel must
 * answer with ICMP time exceeded) or headers not readable. */
static __always_inline int mc_dec_ttl(struct __sk_buff *skb, __u32 family)
{
    void *data = (void *)(long)skb->data;
    void *end = (void *)(long)skb->data_end;
    if (family == MC_FAMILY_V4) {
        struct iphdr *ip = data + MC_L3;
        if ((void *)(ip + 1) > end || ip->ttl <= 1)
            return -1;
        __u32 check = ip->check;
        check += bpf_htons(0x0100);
        ip->check = (__u16)(check + (check >= 0xFFFF));
        ip->ttl--;
        return 0;
    }
    struct ipv6hdr *ip6 = data + MC_L3;
    if ((void *)(ip6 + 1) > end || ip6->hop_limit <= 1)
        return -1;
    ip6->hop_limit--;
    return 0;
}

/* Counts an outcome and returns its tc verdict. */
static __always_inline int mc_out(__u32 slot, __u32 len, int verdict)
{
    mc_count(slot, len);
    return verdict;
}

/* Before forwarding a packet ourselves: the reply of a kernel flow, or a TTL <= 1, goes to the
 * kernel (-1, `slot` says why); else the TTL is decremented (0). */
static __always_inline int mc_may_forward(struct __sk_buff *skb, struct mc_l3 *h, __u32 *slot)
{
    if (mc_flow(skb, h, 0, 0)) {
        *slot = MC_C_FLOW;
        return -1;
    }
    if (mc_dec_ttl(skb, h->family) < 0) {
        *slot = MC_C_PASS;
        return -1;
    }
    return 0;
}

/* The verdict after a redirect helper returned `ret`. */
static __always_inline int mc_redirected(long ret, __u32 slot, __u32 len)
{
    if (ret != TC_ACT_REDIRECT)
        return mc_out(MC_C_ERROR, len, TC_ACT_SHOT);
    return mc_out(slot, len, TC_ACT_REDIRECT);
}

int from_pod(struct __sk_buff *skb)
{
    __u32 len = skb->len;
    struct mc_l3 h = {};
    struct mc_route_key k = {};
    if (mc_headers(skb, &h) < 0 || mc_daddr(skb, h.family, k.addr) < 0)
        return mc_out(MC_C_PASS, len, TC_ACT_OK);
    k.prefixlen = h.family == MC_FAMILY_V4 ? 64 : 160;
    k.family = h.family;
    struct mc_route_value *r = routes.lookup(&k);
    if (!r)
        return mc_out(MC_C_PASS, len, TC_ACT_OK);
    if (r->action == MC_ACT_TUNNEL)
        return mc_out(MC_C_TUNNEL, len, TC_ACT_OK);
    if (r->action != MC_ACT_DIRECT)
        return mc_out(MC_C_LOCAL, len, TC_ACT_OK);
    struct bpf_redir_neigh nh = {};
    int have_nh = r->nh_family != 0;
    if (r->nh_family == MC_FAMILY_V4) {
        nh.nh_family = MC_AF_INET;
        __builtin_memcpy(&nh.ipv4_nh, r->nexthop, 4);
    } else if (r->nh_family == MC_FAMILY_V6) {
        nh.nh_family = MC_AF_INET6;
        __builtin_memcpy(nh.ipv6_nh, r->nexthop, 16);
    }
    __u32 ifindex = r->ifindex;
    /* A reply of a flow that came into the pod through the kernel (NodePort, a NATed client)
     * goes back through the kernel. */
    __u32 why = 0;
    if (mc_may_forward(skb, &h, &why) < 0)
        return mc_out(why, len, TC_ACT_OK);
    skb->mark |= MC_MARK;
    long ret = have_nh ? mc_redirect_neigh(ifindex, &nh, sizeof(nh), 0) : mc_redirect_neigh(ifindex, NULL, 0, 0);
    return mc_redirected(ret, MC_C_DIRECT, len);
}

int from_private(struct __sk_buff *skb)
{
    __u32 len = skb->len;
    struct mc_l3 h = {};
    struct mc_pod_key k = {};
    if (mc_headers(skb, &h) < 0 || mc_daddr(skb, h.family, k.addr) < 0)
        return mc_out(MC_C_PASS, len, TC_ACT_OK);
    k.family = h.family;
    struct mc_pod_value *pod = pods.lookup(&k);
    if (!pod)
        return mc_out(MC_C_PASS, len, TC_ACT_OK);
    __u32 ifindex = pod->ifindex;
    __u32 why = 0;
    if (mc_may_forward(skb, &h, &why) < 0)
        return mc_out(why, len, TC_ACT_OK);
    return mc_redirected(bpf_redirect_peer(ifindex, 0), MC_C_PEER, len);
}

int flow_egress(struct __sk_buff *skb)
{
    if (skb->mark & MC_MARK) {
        /* from_pod redirected it: not a kernel flow. The mark has done its job. */
        skb->mark &= ~MC_MARK;
        return TC_ACT_OK;
    }
    struct mc_l3 h = {};
    if (mc_headers(skb, &h) < 0)
        return TC_ACT_OK;
    if (!mc_flow(skb, &h, 1, 1))
        mc_count(MC_C_TRACKED, skb->len);
    return TC_ACT_OK;
}
