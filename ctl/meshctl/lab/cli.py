# SPDX-License-Identifier: Apache-2.0
"""`meshctl` commands of the lab area: `lab up|check|down|status|fabric|nat|forwarding|pod|etcdctl|kubeconfig`.

This is where a lab's kind is decided: a namespace lab (lab/namespaces), a lab whose every node
is a VM (lab.vms: lab/vms/vmnodes.py) or the namespace lab inside one VM (`--kernel`:
lab/vms/vmlab.py). The rooms below never choose between each other. The module imports only
what the commands' options name (the lab's state, its kernels and waits): each command imports
the rooms it drives when it runs, so `meshctl lab X --help` is quick.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from importlib.resources import files
from typing import Any

import click

from meshctl.cli.options import file_option, lab_option, node_option, option, output_option
from meshctl.errors import InputError, MeshError
from meshctl.lab.namespaces import state
from meshctl.lab.namespaces.state import resolve as resolve_lab
from meshctl.lab.rigs.kernels import KERNEL_SERIES
from meshctl.lab.rigs.waiting import CONVERGE_WAIT, EMULATED_CONVERGE_WAIT


def _progress(msg: str) -> None:
    click.echo(f"[{time.strftime('%H:%M:%S')}] {msg}", err=True)


@click.group("lab")
def lab_group() -> None:
    """A whole mesh on this machine: network namespaces, etcd, one agent per node."""


def _term_tears_down(signum: int, frame: object) -> None:
    """SIGTERM to `lab up` is a Ctrl-C: the bring-up's own failure path removes what it built, VMs
    included. A second one during that teardown is ignored, so the teardown finishes."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(128 + signum)


@lab_group.command("up")
@file_option(help="Lab or topology file (default: the shipped lab).")
@click.option("--prefix", default=None, help="Name prefix of everything the lab makes (default: lab.prefix, ml-).")
@click.option("--wait", type=float, default=None,
              help=f"Seconds to wait for the agents to converge [default: {CONVERGE_WAIT:.0f}; "
                   f"{EMULATED_CONVERGE_WAIT:.0f} in a VM without KVM].")
@click.option("--kernel", default="host", show_default=True, type=click.Choice(["host", *KERNEL_SERIES]),
              help="Run the lab inside a VM booting this Debian kernel (make kernels fetches them); host: here.")
@click.option("--image", default=None, metavar="IMAGE",
              help="Run every agent from this image with podman, as manifests/04-daemonset.yaml runs it "
                   "(lab.agent: image; `make image` builds it).")
def lab_up(path: str | None, prefix: str | None, wait: float | None, kernel: str, image: str | None) -> None:
    """Build the lab and start its agents."""
    from meshctl.lab.namespaces import build
    from meshctl.lab.namespaces.spec import check_prefix, load_lab, with_image
    from meshctl.lab.vms import vmlab, vmnodes

    if path is None:
        path = str(files("meshctl.lab") / "labs" / "default.yaml")
    if prefix is not None:
        check_prefix(prefix, "--prefix")
    spec = load_lab(path)
    if image is not None:
        spec = with_image(spec, image)
    if kernel != "host" and spec.options.agent == "image":
        raise InputError("--kernel", kernel, "is not available with agents from the image (lab.agent image: "
                         "the VM runs no podman)")
    _require_root()
    signal.signal(signal.SIGTERM, _term_tears_down)
    if kernel != "host" and spec.options.vms:
        raise InputError("--kernel", kernel, "is for a lab in one VM; this lab has lab.vms (nodes[].kernel picks each)")
    if kernel != "host":
        st = vmlab.up(spec, path, kernel, prefix=prefix, wait=wait, progress=_progress)
        t = st.timings or {}
        d = st.vm
        assert d is not None  # vmlab.up records its VM
        click.echo(f"lab {st.name} is up inside a VM (Debian {kernel}, {d.version}, {d.accel}): "
                   f"VM booted in {t['boot_s']} s, lab built in {t['lab_s']} s; state in {st.dir}/state.json")
        return
    if spec.options.vms:
        st = vmnodes.up(spec, prefix=prefix, progress=_progress, wait=wait or EMULATED_CONVERGE_WAIT)
    else:
        st = build.up(spec, prefix=prefix, progress=_progress, wait=wait or CONVERGE_WAIT,
                      spawn=vmnodes.forked_spawner)
    click.echo(f"lab {st.name} is up ({len(st.nodes())} nodes); state in {st.dir}/state.json")


@lab_group.command("check")
@lab_option()
@output_option(deprecated={"text": "table"})
@click.option("--count", default=5, show_default=True, help="Pings per pair.")
def lab_check(lab_name: str | None, output: str, count: int) -> None:
    """Ping every pod pair; print reachability, path (from counters) and RTT. Exit 1 if any fails."""
    from meshctl.lab.namespaces import check as labcheck
    from meshctl.lab.vms import vmnodes

    st = state.resolve(lab_name)
    results = labcheck.check(st, count=count, run=vmnodes.on_node if st.vms else labcheck.on_host)
    if output == "json":
        click.echo(labcheck.results_json(results))
    else:
        click.echo(labcheck.format_matrix(results))
    if any(not r.ok for r in results):
        sys.exit(1)


@lab_group.command("fabric")
@click.argument("subnet")
@click.argument("kind")
@click.option("--loss", default=0, show_default=True, type=int, help="Percent of packets the fabric drops.")
@lab_option()
def lab_fabric(subnet: str, kind: str, loss: int, lab_name: str | None) -> None:
    """Turn a running private subnet into another fabric KIND (l2, vpc, vpc-udp, hetzner, blackhole)."""
    from meshctl.lab.namespaces import fabric

    _require_root()
    st = state.resolve(lab_name)
    e = fabric.change(st, subnet, kind, loss)
    click.echo(f"fabric {subnet}: {e.kind}" + (f", {e.loss}% loss" if e.loss else ""))


@lab_group.command("nat")
@click.argument("node")
@lab_option()
@click.option("--rebind", is_flag=True, help="Give the node a new external port now (its NAT forgets its mappings; "
              "a firewall6 forgets its state).")
@click.option("--kind", default=None, type=click.Choice(["cone", "symmetric"]), help="Turn the NAT into this kind now.")
def lab_nat(node: str, lab_name: str | None, rebind: bool, kind: str | None) -> None:
    """Show (or with --rebind, change) the NAT of a node listed in lab.nat."""
    from meshctl.lab.namespaces import nat_router as labnat

    st = state.resolve(lab_name)
    cst, n = st.lookup(node)
    if not n.nat:
        raise MeshError(f"lab node {node} is not behind a NAT (lab.nat)")
    if kind:
        labnat.set_kind(n, kind, cst.port)
    if rebind:
        labnat.rebind(n, cst.port)
    if kind or rebind:
        state.save(st)
    nat = n.nat
    if nat.kind == labnat.FIREWALL6:
        click.echo(f"{node}: {nat.kind} (stateful, no translation) in {nat.router_ns}, address {nat.public_ip}, "
                   f"inbound new dropped {labnat.dropped(nat)}, rebinds {nat.rebinds}")
        return
    port = nat.port if nat.port is not None else "random per destination"
    v6 = (f"; IPv6 {nat.firewall6_ip} behind its firewall6, inbound new dropped {labnat.dropped(nat)}"
          if nat.firewall6_ip else "")
    click.echo(f"{node}: {nat.kind} NAT in {nat.router_ns}, inside {nat.inside_ip}, "
               f"outside {nat.public_ip} port {port}, rebinds {nat.rebinds}{v6}")


@lab_group.command("forwarding")
@click.argument("node")
@click.argument("state", type=click.Choice(["off", "on"]))
@lab_option()
def lab_forwarding(node: str, state: str, lab_name: str | None) -> None:
    """Make NODE drop (off) or forward again (on) what it forwards for others, in its namespace
    only: its own traffic, record, lease and agent stay healthy (a leader that stopped forwarding)."""
    from meshctl.lab.namespaces import faults

    _require_root()
    st = resolve_lab(lab_name)  # `state` is the argument here
    _, n = st.lookup(node)
    count = faults.forwarding(st.prefix, n, state == "on")
    if state == "on":
        click.echo(f"{node}: forwarding on")
    else:
        click.echo(f"{node}: forwarding off (nftables table inet {faults.forwarding_table(st.prefix)} in {n.netns} "
                   f"drops what it forwards; {count} dropped so far)")


@lab_group.command("down")
@lab_option()
@click.option("--all", "all_labs", is_flag=True, help="Take down every lab that is up.")
@click.option("--prefix", default=None, help="Remove by prefix even without a state file (after a crash).")
def lab_down(lab_name: str | None, all_labs: bool, prefix: str | None) -> None:
    """Remove a lab (the only one up, --lab NAME, or --all): agents, wireguard-go, etcd, pinned
    maps, namespaces. Safe to repeat."""
    from meshctl.lab.namespaces import build
    from meshctl.lab.vms import vmlab, vmnodes

    names = labs_to_take_down(lab_name, all_labs, prefix, state.labs_up())
    problems = []
    for name in names:
        st = state.load(name)
        if st is not None and st.vm:
            problems += vmlab.down(st, progress=_progress)
        elif st is None or st.vms:  # without a state (a crash) its VMs are found by their directories
            problems += vmnodes.down(name, progress=_progress)
        else:
            problems += build.down(name, progress=_progress)
    if problems:
        raise MeshError(f"lab down left {len(problems)} thing(s) behind")


@lab_group.command("status")
@lab_option()
@output_option(deprecated={"text": "table"})
def lab_status(lab_name: str | None, output: str) -> None:
    """Nodes, pods, agents (alive, converged) and etcd of a lab."""
    from meshctl.lab.namespaces import check as labcheck
    from meshctl.lab.namespaces import nat_router as labnat
    from meshctl.node.shell import pid_alive

    st = state.resolve(lab_name)
    rows: list[dict[str, Any]] = []
    members = list(st.nodes())
    # Every agent asked at once; a VM node's agent (under TCG on a busy host) gets longer to answer.
    with ThreadPoolExecutor(max_workers=max(1, len(members))) as pool:
        views = list(pool.map(lambda cn: labcheck.agent_view(cn[1], timeout=labcheck.status_wait(cn[1], 1.0)),
                              members))
    for (c, n), s in zip(members, views, strict=True):
        in_vm = n.vm
        rows.append({
            "cluster": c.name, "node": n.name, "netns": n.netns, "location": n.location,
            "internal_ip": n.internal_ip, "public_ip": n.public_ip, "pod_cidrs": n.pod_cidrs,
            "pods": [p.ip for p in n.pods], "agent_pid": n.guest_pid if in_vm else n.pid,
            # a dual-stack node's IPv6 addresses (docs/lab.md, IP families), and its NICs' families
            "internal_ip6": n.internal_ip6, "public_ip6": n.public_ip6, "pods6": [p.ip6 for p in n.pods if p.ip6],
            "ip_families": st.families_of(n),
            # a VM node's agent PID is its guest's: alive is whether it answers
            "agent_alive": bool(s) if in_vm else bool(n.pid and pid_alive(n.pid)),
            "kernel": in_vm.version if in_vm else None, "wireguard": s.live.wireguard_mode if s else None,
            "ready": bool(s and s.ready), "granularity": s.summary.granularity if s and s.summary else None,
            "leader": s.summary.leader if s and s.summary else None, "peers": len(s.live.peers) if s else None,
            "datapath": s.live.datapath.mode if s else None,
            "nat": n.nat.kind if n.nat else None,
        })
    if output == "json":
        click.echo(json.dumps({"name": st.name, "prefix": st.prefix, "source": st.source,
                               "etcd": {c.name: c.etcd.endpoints for c in st.clusters},
                               "nodes": rows}, indent=1))
        return
    click.echo(f"lab {st.name} (prefix {st.prefix}) from {st.source}")
    for c in st.clusters:
        click.echo(f"  etcd {c.name}: {', '.join(c.etcd.endpoints)} (netns {c.etcd.netns})")
    click.echo(f"  {'NODE':<14} {'NETNS/VM':<18} {'INTERNAL':<16} {'PODS':<14} {'AGENT':<12} {'GRAN':<9} "
               f"{'LEADER':<8} {'PEERS':<5} DATAPATH")
    for r in rows:
        agent = f"{r['agent_pid']}" if r["agent_alive"] else "dead"
        where = r["netns"] or f"VM {r['kernel']}"
        internal = ",".join(a for a in (r["internal_ip"], r["internal_ip6"]) if a) or "-"
        click.echo(f"  {r['node']:<14} {where:<18} {internal:<16} {','.join(r['pods'] + r['pods6']):<14} "
                   f"{agent:<12} {r['granularity'] or '-':<9} {r['leader'] or '-':<8} {r['peers'] or 0!s:<5} "
                   f"{r['datapath'] or '-'}" + (f"  IPv{r['ip_families'][0]} only" if len(r["ip_families"]) == 1
                                                 and r["ip_families"] != st.ip_families else "")
                   + (f"  behind a {r['nat']}" + ("" if r["nat"] == labnat.FIREWALL6 else " NAT") if r["nat"] else "")
                   + (f"  wireguard {r['wireguard']}" if r["kernel"] else ""))
    if any(r["kernel"] for r in rows):
        click.echo("  a node is a VM: `meshctl status --lab-node NODE` and `maps dump --node NODE` run inside it")
    else:
        click.echo("  enter a node:  nsenter --net=/run/netns/<NETNS> bash   (ip route; wg show kilo0 needs the "
                   "node's run dir)")


@lab_group.group("pod")
def pod_group() -> None:
    """Pods of a running lab: add one (the agents find its interface by themselves) or remove one."""


@pod_group.command("add")
@lab_option()
@node_option(required=True, help="The lab node the pod runs on.")
@option("--cluster-name", "cluster", aliases=("--cluster",), default=None,
        help="The node's cluster (labs with several).")
def pod_add(lab_name: str | None, node: str, cluster: str | None) -> None:
    """Add a pod to a lab node: its namespace, veth and route (the node's agent finds it by itself)."""
    from meshctl.lab.namespaces import build

    _require_root()
    pod = build.add_pod(lab_name, node, cluster)
    click.echo(f"pod {pod.ip}{f' and {pod.ip6}' if pod.ip6 else ''} on {node} ({pod.host_if}, namespace {pod.netns})")


@pod_group.command("remove")
@lab_option()
@node_option(required=True, help="The lab node the pod runs on.")
@click.option("--ip", required=True, help="The pod's address.")
def pod_remove(lab_name: str | None, node: str, ip: str) -> None:
    """Remove a pod (by its address) from a lab node."""
    from meshctl.lab.namespaces import build

    _require_root()
    build.remove_pod(lab_name, node, ip)
    click.echo(f"removed pod {ip} from {node}")


@lab_group.command("etcdctl", context_settings={"ignore_unknown_options": True})
@click.option("--as", "who", default="admin", show_default=True,
              help="Identity: admin, a node name, remote:<cluster> or meshctl:kvstore.")
@lab_option()
@option("--cluster-name", "cluster_name", aliases=("--cluster",), default=None, help="Cluster (default: the first).")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def lab_etcdctl(who: str, lab_name: str | None, cluster_name: str | None, args: tuple[str, ...]) -> None:
    """Run etcdctl against a lab cluster's etcd as one of its identities: `meshctl lab etcdctl
    --as b2 -- put /meshctl/default/nodes/a1 x` shows what b2's credentials may do. Exits with
    etcdctl's status."""
    from meshctl.lab.namespaces import build
    from meshctl.lab.rigs import netns

    st = state.resolve(lab_name)
    cst = next((c for c in st.clusters if cluster_name in (None, c.name)), None)
    if cst is None:
        raise MeshError(f"lab {st.name} has no cluster {cluster_name}")
    e, i = build.etcd_identity(cst, who)
    with open(i.password_file) as f:
        password = f.read().strip()
    # The password goes through the environment (ETCDCTL_USER), not the command line others can read.
    env = dict(os.environ, ETCDCTL_API="3", ETCDCTL_USER=f"{i.user}:{password}")
    argv = [*netns.exec_prefix(e.netns), "etcdctl", "--endpoints", ",".join(e.endpoints), "--cacert", e.ca,
            "--cert", i.cert, "--key", i.key, *args]
    sys.exit(subprocess.run(argv, env=env, check=False).returncode)


@lab_group.command("kubeconfig")
@lab_option()
@option("--cluster-name", "cluster", aliases=("--cluster",), default=None,
        help="Cluster (needed when the lab has several).")
def lab_kubeconfig(lab_name: str | None, cluster: str | None) -> None:
    """Print the path of a kubeconfig for a running lab's Kubernetes API server (lab.backend:
    kubernetes), reachable from the host: `kubectl --kubeconfig "$(meshctl lab kubeconfig)" get
    nodes -o wide`."""
    click.echo(state.kube_access(lab_name, cluster).host_kubeconfig)


def labs_to_take_down(lab_name: str | None, all_labs: bool, prefix: str | None, up: list[str]) -> list[str]:
    """The labs `lab down` removes: the named one (or the prefix's), every one up with --all,
    else the only one up; with several up and none named it refuses, naming them, so it never
    takes down a lab someone else is using. With none up, the default lab's leftovers."""
    from meshctl.lab.namespaces.spec import check_prefix

    if prefix is not None:
        return [state.lab_name(check_prefix(prefix, "--prefix"))]
    if lab_name is not None:
        return [lab_name]
    if len(up) > 1 and not all_labs:
        raise MeshError(f"several labs are up ({', '.join(up)}): pass --lab NAME or --all")
    return up or ["ml"]


def _require_root() -> None:
    if os.geteuid() != 0:
        raise MeshError("the lab needs root (network namespaces)")
