# SPDX-License-Identifier: Apache-2.0
"""`meshctl` commands of the agent area: `agent`, `status`, `node list`, `cleanup`."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from meshctl import defaults
from meshctl.cli import targets
from meshctl.cli.options import (
    TEXT_FORMATS,
    endpoint_list,
    etcd_options,
    file_option,
    lab_etcd_options,
    lab_node_option,
    lab_option,
    log_level_option,
    node_option,
    output_option,
    pin_root_option,
)
from meshctl.cli.options import flag as _flag
from meshctl.errors import InputError, MeshError
from meshctl.mesh import fields
from meshctl.mesh.model import DEFAULT_PORT
from meshctl.mesh.model import Path as MeshPath
from meshctl.node.cni import CNI_MODES

if TYPE_CHECKING:  # read when a command runs: `--help` imports no agent
    from meshctl.agent.status import AgentStatus, BackendBlocks, PodsStatus
    from meshctl.backends.remote_status import RemotesStatus
    from meshctl.datapath.status import DatapathStatus


def _per_family(parse: Any, what: str) -> Any:
    """A list parser (mesh.fields) that also refuses a second item of one IP family."""
    return lambda value, path: fields.one_per_family_of(parse(value, path), path, what)


def _endpoints_text(value: str, path: str) -> str:
    """`--endpoint` checked now (one per family, each host[:port]) and kept as text: discovery
    parses it again with the mesh's port as the default, which is known only from the backend."""
    fields.endpoints(value, path, default_port=DEFAULT_PORT)
    return value


# The agent's environment variable for the fast path's switch (the DaemonSet fills it from the
# ConfigMap key `fastpath`): true or false; unset or empty: on. --no-fastpath wins.
FASTPATH_ENV = "MESHCTL_FASTPATH"
# ... and for IPv6 egress masquerade (ConfigMap key `masquerade6`): true or false; unset or empty:
# off. --masquerade6 wins.
MASQUERADE6_ENV = "MESHCTL_MASQUERADE6"


def _env_boolean(name: str) -> bool | None:
    """The true-or-false environment variable `name`; None when unset or empty (a bad value is an
    InputError naming the variable)."""
    env = os.environ.get(name, "")
    return None if env == "" else fields.boolean(env, name)


def _no_fastpath(ctx: click.Context, param: click.Parameter, flag: bool) -> bool:
    """Whether the fast path is off (--no-fastpath's callback): by the flag, else by
    FASTPATH_ENV."""
    return flag or _env_boolean(FASTPATH_ENV) is False


def _masquerade6(ctx: click.Context, param: click.Parameter, flag: bool) -> bool:
    """Whether IPv6 egress is masqueraded (--masquerade6's callback): by the flag, else by
    MASQUERADE6_ENV."""
    return flag or _env_boolean(MASQUERADE6_ENV) is True


@click.command("agent")
@node_option("node_name", aliases=("--node-name",), required=True, callback=_flag(fields.node_name),
             help="This node's name.")
@click.option("--pod-cidr", "pod_cidrs", default=None, callback=_flag(fields.pod_cidrs),
              help="This node's pod CIDRs, comma-separated, one per IP family (required, except with "
                   "--backend kubernetes: the Node's spec.podCIDRs).")
@click.option("--location", default="", callback=_flag(fields.location), help="Location (e.g. a cloud region).")
@click.option("--private-interface", default=None, envvar="MESHCTL_PRIVATE_INTERFACE",
              help="NIC of the private network (internal address).")
@click.option("--internal-cidr", default=None, callback=_flag(_per_family(fields.cidr_list, "internal CIDR")),
              envvar="MESHCTL_INTERNAL_CIDR", help="Pick the internal addresses from any interface inside these "
              "CIDRs, one per IP family, comma-separated (and the first one's NIC as the private one).")
@click.option("--force-internal-ip", default=None,
              callback=_flag(lambda v, at: fields.interfaces(v, at, "internal address")),
              help="Internal addresses with their subnet, one per IP family, comma-separated, e.g. "
              "10.10.0.4/16,fd10::4/64 (for a /32 on the NIC; replaces discovery in every family).")
@click.option("--endpoint", default=None, callback=_flag(_endpoints_text),
              help="Public WireGuard endpoints host[:port], one per IP family, comma-separated, e.g. "
              "203.0.113.4,[2001:db8::4]:51820 (default: discovered in each family).")
@click.option("--public-interface", default=None, help="NIC whose address is the endpoint.")
@click.option("--leader", is_flag=True, help="Prefer this node as its location's leader.")
@click.option("--persistent-keepalive", default=0, type=int, callback=_flag(fields.keepalive),
              help="Seconds between WireGuard keepalives to this node's peers (0: none; for a node behind NAT).")
@click.option("--allowed-location-ips", default="", callback=_flag(fields.cidr_list),
              help="Comma-separated CIDRs reachable through this node.")
@click.option("--state-dir", default=str(defaults.STATE_DIR), show_default=True, type=click.Path(path_type=Path),
              help="Where the private key and the etcd lease id are kept.")
@click.option("--wg-interface", default=defaults.WG_INTERFACE, show_default=True, help="The WireGuard device.")
@click.option("--wg-run-dir", default=str(defaults.WG_RUN_DIR), show_default=True, type=click.Path(path_type=Path),
              help="Private /var/run/wireguard of this node's wireguard-go.")
@click.option("--pod-interfaces", default=None, help="Glob of pod interface names to attach the fast path to "
              "(default: found by themselves: routed veths and the CNI bridge in the pod CIDR).")
@click.option("--cni", default="keep", show_default=True, envvar="MESHCTL_CNI",
              help=f"One of {', '.join(CNI_MODES)}. install: write a bridge + host-local CNI config on the pod "
              "CIDR (clusters without a CNI); keep: leave the cluster's CNI in charge; flannel: flannel (VXLAN or "
              "host-gw) carries pods inside a location, meshctl across (--backend kubernetes).")
@click.option("--cni-conf-dir", default="/etc/cni/net.d", show_default=True, type=click.Path(path_type=Path),
              help="The CNI configuration folder (--cni install writes there).")
@click.option("--metrics-addr", default=defaults.METRICS_ADDR, show_default=True,
              help="HOST:PORT of the full API: /metrics, /healthz, /readyz, /status and /probe (loopback unless "
              "asked: on the host's network, 0.0.0.0 opens it to every pod).")
@click.option("--secure-metrics-addr", default="", help="--backend kubernetes: HOST:PORT serving /healthz, /readyz "
              "and, to tokens the cluster's RBAC lets get /metrics, /metrics over TLS (probes, Prometheus).")
@click.option("--backend", default="etcd", show_default=True, type=click.Choice(["etcd", "file", "kubernetes"]),
              help="Where the records are: etcd (--etcd-* flags), file (-f), kubernetes (the API server).")
@file_option("topology_file", aliases=("--topology",), help="Topology file for --backend file.")
@click.option("--kubeconfig", default=None, help="--backend kubernetes: kubeconfig file (default: the first file "
              "of $KUBECONFIG, else ~/.kube/config, else in-cluster).")
@click.option("--location-label", default=defaults.REGION_LABEL, show_default=True,
              help="--backend kubernetes: Node label that names the location when no location annotation does.")
@click.option("--resync-seconds", "resync_interval", default=30.0, type=float, show_default=True,
              help="Full reconcile period; with --backend kubernetes a Node not seen for twice this is not ready.")
@click.option("--path-hold-seconds", "path_hold", default=10.0, type=float, show_default=True,
              help="intra_subnet auto: a private rung that delivers again is taken back after this long.")
@click.option("--no-forwarding-probes", "forwarding_probes", is_flag=True, default=True, flag_value=False,
              help="Send no hairpin probes through this location's members and publish no forwarding report "
              "(docs/mesh.md, \"Leaders that do not forward\"); the other members' reports still count.")
@click.option("--direct-wait-seconds", "direct_wait", default=20.0, type=float, show_default=True,
              help="A peer behind NAT tried this long without a handshake is reported unreached (then relayed).")
@click.option("--kvstore-endpoints", default="", callback=lambda _c, _p, val: endpoint_list(val),
              help="--backend kubernetes: mirror the cluster's nodes into this etcd (comma-separated URLs) "
              "for the cluster mesh.")
@click.option("--kvstore-ca", default=None, help="CA file that signed the kvstore etcd's certificate.")
@click.option("--kvstore-cert", default=None, help="Client certificate for the kvstore etcd.")
@click.option("--kvstore-key", default=None, help="Client key for the kvstore etcd.")
@click.option("--kvstore-user", default=None, help="etcd user of the kvstore mirror (meshctl:kvstore).")
@click.option("--kvstore-password-file", default=None, help="File holding the kvstore user's password.")
@etcd_options
@click.option("--cluster-id", default=1, type=int, callback=_flag(fields.cluster_id), show_default=True,
              help="This cluster's number in a cluster mesh (unique among the joined clusters).")
@click.option("--clustermesh-dir", default=None, type=click.Path(path_type=Path),
              help="One file per remote cluster (endpoints, ca-file, cert-file, key-file).")
@click.option("--clustermesh-cache", is_flag=True,
              help="Read remote clusters from the cluster's cache (`meshctl clustermesh cache`) in this "
              "cluster's etcd while it is healthy; --clustermesh-dir's clusters directly when it is not.")
@click.option("--no-fastpath", is_flag=True, callback=_no_fastpath,
              help=f"Kernel routes only, no eBPF (also {FASTPATH_ENV}=false: the ConfigMap key fastpath).")
@pin_root_option("bpf_pin_root", aliases=(), default=defaults.PIN_ROOT, show_default=True,
                 help="bpffs folder of the fast path's pins (this node's under DIR/NODE).")
@click.option("--lease-ttl", default=10, type=int, show_default=True, help="Seconds a dead agent's record lives.")
@click.option("--lapse-grace", default=defaults.LAPSE_GRACE_S, type=float, show_default=True,
              help="Seconds peers keep a node whose record's lease ran out (its agent restarting); "
              "also a remote cluster's nodes (--clustermesh-dir).")
@click.option("--nat-prefix", default="meshctl", show_default=True, help="Name prefix of the NAT rules and ipset.")
@click.option("--masquerade6", is_flag=True, callback=_masquerade6,
              help="Masquerade IPv6 pod traffic that leaves the mesh too (IPv4 always is; IPv6 pods usually "
                   f"hold addresses the cluster routes itself). Also {MASQUERADE6_ENV}=true: the ConfigMap key "
                   "masquerade6.")
@log_level_option()
def agent_cmd(**kw: Any) -> None:
    """Run the node agent: publish this node, watch the others, apply the plan."""
    logging.basicConfig(level=kw.pop("log_level").upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    kw["etcd_endpoints"] = endpoint_list(kw["etcd_endpoints"])
    kw["fastpath"] = not kw.pop("no_fastpath")
    kw["allowed_location_ips"] = kw["allowed_location_ips"] or ()
    kw["pod_cidrs"] = kw["pod_cidrs"] or ()
    kw["internal_cidr"] = kw["internal_cidr"] or ()
    kw["force_internal_ip"] = kw["force_internal_ip"] or ()
    kw["location"] = kw["location"] or ""
    kw["persistent_keepalive"] = kw["persistent_keepalive"] or 0
    from meshctl.agent.config import AgentConfig
    from meshctl.agent.run import run_agent

    cfg = AgentConfig(**kw).check()

    run_agent(cfg)


@click.command("status")
@click.option("--addr", default=defaults.METRICS_ADDR, show_default=True, help="The agent's --metrics-addr.")
@lab_node_option()
@lab_option()
@click.option("--verbose", is_flag=True, help="Also list the global Services (docs/clustermesh.md).")
@output_option(TEXT_FORMATS)
def status_cmd(addr: str, lab_node: str | None, lab_name: str | None, verbose: bool, output: str) -> None:
    """Print an agent's view: datapath mode, peers, last reconcile, rejected records."""
    from meshctl.agent.server import fetch_status
    from meshctl.agent.status import AgentStatus

    netns, wait = None, None
    if lab_node:
        t = targets.lab("--lab-node").agent(lab_name, lab_node)
        netns, addr, wait = t.netns, t.addr, t.wait
    doc = fetch_status(addr, netns, wait)
    if output == "json":
        click.echo(json.dumps(doc, indent=2, sort_keys=True))
        return
    click.echo(format_status(AgentStatus.from_json(doc), verbose=verbose))


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def format_paths(st: AgentStatus) -> list[str]:
    """One line per other node: the rung this node takes to it and, where it probes the pair, each
    probe kind's verdict and RTT (intra_subnet auto)."""
    paths = {k: v for k, v in (st.summary.paths if st.summary else {}).items() if v != MeshPath.LOCAL}
    if not paths:
        return []
    probed = st.live.path_probe.pairs if st.live.path_probe is not None else {}
    out = [f"paths ({len(paths)}):"]
    for name, rung in sorted(paths.items()):
        pair = probed.get(name)
        seen = "  ".join(f"{k} {'up' if v.up else 'down' if v.up is False else '?'}"
                         + (f" {v.rtt_ms:.2f} ms" if v.rtt_ms is not None else "")
                         for k, v in (pair.probes if pair else {}).items())
        out.append(f"  {name}  {rung}" + (f"  probes: {seen}" if seen else ""))
    changes = st.live.path_changes
    if changes:
        out.append("rung changes: " + "; ".join(f"{c.old} -> {c.new} ({c.reason}) x{c.count}" for c in changes))
    return out


def format_status(st: AgentStatus, *, verbose: bool = False) -> str:
    """`meshctl status`: the agent's view in lines (status.AgentStatus, read off /status); with
    `verbose`, the global Services too."""
    s, live, now = st.summary, st.live, time.time()
    lines = _format_plan(st)
    lines += _format_datapath(live.datapath, live.pods)
    if live.cni.warning:
        lines.append(f"WARNING: {live.cni.warning}")
    for w in s.warnings if s else ():
        lines.append(f"WARNING: {w}")
    lines.append(f"peers ({len(live.peers)}):")
    for p in live.peers:
        hs = p.live.last_handshake if p.live else 0
        age = f"{now - hs:.0f} s ago" if hs else "never"
        allowed = ",".join(p.allowed_ips) or ("- (standby: kept for a leader's return)" if p.kind == "standby" else "-")
        lines.append(f"  {p.name}  endpoint {(p.live.live_endpoint if p.live else None) or p.endpoint or '-'}  "
                     f"allowed {allowed}  rx {_bytes(p.live.rx_bytes if p.live else 0)}  "
                     f"tx {_bytes(p.live.tx_bytes if p.live else 0)}  handshake {age}")
    lines += format_paths(st)
    lines += format_nat(st)
    lines += format_leaders(st, now)
    if s is not None:
        last = s.last_reconcile
        errs = "; ".join(f"{k}: {e}" for k, e in last.errors.items())
        lines.append(f"last reconcile {now - last.time:.1f} s ago, {1000 * last.duration_s:.1f} ms"
                     f", {'applied' if last.applied else 'not applied'}{', errors: ' + errs if errs else ''}")
    rej = s.rejections if s else ()
    lines.append(f"rejected records ({len(rej)}):" if rej else "rejected records: none")
    lines += [f"  {r.name}: {r.reason}" for r in rej]
    lines += _format_backend(live.backend)
    if s is not None and s.remotes is not None:
        lines += format_clustermesh(s.remotes, now, verbose=verbose)
    return "\n".join(lines)


def _format_plan(st: AgentStatus) -> list[str]:
    """The first two lines: node, cluster, backend, readiness; the plan's shape."""
    s = st.summary
    ready = "ready" if st.ready else f"NOT READY ({st.reason or 'unknown'})"
    lead = "this node" if s and s.is_leader else (s.leader if s else None)
    wg_ip = (s.wireguard_ip if s else None) or "-"
    return [f"node {st.node}  cluster {s.cluster if s else None}  backend {s.backend if s else None}: {ready}"
            f"  revision {s.revision if s else None}",
            f"granularity {s.granularity if s else None}  leader {lead}  wireguard ip {wg_ip}"
            f" ({st.live.wireguard_mode or 'no device'})  nodes {s.nodes if s else None}"
            f"  routes {s.routes if s else None}"]


def _format_datapath(dp: DatapathStatus, pods: PodsStatus) -> list[str]:
    """The fast path's mode, hook and counters; the pod interfaces it carries."""
    from meshctl.agent.status import objects_line

    counters = "  ".join(f"{a} {p} pkts/{_bytes(b)}" for a, (p, b) in sorted(dp.counters.items()))
    how = ", ".join([*([dp.attach] if dp.attach else []),
                     *(f"without {f.split(' ', 1)[-1]}" for f in dp.fallbacks or ())])
    lines = [f"datapath {dp.mode or '-'}{' (' + dp.reason + ')' if dp.reason else ''}"
             f"{' [' + how + ']' if how else ''}{'  ' + counters if counters else ''}",
             *([objects_line(dp.objects, dp.objects_refused)] if dp.objects else []),
             f"pod interfaces: {len(pods.fastpath)} carry the fast path, {len(pods.found)} found ({pods.source})"
             + (f": {','.join(pods.fastpath)}" if pods.fastpath else "")]
    if pods.warning:
        lines.append(f"WARNING: {pods.warning}")
    return lines


def _format_backend(b: BackendBlocks) -> list[str]:
    """What the backend adds: the own record's restorations, lapsed records, the kvstore mirror."""
    lines = []
    own = b.own_record
    if own is not None:
        lines.append(f"own record restored: {own.restored_total} time(s)"
                     + (f", last {own.last_restored}" if own.last_restored else ""))
    if b.lapsed:
        lines.append("lapsed records kept: " + ", ".join(f"{n} ({s:.0f} s left)" for n, s in b.lapsed.items()))
    kv = b.kvstore
    if kv:
        role = "writer" if kv.writing else f"standby (writer: {kv.writer or 'none'})"
        lines.append(f"kvstore mirror: {role}")
    return lines


def format_nat(st: AgentStatus) -> list[str]:
    """Relayed nodes (path `relay`: through which node, why) and what this node saw of its NATed
    peers (docs/nat.md); nothing when there is neither."""
    s = st.summary
    if s is None:
        return []
    lines = [f"relay: {name} through {r.via} ({r.reason})" for name, r in sorted(s.relays.items())]
    if s.discovered_endpoints:
        seen = sorted(s.discovered_endpoints.items())
        lines.append("discovered endpoints: " + ", ".join(f"{n} {ep}" for n, ep in seen))
    if s.unreached_peers:
        lines.append("unreached peers: " + ", ".join(s.unreached_peers))
    return lines


def format_clustermesh(cm: RemotesStatus, now: float, *, verbose: bool = False) -> list[str]:
    """The ClusterMesh block: `ClusterMesh: 1/1 remote clusters ready, 1 global-services`, then one
    line a cluster, the rejected service records; with `verbose`, one line a global Service."""
    from meshctl.backends.clustermesh import summary_line

    if cm.error is not None:
        return [f"ClusterMesh: {cm.error}"]
    lines = [summary_line(cm.to_json())]
    remote_exports = (cm.clusterset.remote_exports or {}) if cm.clusterset is not None else None
    for c in cm.clusters:
        state = "ready" if c.ready else f"NOT READY ({c.reason or 'unknown'})"
        change = f"{now - c.last_change:.0f}s ago" if c.last_change else "never"
        exports = f"exports {remote_exports.get(c.name, 0)}  " if remote_exports is not None else ""
        lines.append(f"  {c.name}  {state}  nodes {c.nodes}  rejected {c.rejected}  {exports}"
                     f"endpoints {', '.join(c.endpoints) or '-'} ({'connected' if c.connected else 'not connected'})  "
                     f"last change {change}")
        lines += [f"    rejected {r.name}: {r.reason}" for r in c.rejections]
    lines += [f"  rejected service {r.name}: {r.reason}" for r in cm.service_rejections]
    if verbose:
        if cm.services:
            lines.append(f"  global services (published by {cm.services_leader or 'no elected agent'}):")
        for g in cm.services:
            remote = ", ".join(f"{c} {n}" for c, n in sorted(g.remote_endpoints.items())) or "none"
            lines.append(f"    {g.namespace}/{g.name}  local {g.local_endpoints}"
                         f"{'' if g.shared else ' (not shared)'}  remote {remote}  affinity {g.affinity}")
        if cm.clusterset is not None and cm.clusterset.imports:
            lines.append("  service imports (clusterset.local):")
        for i in cm.clusterset.imports if cm.clusterset is not None else ():
            eps = ", ".join(f"{c} {len(a)}" for c, a in sorted(i.endpoints.items())) or "none"
            lines.append(f"    {i.namespace}/{i.name}  {i.type} {', '.join(i.ips) or '-'}  endpoints {eps}")
    return lines


def format_leaders(st: AgentStatus, now: float) -> list[str]:
    """The leaders block (location granularity): per location who leads, who would by the
    documented order and why not (the verdicts, who published them, their age), the moves counted;
    the last moves; this node's own forwarding verdicts on its location's members."""
    lead = st.summary.leaders if st.summary is not None else None
    if lead is None:
        return []
    lines = ["leaders (location: leaders, documented order, moves):"]
    for loc in lead.locations:
        name = loc.get("location") or loc.get("key", "")
        chosen, static = ",".join(loc.get("leaders", ())), ",".join(loc.get("static", ()))
        moved = f"  instead of {static}: {loc.get('reason')}" if chosen != static else ""
        lines.append(f"  {name}: {chosen}  (order {static})  moves {lead.moves.get(name, 0)}{moved}")
    for m in lead.last_moves:
        lines.append(f"  moved {now - m.at:.0f} s ago: {m.location} {','.join(m.before)} -> {','.join(m.after)}"
                     f"  ({m.reason or 'back to the documented order'})")
    if lead.forwarding:
        held = ", ".join(f"{n} {v.get('verdict')} for {max(0.0, now - float(v.get('since', now))):.0f} s"
                         for n, v in sorted(lead.forwarding.items()))
        lines.append(f"  forwarding seen from here: {held}")
    return lines


@click.group("node")
def node_group() -> None:
    """Node records in the backend, or as an agent sees them."""


@node_group.command("list")
@lab_etcd_options
@click.option("--kubeconfig", default=None, help="List the Kubernetes cluster's Nodes as the agents admit them, "
              "pending ones with what they still lack.")
@click.option("--addr", default=None, help="Ask the agent at this --metrics-addr: every local and remote node "
              "with the path from that node.")
@lab_node_option()
@lab_option("A lab: its agent (with --lab-node) or its etcd's records (default: the only lab up).")
@output_option(deprecated={"text": "table"})
def node_list(etcd_endpoints: str, etcd_ca: str | None, etcd_cert: str | None, etcd_key: str | None,
              etcd_user: str | None, etcd_password_file: str | None, cluster_name: str | None,
              kubeconfig: str | None, addr: str | None, lab_node: str | None, lab_name: str | None,
              output: str) -> None:
    """List nodes. From an agent (the local one by default, --addr, --lab-node): local and remote
    nodes (`cluster2/g1`), their addresses, pod CIDRs, WireGuard addresses, source and the path from
    that node. From the store (etcd flags, --kubeconfig, or --lab: a lab's etcd and cluster): the
    records and what admission decided for each; Nodes that have not joined yet are pending, with
    what they still lack."""
    if addr or lab_node or (not etcd_endpoints and lab_name is None and kubeconfig is None):
        # Without flags: this node's agent (the DaemonSet's address), as on any real node.
        _node_list_from_agent(addr, lab_node, lab_name, output)
        return
    from meshctl.cli.plan import Source
    from meshctl.mesh import admit, records

    st = Source(None, "kubernetes" if kubeconfig else "etcd", kubeconfig, lab_name, etcd_endpoints, etcd_ca,
                etcd_cert, etcd_key, cluster_name, etcd_user, etcd_password_file).one_cluster().state()
    admitted, rejected = admit.admit_nodes(list(st.nodes), st.mesh.subnets,
                                           allow_default_route=st.mesh.allow_default_route)
    # Rows name every pod CIDR under one key whatever form the record is written in.
    rows = [{"name": n.name, "status": "admitted",
             **{k: v for k, v in records.node_to_record(n).items() if k != "pod_cidr"},
             "pod_cidrs": [str(c) for c in n.pod_cidrs]} for n in admitted]
    rows += [{"name": r.name, "status": "rejected", "reason": r.reason} for r in [*st.rejections, *rejected]]
    rows += [{"name": name, "status": "pending", "reason": why} for name, why in sorted(st.pending.items())]
    if output == "json":
        click.echo(json.dumps(rows, indent=2))
        return
    click.echo(f"{'NAME':<16} {'STATUS':<9} {'LOCATION':<10} {'INTERNAL':<18} {'ENDPOINT':<22} POD CIDRS / REASON")
    for r in rows:
        if r["status"] == "admitted":
            click.echo(f"{r['name']:<16} {'admitted':<9} {r.get('location', ''):<10} "
                       f"{_one_or_all(r, 'internal_ip'):<18} {_one_or_all(r, 'endpoint'):<22} "
                       f"{','.join(r['pod_cidrs'])}")
        else:
            click.echo(f"{r['name']:<16} {r['status']:<9} {r['reason']}")


def _one_or_all(rec: dict[str, Any], one: str) -> str:
    """A record's field in its one-element form, or its list form (`internal_ips`) comma-joined."""
    return str(rec.get(one) or ",".join(rec.get(f"{one}s", [])) or "-")


def _node_list_from_agent(addr: str | None, lab_node: str | None, lab_name: str | None, output: str) -> None:
    from meshctl.agent.server import fetch_status
    from meshctl.agent.status import AgentStatus
    from meshctl.mesh.render import node_rows_table

    netns, wait = None, None
    if lab_node:
        t = targets.lab("--lab-node").agent(lab_name, lab_node)
        netns, addr, wait = t.netns, t.addr, t.wait
    st = AgentStatus.from_json(fetch_status(addr or defaults.METRICS_ADDR, netns, wait))
    if st.live.node_list is None:
        raise MeshError(f"the agent of {st.node} has no plan yet")
    rows = [r.to_json() for r in st.live.node_list]
    if output == "json":
        click.echo(json.dumps(rows, indent=2))
    else:
        click.echo(node_rows_table(rows))


@click.command("cleanup")
@node_option("node_name", aliases=("--node-name",), callback=_flag(fields.node_name),
             help="This node's name (its pinned maps and, with etcd flags, its record).")
@click.option("--wg-interface", default=defaults.WG_INTERFACE, show_default=True,
              help="The WireGuard device to remove (if the agent created it).")
@click.option("--wg-run-dir", default=str(defaults.WG_RUN_DIR), show_default=True, type=click.Path(path_type=Path),
              help="The agent's --wg-run-dir: wireguard-go's socket and the record of the device it created.")
@click.option("--private-interface", default=None, help="The private NIC (the fast path's programs on it).")
@pin_root_option("bpf_pin_root", aliases=(), default=defaults.PIN_ROOT, show_default=True,
                 help="bpffs folder of the fast path's pins (this node's under DIR/NODE).")
@click.option("--nat-prefix", default="meshctl", show_default=True, help="The agent's --nat-prefix: its NAT "
              "chains and ipsets.")
@click.option("--force", is_flag=True, help="Also remove a WireGuard device meshctl did not create.")
@etcd_options
def cleanup_cmd(node_name: str | None, wg_interface: str, wg_run_dir: Path, private_interface: str | None,
                bpf_pin_root: str, nat_prefix: str, force: bool, etcd_endpoints: str, etcd_ca: str | None,
                etcd_cert: str | None, etcd_key: str | None, etcd_user: str | None, etcd_password_file: str | None,
                cluster_name: str) -> None:
    """Remove what the agent made on this node and only that: the WireGuard device it created
    (recorded in --wg-run-dir when created), routes of protocol 109, its own NAT sets and chains,
    its maps (and, with etcd flags, the node's record). Anything else is reported and left in
    place unless --force. Stop the agent first."""
    kept: list[str] = []
    failures = cleanup_node(node_name, wg_interface, wg_run_dir, private_interface, bpf_pin_root, nat_prefix,
                            force=force, kept=kept)
    for k in kept:
        click.echo(f"cleanup: kept {k}")
    if etcd_endpoints and node_name:
        from meshctl.backends.etcd import withdraw_record
        from meshctl.etcd import EtcdClient

        try:
            withdraw_record(EtcdClient(list(endpoint_list(etcd_endpoints)), ca=etcd_ca, cert=etcd_cert, key=etcd_key,
                                       user=etcd_user, password_file=etcd_password_file), cluster_name, node_name)
        except MeshError as e:
            failures.append(f"record: {e}")
    for f in failures:
        click.echo(f"cleanup: {f}", err=True)
    if failures:
        raise MeshError(f"cleanup left {len(failures)} part(s) behind")
    click.echo("cleaned up")


def cleanup_node(node_name: str | None, wg_interface: str, wg_run_dir: Path, private_interface: str | None,
                 bpf_pin_root: str, nat_prefix: str, *, force: bool = False, kept: list[str] | None = None
                 ) -> list[str]:
    """Undo the agent's appliers in this namespace; returns what failed (one line each) and adds
    to `kept` what was left because meshctl did not make it."""
    failures: list[str] = []

    def part(name: str, fn: Any) -> None:
        try:
            fn()
        except (MeshError, InputError, OSError, ImportError) as e:
            failures.append(f"{name}: {e}")

    def wg() -> None:
        from meshctl.node.wireguard import WireGuard

        left = WireGuard(ifname=wg_interface, run_dir=str(wg_run_dir)).delete(force=force)
        if left is not None and kept is not None:
            kept.append(left)

    def routes() -> None:
        from meshctl.node.routes import RouteApplier

        RouteApplier(private_interface, wg_interface).flush()

    def nat() -> None:
        from meshctl.node.masquerade import NatApplier

        NatApplier(nat_prefix).cleanup()

    def maps() -> None:
        if node_name:
            from meshctl.datapath import Datapath

            Datapath.unload(node_name, pin_root=bpf_pin_root)

    part("routes", routes)
    part("wireguard", wg)
    part("nat", nat)
    part("datapath", maps)
    return failures

