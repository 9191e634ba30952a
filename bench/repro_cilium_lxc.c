// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* A REPRODUCTION of the verdicts of Cilium's `cil_from_container` (bpf_lxc.c) on a pod's lxc*
 * device, not Cilium's program: it counts every packet it sees and ends the tcx chain the way
 * Cilium's does, with TC_ACT_OK (hand the packet to the stack: native routing without BPF host
 * routing) or, built with -DREPRO_REDIRECT_IFINDEX=<n>, a bpf_redirect to that device (BPF host
 * routing). Neither is TCX_NEXT (-1), so a program after it in the chain never runs.
 * tests/lab/test_cni_labs.py attaches it next to meshctl's from_pod in both orders
 * (docs/datapath.md, "Next to Cilium"). Not shipped: tests and bench only. */
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>

BPF_ARRAY(repro_seen, __u64, 1);

int repro_from_container(struct __sk_buff *skb)
{
    int zero = 0;
    __u64 *n = repro_seen.lookup(&zero);
    if (n)
        __sync_fetch_and_add(n, 1);
#ifdef REPRO_REDIRECT_IFINDEX
    return bpf_redirect(REPRO_REDIRECT_IFINDEX, 0);
#else
    return TC_ACT_OK;
#endif
}
