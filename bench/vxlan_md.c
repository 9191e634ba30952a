// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* bench/paths.py's `direct+vxlan(md)` mode: another way to build direct+vxlan, for comparison with
 * the shipped one (bpf/lib/encap.h). On the pod veth's tc ingress, IPv4 packets for the other
 * node's pods get a tunnel key (bpf_skb_set_tunnel_key) and are redirected to a collect-metadata
 * VXLAN device, which builds the outer headers in the kernel. The receiving node runs the shipped
 * from_private, which unwraps them like any VXLAN packet. Settings come as cflags: MD_POD_NET (the
 * other node's pod /24, host order), MD_REMOTE (its private IPv4, host order), MD_IFINDEX (the
 * VXLAN device), MD_VNI. Not shipped: bench only. */
#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/pkt_cls.h>

#define MD_POD_MASK 0xffffff00 /* MD_POD_NET is a /24 (host order) */
#define MD_TTL 64              /* outer TTL, as the shipped programs build it (MC_TTL_OUTER) */

int md_encap(struct __sk_buff *skb)
{
    void *data = (void *)(long)skb->data;
    void *end = (void *)(long)skb->data_end;
    struct ethhdr *eth = data;
    struct iphdr *ip = (void *)(eth + 1);
    /* The one bounds check: it covers the Ethernet and the IPv4 header read below. */
    if ((void *)(ip + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP))
        return TC_ACT_OK;
    if ((bpf_ntohl(ip->daddr) & MD_POD_MASK) != MD_POD_NET)
        return TC_ACT_OK;
    struct bpf_tunnel_key key = {};
    key.remote_ipv4 = MD_REMOTE;
    key.tunnel_id = MD_VNI;
    key.tunnel_ttl = MD_TTL;
    if (bpf_skb_set_tunnel_key(skb, &key, sizeof(key), BPF_F_ZERO_CSUM_TX | BPF_F_DONT_FRAGMENT) < 0)
        return TC_ACT_SHOT;
    return bpf_redirect(MD_IFINDEX, 0);
}
