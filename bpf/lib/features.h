// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* What the programs may assume of the kernel. Each optional feature is a setting: 1, the programs
 * use it; 0, they take the fallback named below. The loader's feature probe decides each one on the
 * running kernel and passes it as a cflag (-DMC_HAVE_<...>=0|1: ctl/meshctl/datapath/features.py,
 * OPTIONAL, holds the same names); compiled without the cflag, a program assumes the feature.
 * Everything else the programs call is required: a kernel without it keeps the kernel's routes. */
#ifndef MC_LIB_FEATURES_H
#define MC_LIB_FEATURES_H

/* bpf_check_mtu (5.12): the kernel says whether an encapsulated packet fits the route's device,
 * GSO included. Fallback: the agent's copy of the private NIC's MTU (MC_CFG_PRIVATE_MTU) is
 * compared with the L3 length, and a GSO packet always fits (mc_fits, datapath.c). */
#ifndef MC_HAVE_CHECK_MTU
#define MC_HAVE_CHECK_MTU 1
#endif

/* BPF_F_ADJ_ROOM_ENCAP_L2_ETH (5.18): marks the inner protocol of a VXLAN packet as Ethernet
 * (ETH_P_TEB), which a NIC's VXLAN offload wants; an older kernel refuses the flag (EINVAL on
 * every call). Fallback: the flag is left out and the inner protocol stays IP; the kernel's GSO
 * still segments right, since it skips the inner Ethernet header by the inner MAC length
 * (mc_encap, encap.h). */
#ifndef MC_HAVE_ADJ_ROOM_L2_ETH
#define MC_HAVE_ADJ_ROOM_L2_ETH 1
#endif

/* BPF_F_ADJ_ROOM_DECAP_L3_IPV4/IPV6 (6.3): bpf_skb_adjust_room changes the IP version as it pops
 * the outer header. Fallback: a packet inside an outer header of the other version (IPv6 in IPv4,
 * IPv4 in IPv6) is first turned into an skb of its own version with bpf_skb_change_proto (mc_decap,
 * encap.h). */
#ifndef MC_HAVE_ADJ_ROOM_DECAP_L3
#define MC_HAVE_ADJ_ROOM_DECAP_L3 1
#endif

#endif
