# SPDX-License-Identifier: Apache-2.0
"""Commands that show the mesh: `plan`, `graph`, `showconf`. They read a topology file (`-f`) or,
like Kilo's kgctl, the live cluster's store (`--backend etcd|kubernetes`): the same records the
agents read, admitted the same way."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from meshctl.cli import targets
from meshctl.cli.options import endpoint_list, file_option, lab_etcd_options, lab_option, node_option, output_option
from meshctl.errors import MISSING, InputError, MeshError
from meshctl.mesh.graph import GRAPH_FORMATS, NODE_LEVEL_UP_TO
from meshctl.mesh.model import GRANULARITIES, Granularity, IPNetwork, PathState, Topology
from meshctl.mesh.render import SHOWCONF_FORMATS

if TYPE_CHECKING:  # the rest is imported when a command runs: `--help` stays quick
    from meshctl.backends.base import ClusterState
    from meshctl.backends.kube.backend import KubeBackend
    from meshctl.etcd import EtcdClient
    from meshctl.mesh.leaders import Leaders
    from meshctl.mesh.observed import NodeSeen
    from meshctl.mesh.segments import Remote

BACKENDS = ("file", "etcd", "kubernetes")
RECORDS_PREFIX = "/meshctl/"  # every cluster's records: /meshctl/<cluster>/...


def live_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """How to reach the live cluster's store: the Kubernetes API or an etcd (the agent's flags, or a lab's)."""
    for opt in reversed([
        click.option("--kubeconfig", default=None,
                     help="The cluster's kubeconfig file (implies --backend kubernetes)."),
        lab_option("A lab's etcd and its cluster(s) (implies --backend etcd; with --backend etcd, in place of "
                   "--etcd-endpoints and --cluster-name)."),
        lab_etcd_options,
    ]):
        f = opt(f)
    return f


def _source_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Where the topology comes from: `-f FILE`, or the live store with the agent's flags."""
    for opt in reversed([
        file_option(type=click.Path(dir_okay=False), help="Topology YAML (the default source)."),
        click.option("--backend", default=None, type=click.Choice(BACKENDS),
                     help="Read the live cluster instead of a file: its etcd (--etcd-* flags, or the lab's etcd) "
                     "or its Kubernetes API (--kubeconfig, the first file of $KUBECONFIG, ~/.kube/config, "
                     "in-cluster)."),
        live_options,
    ]):
        f = opt(f)
    return f


class Source:
    """The topology a command shows, and the name errors give its origin (`topo.yaml`, `etcd`).

    The clusters it reads: `--cluster-name`'s; left out, a lab's own (a lab of several clusters:
    the first is this one, the others its remote clusters); else `default`. A cluster with no
    records in the etcd is one line naming the clusters that have some, never an empty picture."""

    def __init__(self, path: str | None, backend: str | None, kubeconfig: str | None, lab_name: str | None,
                 etcd_endpoints: str, etcd_ca: str | None, etcd_cert: str | None, etcd_key: str | None,
                 cluster_name: str | None, etcd_user: str | None = None, etcd_password_file: str | None = None,
                 **_: Any) -> None:
        if lab_name is not None and not path and (backend == "kubernetes" or backend is None and kubeconfig):
            left = "--backend kubernetes" if backend else "--kubeconfig"
            raise InputError("--lab", lab_name, f"reads a lab's etcd: leave out {left}")
        if backend is None and kubeconfig is not None and not path:
            backend = "kubernetes"
        backend = backend or ("etcd" if lab_name is not None and not path else "file")
        if backend == "file" and not path:
            raise InputError("-f", MISSING, "is required (or --backend etcd|kubernetes)")
        if backend != "file" and path:
            raise InputError("--backend", backend, "reads the live cluster: leave out -f")
        self.backend, self.path = backend, path
        self.kubeconfig, self.lab_name = kubeconfig, lab_name
        self.etcd = (etcd_endpoints, etcd_ca, etcd_cert, etcd_key, etcd_user, etcd_password_file)
        self.clusters: tuple[str, ...] = (cluster_name,) if cluster_name else self._lab_clusters() or ("default",)
        self.cluster_name = self.clusters[0]
        self.name = Path(path).name if path else backend
        self.warn: Callable[[str], None] = _warn  # where `warning:` lines go (ui: each once, and to the page)
        # The live store's leader choice (mesh/leaders.py), once `load` read it; None for a file.
        self.leaders: Leaders | None = None
        # Nodes of the live cluster that have not joined yet (their agent has not published, or no
        # pod CIDR yet), by name: what each still lacks. Filled by `load`.
        self.pending: dict[str, str] = {}

    def one_cluster(self) -> Source:
        """This source, refusing a lab of several clusters read without --cluster-name: a command
        about one cluster's records (mesh get|set, node list) does not pick one for the user."""
        if len(self.clusters) > 1:
            raise InputError("--cluster-name", MISSING, f"is required: the lab has clusters {', '.join(self.clusters)}")
        return self

    def _reads_lab(self) -> bool:
        """Whether the etcd read is a lab's (--lab, or no --etcd-endpoints)."""
        return self.backend == "etcd" and (self.lab_name is not None or not self.etcd[0])

    def _lab_clusters(self) -> tuple[str, ...]:
        """A lab's clusters, in the order of its file (none when no lab is read or found)."""
        if not self._reads_lab() or not targets.has_lab():
            return ()
        try:
            return targets.lab("--lab").clusters(self.lab_name)
        except MeshError:
            return ()  # no lab up: the etcd read says so, with the flags that reach a real etcd

    def load(self, node: str | None = None) -> Topology:
        """The admitted topology; warnings and rejected records go to stderr as `warning:` lines.
        In a lab of several clusters, `node` picks the cluster that has it."""
        if self.path:
            from meshctl.backends.file import load_topology_checked

            topo, warnings = load_topology_checked(self.path)
            for w in warnings:
                self.warn(w)
            return topo
        if node is not None and len(self.clusters) > 1:
            self.cluster_name = self._cluster_of(node)
        return self._admitted(self.state(node))

    def _admitted(self, state: ClusterState) -> Topology:
        from meshctl.mesh.admit import admit_local
        from meshctl.mesh.checks import topology_warnings
        from meshctl.mesh.leaders import choose_leaders, with_leaders

        topo, rejected = admit_local(state.topology())
        for r in [*state.rejections, *rejected]:
            self.warn(f"rejected {r.name}: {r.reason}")
        self.pending = dict(state.pending)
        for name, why in sorted(self.pending.items()):
            self.warn(f"{self.backend}: node {name} is pending: {why}")
        for w in topology_warnings(topo):
            self.warn(f"{self.backend}: {w}")
        # The leaders every agent plans with: the documented order unless the published forwarding
        # reports rule one out (mesh/leaders.py).
        self.leaders = choose_leaders(topo, state.forwarding)
        return with_leaders(topo, self.leaders)

    def not_a_node(self, node: str, option: str = "--node") -> InputError:
        """The line for a node the topology lacks: pending (with what it still lacks) or unknown."""
        if node in self.pending:
            return InputError(option, node, f"has not joined {self.name} yet: {self.pending[node]}")
        return InputError(option, node, f"is not a node in {self.name}")

    def _cluster_of(self, node: str) -> str:
        """The lab cluster whose records name `node` (the first cluster when none does)."""
        for c in self.clusters:
            if any(n.name == node for n in self._etcd(c).nodes):
                return c
        return self.clusters[0]

    def remote_topologies(self) -> list[Topology]:
        """The lab's other clusters (a lab of several), admitted each on its own, for the picture."""
        return [self._admitted(self._etcd(c)) for c in self.clusters if c != self.cluster_name]

    def state(self, node: str | None = None) -> ClusterState:
        """The live store's records as the agents read them (not yet admitted)."""
        state = self._etcd(self.cluster_name) if self.backend == "etcd" else self._kube(node)
        if not state.ready:
            raise MeshError(f"{self.backend}: {state.reason or 'not ready'}")
        return state

    def seen(self) -> dict[str, NodeSeen]:
        """What each node of the cluster publishes it observes (agent.seen; etcd or the Kubernetes
        API), by node; a summary refused (not JSON, naming another node) is a `warning:` line, one
        older than agent.seen.STALE_AFTER_S is dropped with one (it no longer says what the node sees)."""
        import time

        from meshctl.agent.seen import STALE_AFTER_S
        from meshctl.backends.etcd import read_seen

        if self.backend == "kubernetes":
            be = self.kube_backend()
            try:
                seen, refused = be.read_seen()
            finally:
                be.close()
        elif self.backend == "etcd":
            client = self.etcd_client()
            try:
                seen, refused = read_seen(client, self.cluster_name)
            finally:
                client.close()
        else:
            raise InputError("--live", self.name, "needs the summaries the agents publish: "
                             "use --backend etcd|kubernetes or --lab NAME")
        for line in refused:
            self.warn(f"{self.backend}: {line}")
        now = time.time()
        for name, s in sorted(seen.items()):
            if now - s.at > STALE_AFTER_S:
                self.warn(f"{self.backend}: the summary of {name} is {now - s.at:.0f} s old: left out")
                del seen[name]
        return seen

    def etcd_client(self, cluster: str | None = None) -> EtcdClient:
        """A client of the etcd of `cluster` (default: this one): from the --etcd-* flags, or the
        lab's (--lab, or no endpoints)."""
        from meshctl.etcd import EtcdClient
        from meshctl.etcd.client import COMMAND_TIMEOUT_S

        endpoints, ca, cert, key, user, password_file = self.etcd
        netns = None
        if self._reads_lab():
            acc = _lab_etcd(self.lab_name, cluster or self.cluster_name)
            endpoints, ca, cert, key, user, password_file, netns = (
                ",".join(acc.endpoints), acc.ca, acc.cert, acc.key, acc.user, acc.password_file, acc.netns)
        return EtcdClient(list(endpoint_list(endpoints)), ca=ca, cert=cert, key=key, netns=netns, user=user,
                          password_file=password_file, timeout=COMMAND_TIMEOUT_S)

    def _etcd(self, name: str) -> ClusterState:
        """Cluster `name`'s records in its etcd; InputError naming the clusters that have records
        when it has none."""
        from meshctl.backends.etcd import EtcdBackend, cluster_key, parse_record
        from meshctl.mesh import records
        from meshctl.mesh.model import Cluster

        client = self.etcd_client(name)
        try:
            prefix = f"{RECORDS_PREFIX}{name}/"
            if not client.range(prefix, prefix=True, keys_only=True)[0]:
                keys, _ = client.range(RECORDS_PREFIX, prefix=True, keys_only=True)
                have = sorted({kv.key.removeprefix(RECORDS_PREFIX).split("/", 1)[0] for kv in keys})
                raise InputError("--cluster-name", name, "has no records in this etcd (clusters with records: "
                                 f"{', '.join(have) or 'none'})")
            cluster = Cluster(name)
            kv = client.get(cluster_key(name))
            if kv is not None:
                rec = parse_record(kv, kv.key)
                if isinstance(rec, dict):
                    cluster = records.parse_cluster({k: rec[k] for k in ("name", "id") if k in rec}, kv.key)
            return EtcdBackend(client, cluster).load_once()
        finally:
            client.close()

    def kube_backend(self, node: str | None = None) -> KubeBackend:
        """A Kubernetes backend of the cluster (--kubeconfig, or as kubectl finds one); the caller closes it."""
        from meshctl.backends.kube.backend import backend_from_options

        return backend_from_options(self.kubeconfig, node or "meshctl")

    def _kube(self, node: str | None) -> ClusterState:
        be = self.kube_backend(node)
        try:
            return be.snapshot()
        finally:
            be.close()


def _warn(line: str) -> None:
    click.echo(f"warning: {line}", err=True)


def _lab_etcd(lab_name: str | None, cluster_name: str) -> targets.EtcdTarget:
    """A lab's etcd; without --lab and with no lab to find, the line says which flags reach a real one."""
    try:
        return targets.lab("--etcd-endpoints").etcd(lab_name, cluster_name)
    except MeshError as e:
        if lab_name is not None:
            raise
        raise InputError("--etcd-endpoints", MISSING, f"is not given and {str(e).removeprefix('--etcd-endpoints: ')}; "
                         "a real etcd: --etcd-endpoints https://HOST:2379 --etcd-ca FILE --etcd-cert FILE "
                         "--etcd-key FILE (or --etcd-user NAME --etcd-password-file FILE); "
                         "a lab's: --lab NAME") from None


def _load_remotes(local: Topology, paths: tuple[str, ...], live: list[Topology] | None = None) -> list[Remote]:
    """Remote clusters' topology files (and a lab's other clusters, `live`), admitted against the
    local one (clustermesh rules)."""
    from meshctl.backends.file import load_topology
    from meshctl.mesh.admit import admit_remotes, as_remote

    remotes = [as_remote(t) for t in [*(load_topology(p) for p in paths), *(live or ())]]
    admitted, rejections = admit_remotes(local, remotes)
    for r in rejections:
        click.echo(f"warning: rejected {r.name}: {r.reason}", err=True)
    return admitted


@click.command()
@_source_options
@node_option(help="The node whose plan to print (with --diff: only this node's diff).")
@click.option("--granularity", type=click.Choice(GRANULARITIES), help="Override the file's granularity.")
@click.option("--remote", "remotes", multiple=True, type=click.Path(dir_okay=False),
              help="Another cluster's topology file (cluster mesh); repeatable.")
@click.option("--path-state", "path_state", type=click.Path(dir_okay=False),
              help="Probe results (YAML: node -> the private rungs that deliver); without it every rung works.")
@click.option("--diff", "other", default=None, type=click.Path(dir_okay=False),
              help="Another topology file: print what changes on every node from this topology to that one.")
@output_option()
def plan(node: str | None, granularity: Granularity | None, remotes: tuple[str, ...], path_state: str | None,
         other: str | None, output: str, **source: Any) -> None:
    """Print one node's WireGuard peers, routes and fast-path entries; with --diff, what changes on
    every node between two topologies."""
    from meshctl.mesh.checks import plan_warnings
    from meshctl.mesh.plan import plan_node
    from meshctl.mesh.render import plan_to_json, plan_to_table
    from meshctl.process import gc_paused

    src = Source(**source)
    if other is not None:
        _plan_diff(src, other, node, granularity, remotes, _path_state(path_state), output)
        return
    if node is None:
        raise InputError("--node", MISSING, "is required (or --diff OTHER.yaml for every node)")
    topo = src.load(node)
    if topo.node(node) is None:
        raise src.not_a_node(node)
    state = _path_state(path_state)
    with gc_paused():
        admitted = _load_remotes(topo, remotes)
        p = plan_node(topo, node, admitted, granularity=granularity, path_state=state)
    for w in plan_warnings(topo, p, admitted):
        click.echo(f"warning: {src.name}: {w}", err=True)
    if output == "json":
        click.echo(json.dumps(plan_to_json(p), indent=2))
    else:
        click.echo(plan_to_table(p))


def _path_state(path: str | None) -> PathState | None:
    """A --path-state file's probe results (None without the flag)."""
    from meshctl.backends.file import load_yaml
    from meshctl.mesh.records import parse_path_state

    if path is None:
        return None
    try:
        return parse_path_state(load_yaml(path), "path_state")
    except InputError as e:
        raise e.prefixed(f"{Path(path).name}: ") from None


def _plan_diff(src: Source, other: str, node: str | None, granularity: Granularity | None, remotes: tuple[str, ...],
               state: PathState | None, output: str) -> None:
    """`plan --diff OTHER.yaml`: every node's plan under the source topology against OTHER's
    (mesh.plandiff), each side with the remote clusters admitted against it."""
    from meshctl.backends.file import load_topology_checked
    from meshctl.mesh.plandiff import diff_json, diff_text, diff_topologies
    from meshctl.process import gc_paused

    if granularity is not None:
        raise InputError("--granularity", granularity, "cannot be combined with --diff: write it in the files")
    before = src.load(node)
    after, warnings = load_topology_checked(other)
    for w in warnings:
        click.echo(f"warning: {w}", err=True)
    if node is not None and before.node(node) is None and after.node(node) is None:
        raise InputError("--node", node, f"is not a node in {src.name} or {Path(other).name}")
    with gc_paused():
        diff = diff_topologies(before, after, remotes=(_load_remotes(before, remotes), _load_remotes(after, remotes)),
                               path_state=state, only=(node,) if node else ())
    click.echo(json.dumps(diff_json(diff), indent=2) if output == "json" else diff_text(diff))


@click.command()
@_source_options
@click.option("--granularity", type=click.Choice(GRANULARITIES), help="Override the file's granularity.")
@click.option("--remote", "remotes", multiple=True, type=click.Path(dir_okay=False),
              help="Another cluster's topology file (cluster mesh: each cluster an outer box); repeatable.")
@click.option("--level", default=None, metavar="location|node",
              help=f"location: a box per location, an edge per pair of locations; node: a box per node "
              f"(default: node up to {NODE_LEVEL_UP_TO} nodes, location above).")
@node_option(help="Draw this node and its peers, with the path to each.")
@click.option("--location", default=None, help="Draw this location's nodes, the other locations collapsed.")
@output_option(GRAPH_FORMATS, help="dot: Graphviz DOT; text: the same view as lines; json: the whole graph model.")
@click.option("--live", is_flag=True, help="Each pair on the rung its nodes use now, as they publish it "
              "(--backend etcd|kubernetes, or --lab): dashed where it fell back, red without a path.")
@click.option("--render", "render_to", type=click.Path(dir_okay=False),
              help="Render with Graphviz to this file (format from its suffix: svg, png, pdf).")
def graph(granularity: Granularity | None, remotes: tuple[str, ...], level: str | None, node: str | None,
          location: str | None, output: str, live: bool, render_to: str | None, **source: Any) -> None:
    """Print the mesh as Graphviz DOT (docs/graph.md): at a level, or one node or location; each
    pair on its planned rung (solid: WireGuard, dotted: the private rungs, ipip and vxlan labelled;
    dashed: a location's leader to its members), pairs counted per pair of locations where one
    edge each would not be readable."""
    from dataclasses import replace

    from meshctl.mesh.graph import check_view, graph_model, model_dot, model_text, with_leader_notes, with_seen
    from meshctl.process import gc_paused

    if render_to and output != "dot":
        raise InputError("--render", render_to, f"draws DOT: leave out -o {output}")
    src = Source(**source)
    topo = src.load()
    if granularity:
        topo = replace(topo, mesh=replace(topo.mesh, granularity=granularity))
    with gc_paused():
        model = graph_model(topo, _load_remotes(topo, remotes, src.remote_topologies()))
        if node is not None and node in src.pending:
            raise src.not_a_node(node)
        check_view(model, level, node, location)
        if live:
            model = with_leader_notes(with_seen(model, src.seen()), src.leaders)
        if output == "json":
            click.echo(json.dumps(model.to_json(), indent=2))
            return
        if output == "text":
            click.echo(model_text(model, level, node, location), nl=False)
            return
        dot = model_dot(model, level, node, location)
    if not render_to:
        click.echo(dot, nl=False)
        return
    _render(dot, render_to)


def _render(dot: str, path: str) -> None:
    """Graphviz's `dot` draws `dot` to `path`, in the format of its suffix (default svg)."""
    import shutil
    import subprocess

    if shutil.which("dot") is None:
        raise MeshError("--render needs Graphviz's `dot` (apt-get install graphviz)")
    fmt = Path(path).suffix.lstrip(".") or "svg"
    p = subprocess.run(["dot", f"-T{fmt}", "-o", path], input=dot, text=True, capture_output=True)
    if p.returncode != 0:
        raise MeshError(f"dot -T{fmt}: {p.stderr.strip()}")
    click.echo(f"wrote {path}")


def _cidrs(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[IPNetwork, ...]:
    from meshctl.mesh import fields

    return fields.cidr_list(value, "--allowed-ips") if value else ()


@click.command()
@_source_options
@click.argument("kind", type=click.Choice(["node", "peer"]))
@click.argument("name")
@output_option(SHOWCONF_FORMATS,
               help="wireguard: what `wg setconf` reads; wg-quick: with Address lines; json, yaml.")
@click.option("--as-peer", is_flag=True, help="Print NAME as a peer of others (with -o yaml|json: a Peer "
              "resource another cluster can apply).")
@click.option("--allowed-ips", default=None, callback=_cidrs,
              help="With --as-peer: comma-separated CIDRs added to the peer's allowed IPs (e.g. the service CIDR).")
@click.option("--api-version", default="meshctl.io/v1alpha1", show_default=True,
              type=click.Choice(["meshctl.io/v1alpha1", "kilo.squat.ai/v1alpha1"]),
              help="With --as-peer -o yaml|json: the Peer resource's group.")
def showconf(kind: str, name: str, output: str, as_peer: bool, allowed_ips: tuple[IPNetwork, ...], api_version: str,
             **source: Any) -> None:
    """Print the WireGuard config of a node, or the config a peer uses to join the mesh; with
    --as-peer, the node or peer as others must know it (Kilo's `kgctl showconf`)."""
    import yaml

    from meshctl.cli.psk import with_preshared_keys
    from meshctl.mesh.checks import plan_warnings
    from meshctl.mesh.plan import plan_node
    from meshctl.mesh.render import (
        conf_dict,
        conf_text,
        node_as_peer,
        node_conf,
        peer_as_peer,
        peer_conf,
        peer_resource,
        peer_text,
    )
    from meshctl.process import gc_paused

    src = Source(**source)
    topo = src.load(name if kind == "node" else None)
    if kind == "node" and topo.node(name) is None:
        raise src.not_a_node(name, "node")
    if allowed_ips and not as_peer:
        raise InputError("--allowed-ips", ",".join(map(str, allowed_ips)), "needs --as-peer")
    if as_peer:
        p = node_as_peer(topo, name, allowed_ips) if kind == "node" else peer_as_peer(topo, name, allowed_ips)
        if output in ("json", "yaml"):
            # Another cluster's Peer: named after this cluster and the segment leader, so it can
            # never read as one of that cluster's nodes, and every member of a segment gives one object.
            res = peer_resource(p, api_version, f"{topo.cluster.name}-{p.name}" if kind == "node" else None)
            click.echo(json.dumps(res, indent=2) if output == "json" else yaml.safe_dump(res, sort_keys=False),
                       nl=output == "json")
        else:
            click.echo(peer_text(p), nl=False)
        return
    with gc_paused():
        planned = plan_node(topo, name) if kind == "node" else None
        conf = node_conf(topo, planned) if planned is not None else with_preshared_keys(peer_conf(topo, name))
    for w in plan_warnings(topo, planned) if planned is not None else ():
        click.echo(f"warning: {src.name}: {w}", err=True)
    if output == "json":
        click.echo(json.dumps(conf_dict(conf), indent=2))
    elif output == "yaml":
        click.echo(yaml.safe_dump(conf_dict(conf), sort_keys=False), nl=False)
    else:
        click.echo(conf_text(conf, output), nl=False)

