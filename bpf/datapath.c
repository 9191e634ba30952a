// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* meshctl fast path: five tc programs sharing the pinned maps of meshctl_maps.h.
 *
 *   from_pod      tc ingress of each host-side pod veth. LPM lookup of the destination; `direct`
 *                 entries are forwarded straight to the private NIC with bpf_redirect_neigh (TTL
 *                 decremented, packet marked), raw or encapsulated (VXLAN / IPIP, lib/encap.h);
 *                 everything else goes to the kernel untouched.
 *   from_private  tc ingress of the private NIC. Encapsulated packets for this node are unwrapped;
 *                 a destination that is a local pod goes straight into the pod with
 *                 bpf_redirect_peer; everything else goes to the kernel.
 *   flow_egress   tc egress of the private NIC and each pod veth. Records the reversed tuple of
 *                 every flow that left through the kernel (it may be NATed there: kube-proxy), so
 *                 its replies are handed back to the kernel instead of bypassing it.
 *   from_tunnel,  tc ingress and egress of the tunnel device (kilo0, no link-layer header): only
 *   tunnel_egress the translation of global ranges (lib/xlate.h), which also runs in the three
 *                 above; with no global ranges they return at once.
 *
 * The kernel's routes stay the source of truth: any packet these programs do not recognise gets
 * TC_ACT_OK and the same treatment as with no program at all.
 *
 * Layout: meshctl_maps.h holds the map layouts; this file declares the maps and holds their
 * accessors and the programs; lib/ holds the parts (features: what the kernel offers, common:
 * header constants and shared helpers, pkt: parsing, flow: tracking, encap, icmp, xlate: global
 * ranges, monitor: the events of `meshctl monitor`, behind one gate lookup per packet). Load-time
 * settings arrive as cflags (see meshctl_maps.h and lib/features.h).
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/icmp.h>
#include <uapi/linux/icmpv6.h>
#include <uapi/linux/in.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/ipv6.h>
#include <uapi/linux/pkt_cls.h>
#include <uapi/linux/udp.h>

#include "meshctl_maps.h"
#include "lib/features.h"
#include "lib/common.h"

BPF_TABLE_PINNED("lpm_trie", struct mc_route_key, struct mc_route_value, routes, MC_ROUTES_MAX,
                 MC_PIN_DIR "/routes", BPF_F_NO_PREALLOC);
BPF_TABLE_PINNED("hash", struct mc_pod_key, struct mc_pod_value, pods, MC_PODS_MAX, MC_PIN_DIR "/pods");
BPF_TABLE_PINNED("lru_hash", struct mc_flow4_key, struct mc_flow_value, flows4, MC_FLOWS_MAX,
                 MC_PIN_DIR "/flows4");
BPF_TABLE_PINNED("lru_hash", struct mc_flow6_key, struct mc_flow_value, flows6, MC_FLOWS_MAX,
                 MC_PIN_DIR "/flows6");
BPF_TABLE_PINNED("array", __u32, struct mc_flowfilter, flowfilter, 1, MC_PIN_DIR "/flowfilter", BPF_F_MMAPABLE);
BPF_TABLE_PINNED("percpu_array", __u32, struct mc_route_cache_slot, route_cache, MC_ROUTE_CACHE_SLOTS,
                 MC_PIN_DIR "/route_cache");
BPF_TABLE_PINNED("percpu_array", __u32, struct mc_counter, counters, MC_COUNTERS, MC_PIN_DIR "/counters");
BPF_TABLE_PINNED("array", __u32, struct mc_xlate_value, xlate, MC_XLATE_SLOTS, MC_PIN_DIR "/xlate");
BPF_TABLE_PINNED("array", __u32, __u64, config, MC_CONFIG_SLOTS, MC_PIN_DIR "/config");
BPF_TABLE_PINNED("array", __u32, struct mc_mon_slot, mon_slots, MC_MON_SLOTS, MC_PIN_DIR "/mon_slots");
BPF_TABLE_PINNED("percpu_array", __u32, __u64, mon_lost, MC_MON_SLOTS * MC_MON_LOST_KINDS, MC_PIN_DIR "/mon_lost");

/* A pinned ring buffer: bcc 0.26's BPF_RINGBUF_OUTPUT with a pin path (bcc reads the section's
 * "type:path" as BPF_TABLE_PINNED does). */
#define MC_RINGBUF_PINNED(_name, _bytes, _pinned)                                                                     \
    struct _name##_table_t {                                                                                         \
        int key;                                                                                                     \
        u32 leaf;                                                                                                    \
        int (*ringbuf_output)(void *, u64, u64);                                                                     \
        void *(*ringbuf_reserve)(u64);                                                                               \
        void (*ringbuf_discard)(void *, u64);                                                                        \
        void (*ringbuf_submit)(void *, u64);                                                                         \
        u32 max_entries;                                                                                             \
    };                                                                                                               \
    __attribute__((section("maps/ringbuf:" _pinned))) struct _name##_table_t _name = {.max_entries = (_bytes)}
MC_RINGBUF_PINNED(mon_ring0, MC_MON_RING_BYTES, MC_PIN_DIR "/mon_ring0");
MC_RINGBUF_PINNED(mon_ring1, MC_MON_RING_BYTES, MC_PIN_DIR "/mon_ring1");
MC_RINGBUF_PINNED(mon_ring2, MC_MON_RING_BYTES, MC_PIN_DIR "/mon_ring2");
MC_RINGBUF_PINNED(mon_ring3, MC_MON_RING_BYTES, MC_PIN_DIR "/mon_ring3");
#if MC_MON_SLOTS != 4
#error "one mon_ring<i> per monitor slot: declare them above and in mc_mon_output"
#endif

/* Map accessors. bcc rewrites `map.lookup()` calls only in the main file, so lib/ reaches the
 * maps through these. */
static __always_inline struct mc_route_value *mc_route_lookup(struct mc_route_key *k)
{
    return routes.lookup(k);
}

static __always_inline struct mc_route_cache_slot *mc_route_cache_slot(__u32 i)
{
    return route_cache.lookup(&i);
}

static __always_inline struct mc_xlate_value *mc_xlate_lookup(__u32 slot)
{
    return xlate.lookup(&slot);
}

static __always_inline struct mc_pod_value *mc_pod_lookup(struct mc_pod_key *k)
{
    return pods.lookup(k);
}

static __always_inline struct mc_flow_value *mc_flow4_lookup(struct mc_flow4_key *k)
{
    return flows4.lookup(k);
}

static __always_inline void mc_flow4_update(struct mc_flow4_key *k, struct mc_flow_value *v)
{
    flows4.update(k, v);
}

static __always_inline struct mc_flow_value *mc_flow6_lookup(struct mc_flow6_key *k)
{
    return flows6.lookup(k);
}

static __always_inline void mc_flow6_update(struct mc_flow6_key *k, struct mc_flow_value *v)
{
    flows6.update(k, v);
}

static __always_inline struct mc_flowfilter *mc_flowfilter(void)
{
    __u32 zero = 0;
    return flowfilter.lookup(&zero);
}

static __always_inline void mc_count(__u32 slot, __u32 len)
{
    struct mc_counter *c = counters.lookup(&slot);
    if (c) {
        c->packets += 1;
        c->bytes += len;
    }
}

/* A config slot; 0 when unset. */
static __always_inline __u64 mc_config(__u32 slot)
{
    __u64 *v = config.lookup(&slot);
    return v ? *v : 0;
}

static __always_inline struct mc_mon_slot *mc_mon_slot(__u32 slot)
{
    return mon_slots.lookup(&slot);
}

static __always_inline void mc_mon_count_lost(__u32 slot, __u32 kind)
{
    __u32 k = slot * MC_MON_LOST_KINDS + kind;
    __u64 *c = mon_lost.lookup(&k);
    if (c)
        *c += 1;
}

/* Copies the event into slot `slot`'s ring; <0 when it is full. */
static __always_inline long mc_mon_output(__u32 slot, struct mc_event *ev)
{
    switch (slot) {
    case 0:
        return mon_ring0.ringbuf_output(ev, sizeof(*ev), 0);
    case 1:
        return mon_ring1.ringbuf_output(ev, sizeof(*ev), 0);
    case 2:
        return mon_ring2.ringbuf_output(ev, sizeof(*ev), 0);
    default:
        return mon_ring3.ringbuf_output(ev, sizeof(*ev), 0);
    }
}

#include "lib/pkt.h"
#include "lib/monitor.h"
#include "lib/flow.h"
#include "lib/encap.h"
#include "lib/icmp.h"
#include "lib/xlate.h"

/* Counts an outcome, notes it (and why) for the monitor, and returns its tc verdict. */
static __always_inline int mc_out(struct mc_note *n, __u32 slot, __u32 reason, int verdict)
{
    mc_count(slot, n->len);
    mc_note_end(n, slot, reason);
    return verdict;
}

/* The verdict after a redirect helper returned `ret`. */
static __always_inline int mc_redirected(struct mc_note *n, long ret, __u32 slot)
{
    if (ret != TC_ACT_REDIRECT)
        return mc_out(n, MC_C_ERROR, MC_R_REDIRECT, TC_ACT_SHOT);
    return mc_out(n, slot, MC_R_NONE, TC_ACT_REDIRECT);
}

/* Redirects to the private NIC through the entry's next hop, or (none) the kernel's route to the
 * packet's destination (the outer one, once encapsulated). */
static __always_inline long mc_redirect_private(const struct mc_route_value *r)
{
    struct bpf_redir_neigh nh = {};
    if (r->nh_family == MC_FAMILY_V4) {
        nh.nh_family = MC_AF_INET;
        nh.ipv4_nh = r->nexthop.v4;
    } else if (r->nh_family == MC_FAMILY_V6) {
        nh.nh_family = MC_AF_INET6;
        __builtin_memcpy(nh.ipv6_nh, r->nexthop.words, sizeof(nh.ipv6_nh));
    } else {
        return mc_redirect_neigh(r->ifindex, NULL, 0, 0);
    }
    return mc_redirect_neigh(r->ifindex, &nh, sizeof(nh), 0);
}

/* The source of an ICMP error this node sends a local IPv4 pod: its private IPv4 address, or on an
 * IPv6-only underlay (none) the address the pod's packet was for. */
static __always_inline __be32 mc_icmp4_source(const struct mc_pkt *p)
{
    __be32 own = (__be32)mc_config(MC_CFG_PRIVATE4);
    return own ? own : p->ip4->daddr;
}

/* A packet that does not fit the private NIC once encapsulated (GSO packets always fit: their
 * segments shrink). IPv4 with DF and IPv6 (never fragmented on the way): answered with ICMP
 * "fragmentation needed" / ICMPv6 "packet too big" into the pod. IPv4 without DF: the kernel's
 * routes decide (they fragment). */
static __always_inline int mc_too_big(struct __sk_buff *skb, const struct mc_pkt *p, __u32 mtu, struct mc_note *n)
{
    int ret;
    mc_note_mtu(n, mtu);
    if (p->family == MC_FAMILY_V6)
        ret = mc_icmp6_too_big(skb, p, mtu);
    else if (p->ip4->frag_off & bpf_htons(MC_IP_DF))
        ret = mc_icmp4_too_big(skb, p, mtu, mc_icmp4_source(p));
    else
        return mc_out(n, MC_C_PASS, MC_R_FRAGMENT, TC_ACT_OK);
    if (ret < 0)
        return mc_out(n, MC_C_ERROR, MC_R_HELPER, TC_ACT_SHOT);
    skb->mark |= MC_MARK; /* not a kernel flow: the pod veth's egress tracker skips it */
    mc_note_out(n, skb->ifindex);
    long redir = bpf_redirect(skb->ifindex, 0);
    if (redir != TC_ACT_REDIRECT)
        return mc_out(n, MC_C_ERROR, MC_R_REDIRECT, TC_ACT_SHOT);
    return mc_out(n, MC_C_TOO_BIG, MC_R_TOO_BIG, TC_ACT_REDIRECT);
}

/* Whether the packet, `overhead` bytes longer, fits the private NIC: 0 yes, 1 no (its MTU in *mtu),
 * <0 error. With bpf_check_mtu (5.12+) the kernel answers for the route's device, GSO included.
 * Without it the agent's copy of the NIC's MTU (MC_CFG_PRIVATE_MTU) is compared with the L3 length;
 * a GSO packet always fits there, since adjust_room lowers gso_size by the overhead (encap.h). */
static __always_inline long mc_fits(struct __sk_buff *skb, const struct mc_route_value *r, __u32 overhead,
                                    __u32 *mtu)
{
#if MC_HAVE_CHECK_MTU
    long ret = bpf_check_mtu(skb, r->ifindex, mtu, overhead, 0);
    if (ret < 0)
        return ret;
    return ret != BPF_MTU_CHK_RET_SUCCESS;
#else
    *mtu = (__u32)mc_config(MC_CFG_PRIVATE_MTU);
    if (*mtu == 0 || skb->gso_segs > 1)
        return 0;
    return skb->len - ETH_HLEN + overhead > *mtu;
#endif
}

/* A direct packet to another cluster's pod (`r` flagged MC_RT_TRANSLATE) leaves with its source's
 * global image (lib/xlate.h); `p` describes the packet as it leaves. 0, or -1: drop. */
static __always_inline int mc_translate_direct(struct __sk_buff *skb, struct mc_pkt *p, const struct mc_route_value *r,
                                               struct mc_note *n)
{
    if (!(r->flags & MC_RT_TRANSLATE))
        return 0;
    return mc_xlate_out(skb, p, n, ETH_HLEN) < 0 ? -1 : 0;
}

static __always_inline int mc_forward_encap(struct __sk_buff *skb, struct mc_pkt *p, const struct mc_route_value *r,
                                            struct mc_note *n)
{
    __u32 overhead = mc_encap_overhead(r->encap, r->outer_family);
    __u32 mtu = 0;
    long fits = mc_fits(skb, r, overhead, &mtu);
    if (fits < 0)
        return mc_out(n, MC_C_ERROR, MC_R_HELPER, TC_ACT_SHOT);
    if (fits)
        return mc_too_big(skb, p, mtu - overhead, n); /* the pod's own packet quoted: before translation */
    if (mc_translate_direct(skb, p, r, n) < 0)
        return mc_out(n, MC_C_ERROR, MC_R_HELPER, TC_ACT_SHOT);
    if (mc_dec_ttl(p) < 0)
        return mc_out(n, MC_C_PASS, MC_R_TTL, TC_ACT_OK);
    if (mc_encap(skb, p, r) < 0)
        return mc_out(n, MC_C_ERROR, MC_R_HELPER, TC_ACT_SHOT);
    skb->mark |= MC_MARK;
    return mc_redirected(n, mc_redirect_private(r), MC_C_ENCAP);
}

/* The routes generation (meshctl_maps.h, route_cache), read once per packet before its trie lookup. */
static __always_inline __u32 mc_routes_gen(void)
{
    const struct mc_flowfilter *f = mc_flowfilter();
    return f ? *(volatile const __u32 *)&f->routes_gen : 0;
}

static __always_inline int mc_addr_eq(const union mc_addr *a, const union mc_addr *b)
{
    return ((a->words[0] ^ b->words[0]) | (a->words[1] ^ b->words[1]) | (a->words[2] ^ b->words[2]) |
            (a->words[3] ^ b->words[3])) == 0;
}

/* The routes entry for key `k` (a full-length prefix: one destination): the CPU's route_cache slot
 * when it holds that destination under generation `gen`, else the trie's, copied into the slot. */
static __always_inline const struct mc_route_value *mc_route(struct mc_route_key *k, __u32 gen)
{
    const union mc_addr *a = &k->addr;
    __u32 i = ((a->words[0] ^ a->words[1] ^ a->words[2] ^ a->words[3]) * MC_ROUTE_CACHE_MULT) >>
              (32 - MC_ROUTE_CACHE_BITS);
    struct mc_route_cache_slot *s = mc_route_cache_slot(i);
    if (s && s->gen == gen && s->family == k->family && mc_addr_eq(&s->addr, a))
        return &s->value;
    const struct mc_route_value *r = mc_route_lookup(k);
    if (r && s && gen) {
        __builtin_memcpy(&s->value, r, sizeof(*r));
        s->addr = *a;
        s->family = k->family;
        s->gen = gen;
        s->fills += 1;
    }
    return r;
}

/* The routes entry of the packet's destination (mc_route). */
static __always_inline const struct mc_route_value *mc_route_to(const struct mc_pkt *p, __u32 gen)
{
    struct mc_route_key k = {};
    k.family = p->family;
    k.prefixlen = 32 + (p->family == MC_FAMILY_V4 ? 32 : 128);
    mc_daddr(p, &k.addr);
    return mc_route(&k, gen);
}

static __always_inline int mc_from_pod(struct __sk_buff *skb, struct mc_note *n)
{
    __u32 gen = mc_routes_gen();
    struct mc_pkt p = {};
    if (mc_parse(skb, &p) < 0)
        return mc_out(n, MC_C_PASS, MC_R_NOT_IP, TC_ACT_OK);
    mc_note_pkt(n, &p);
    const struct mc_route_value *r = mc_route_to(&p, gen);
    if (!r)
        return mc_out(n, MC_C_PASS, MC_R_NO_ENTRY, TC_ACT_OK);
    mc_note_route(n, r);
    if (r->action == MC_ACT_TUNNEL)
        return mc_out(n, MC_C_TUNNEL, MC_R_TUNNEL, TC_ACT_OK);
    if (r->action != MC_ACT_DIRECT)
        return mc_out(n, MC_C_LOCAL, MC_R_LOCAL, TC_ACT_OK);
    /* A reply of a flow that came into the pod through the kernel (NodePort, a NATed client)
     * goes back through the kernel. */
    if (mc_flow_is_kernel_reply(&p))
        return mc_out(n, MC_C_FLOW, MC_R_KERNEL_FLOW, TC_ACT_OK);
    if (r->encap != MC_ENCAP_NONE)
        return mc_forward_encap(skb, &p, r, n);
    /* An IPv4 packet may leave through an IPv6 next hop (RFC 5549: bpf_redirect_neigh resolves it),
     * never the other way round: the helper would read the IPv4 address as an IPv6 one. */
    if (p.family == MC_FAMILY_V6 && r->nh_family == MC_FAMILY_V4)
        return mc_out(n, MC_C_PASS, MC_R_NEXTHOP, TC_ACT_OK);
    if (mc_translate_direct(skb, &p, r, n) < 0)
        return mc_out(n, MC_C_ERROR, MC_R_HELPER, TC_ACT_SHOT);
    if (mc_dec_ttl(&p) < 0)
        return mc_out(n, MC_C_PASS, MC_R_TTL, TC_ACT_OK);
    skb->mark |= MC_MARK;
    return mc_redirected(n, mc_redirect_private(r), MC_C_DIRECT);
}

static __always_inline int mc_from_private(struct __sk_buff *skb, struct mc_note *n)
{
    struct mc_pkt p = {};
    if (mc_parse(skb, &p) < 0)
        return mc_out(n, MC_C_PASS, MC_R_NOT_IP, TC_ACT_OK);
    mc_note_pkt(n, &p);
    int decap = mc_decap(skb, &p);
    if (decap < 0)
        return mc_out(n, MC_C_ERROR, MC_R_HELPER, TC_ACT_SHOT);
    if (decap > 0) {
        mc_count(MC_C_DECAP, n->len);
        mc_note_decap(n, &p);
    }
    /* From another cluster to this one's global range: the local pod again, before anything asks
     * where it goes (the flow LRUs hold the kernel's, local, view of a tuple). */
    if (mc_xlate_on() && mc_xlate_in(skb, &p, n, ETH_HLEN) < 0)
        return mc_out(n, MC_C_ERROR, MC_R_HELPER, TC_ACT_SHOT);
    struct mc_pod_key k = {};
    k.family = p.family;
    mc_daddr(&p, &k.addr);
    struct mc_pod_value *pod = mc_pod_lookup(&k);
    if (!pod)
        return mc_out(n, MC_C_PASS, MC_R_NO_ENTRY, TC_ACT_OK);
    __u32 ifindex = pod->ifindex;
    if (mc_flow_is_kernel_reply(&p))
        return mc_out(n, MC_C_FLOW, MC_R_KERNEL_FLOW, TC_ACT_OK);
    if (mc_dec_ttl(&p) < 0)
        return mc_out(n, MC_C_PASS, MC_R_TTL, TC_ACT_OK);
    mc_note_out(n, ifindex);
    return mc_redirected(n, bpf_redirect_peer(ifindex, 0), MC_C_PEER);
}

/* Leaving the cluster through the kernel for another cluster's pod (its routes entry flagged
 * MC_RT_TRANSLATE): the source's global image, as from_pod gives direct packets (a Service's DNAT to
 * a remote endpoint, a node's own ICMP error about a packet from there). Only where the packet
 * leaves the cluster: the plan flags the entries that leave at this node (a location member's
 * entries through its own leader are not: the leader sends the packet on and translates it, so no
 * node of the cluster meets a source of its own global range, which it has no route for and
 * rp_filter would drop), and on the private NIC only a direct entry's packet leaves (`l2` 0: the
 * tunnel device's egress, any entry). 0, or -1: drop. */
static __always_inline int mc_translate_leaving(struct __sk_buff *skb, struct mc_pkt *p, struct mc_note *n, __u32 l2)
{
    if (!mc_xlate_on())
        return 0;
    const struct mc_route_value *r = mc_route_to(p, mc_routes_gen());
    if (!r || !(r->flags & MC_RT_TRANSLATE) || (l2 && r->action != MC_ACT_DIRECT))
        return 0;
    return mc_xlate_out(skb, p, n, l2) < 0 ? -1 : 0;
}

/* Egress events carry MC_C_TRACKED, the program's one counter, whether or not the flow was new;
 * packets from_pod redirected (marked) were reported at their ingress and make none. The flow is
 * tracked as the kernel saw it, before any translation (its reply is translated back first). */
int flow_egress(struct __sk_buff *skb)
{
    if (skb->mark & MC_MARK) {
        /* from_pod redirected it: not a kernel flow. The mark has done its job. */
        skb->mark &= ~MC_MARK;
        return TC_ACT_OK;
    }
    struct mc_note n;
    mc_note_init(&n, skb, MC_HOOK_FLOW_EGRESS);
    struct mc_pkt p = {};
    int verdict = TC_ACT_OK;
    if (mc_parse(skb, &p) < 0) {
        mc_note_end(&n, MC_C_TRACKED, MC_R_NOT_IP);
    } else {
        mc_note_pkt(&n, &p);
        mc_note_end(&n, MC_C_TRACKED, MC_R_EGRESS);
        if (mc_flow_track(&p))
            mc_count(MC_C_TRACKED, n.len);
        if (mc_translate_leaving(skb, &p, &n, ETH_HLEN) < 0) {
            mc_count(MC_C_ERROR, n.len);
            mc_note_end(&n, MC_C_ERROR, MC_R_HELPER);
            verdict = TC_ACT_SHOT;
        }
    }
    if (n.slots)
        mc_mon_emit(&n);
    return verdict;
}

/* The tunnel device's hooks: translation only (no link-layer header: mc_parse_l3). They count what
 * they translate (MC_C_TRANSLATED) and what fails (MC_C_ERROR), not every packet: their programs
 * run only while the node has global ranges (from_tunnel, tunnel_egress). */
static __always_inline int mc_tunnel(struct __sk_buff *skb, struct mc_note *n, __u8 hook)
{
    struct mc_pkt p = {};
    if (mc_parse_l3(skb, &p) < 0) {
        mc_note_end(n, MC_C_PASS, MC_R_NOT_IP);
        return TC_ACT_OK;
    }
    mc_note_pkt(n, &p);
    int ret = hook == MC_HOOK_FROM_TUNNEL ? mc_xlate_in(skb, &p, n, 0) : mc_translate_leaving(skb, &p, n, 0);
    if (ret < 0)
        return mc_out(n, MC_C_ERROR, MC_R_HELPER, TC_ACT_SHOT);
    mc_note_end(n, MC_C_PASS, hook == MC_HOOK_FROM_TUNNEL ? MC_R_TUNNEL_IN : MC_R_EGRESS);
    return TC_ACT_OK;
}

/* The programs with a decision (all but flow_egress): the gate (mc_note_init), the decision, and
 * only with a monitor attached the event (lib/monitor.h). `hook` is a constant: each program keeps
 * one branch. */
static __always_inline int mc_program(struct __sk_buff *skb, __u8 hook)
{
    struct mc_note n;
    mc_note_init(&n, skb, hook);
    int verdict = hook == MC_HOOK_FROM_POD       ? mc_from_pod(skb, &n)
                  : hook == MC_HOOK_FROM_PRIVATE ? mc_from_private(skb, &n)
                                                 : mc_tunnel(skb, &n, hook);
    if (n.slots)
        mc_mon_emit(&n);
    return verdict;
}

int from_pod(struct __sk_buff *skb)
{
    return mc_program(skb, MC_HOOK_FROM_POD);
}

int from_private(struct __sk_buff *skb)
{
    return mc_program(skb, MC_HOOK_FROM_PRIVATE);
}

int from_tunnel(struct __sk_buff *skb)
{
    return mc_xlate_on() ? mc_program(skb, MC_HOOK_FROM_TUNNEL) : TC_ACT_OK;
}

int tunnel_egress(struct __sk_buff *skb)
{
    return mc_xlate_on() ? mc_program(skb, MC_HOOK_TUNNEL_EGRESS) : TC_ACT_OK;
}
