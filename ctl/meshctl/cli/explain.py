# SPDX-License-Identifier: Apache-2.0
"""`meshctl explain SRC DST`: the thin shell around agent/explain.py. It reads the agents (the
local one at --addr, or with --lab every lab node's agent the path passes through), hands their
statuses to the pure builder, sends the one probe `--probe` asks for, and prints the answer.
A pair without a path is one line and exit status 1; a SRC or DST that is neither a pod address,
a node nor (with --lab) a lab pod is one line naming it and exit status 2."""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import sys
import time
from typing import TYPE_CHECKING

import click

from meshctl import defaults
from meshctl.cli import targets
from meshctl.cli.options import TEXT_FORMATS, lab_option, output_option
from meshctl.errors import InputError, MeshError
from meshctl.mesh import fields

if TYPE_CHECKING:  # the builder is imported when the command runs: `--help` imports no agent
    from meshctl.agent.explain import Explanation
    from meshctl.agent.status import AgentStatus

MAX_ROUNDS = 4  # agents asked for in turn, one further hop each


def check_end(value: str, arg: str, pods: dict[str, str] | None, lab_nodes: tuple[str, ...] | None) -> str:
    """`value` when it is a pod address (as the source's cluster sees it, or `cluster/address`: a
    pod's own address in a cluster with global ranges), a node (`node` or `cluster/node`) or, in a
    lab (`pods` and `lab_nodes` given), one of its pods or nodes; else InputError naming `arg`."""
    try:
        ipaddress.ip_address(value.rpartition("/")[2])
        if "/" in value:
            fields.cluster_name(value.rpartition("/")[0], arg)
        return value
    except ValueError:
        pass
    if pods is not None and value in pods:
        return value
    cluster, _, node = value.rpartition("/")
    try:
        fields.node_name(node, arg)
        if cluster:
            fields.cluster_name(cluster, arg)
    except InputError:
        raise InputError(arg, value, "is not a pod address, a node (node or cluster/node) or a pod of the lab"
                         if pods is not None else "is not a pod address or a node (node or cluster/node); "
                         "lab pod names need --lab") from None
    if lab_nodes is not None and not any(value in (n, n.split("/", 1)[1]) for n in lab_nodes):
        raise InputError(arg, value, "is not a node of the lab")
    return value


def _is_name(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
        return False
    except ValueError:
        return True


class Agents:
    """The agents this command may ask: the one at `addr` (outside a lab), or any node of the lab."""

    def __init__(self, addr: str, lab: str | None) -> None:
        self.addr, self.lab = addr, lab

    def where(self, node: str | None) -> targets.AgentTarget:
        """The agent of `node` (`cluster/node`; None: the first one to ask)."""
        if self.lab is None:
            return targets.AgentTarget(None, self.addr)
        loc = targets.lab("--lab")
        return loc.agent(self.lab, node or loc.nodes(self.lab)[0])

    def status(self, node: str | None) -> AgentStatus:
        from meshctl.agent.server import fetch_status
        from meshctl.agent.status import AgentStatus

        t = self.where(node)
        return AgentStatus.from_json(fetch_status(t.addr, t.netns, t.wait))


def build(agents: Agents, src: str, dst: str, addresses: dict[str, str]) -> tuple[Explanation, AgentStatus]:
    """Ask the source's agent, then each agent the answer wants, until it wants no more."""
    from meshctl.agent.explain import NoPath, absolute, cluster_of, explain, resolve

    named = agents.lab is not None and src not in addresses and _is_name(src)
    first = agents.status(src if named else None)  # a named source's own agent, else any to find it
    src_st = first
    if agents.lab is not None and not named:
        try:
            end = resolve(first, src, addresses.get(src))
        except NoPath:
            end = None  # the builder says why in its answer
        if end is not None and absolute(end.node, cluster_of(first)) != absolute(first.node, cluster_of(first)):
            src_st = agents.status(absolute(end.node, cluster_of(first)))
    others: dict[str, AgentStatus] = {}
    asked: set[str] = set()
    e = explain(src_st, src, dst, others, addresses)
    for _ in range(MAX_ROUNDS):
        new = [w for w in e.wants if w not in asked] if agents.lab is not None else []
        if not new:
            break
        for w in new:
            asked.add(w)
            try:
                others[w] = agents.status(w)
            except MeshError:
                continue  # that agent is away: its hop stays answered by its record
        e = explain(src_st, src, dst, others, addresses)
    return e, src_st


@click.command("explain")
@click.argument("src")
@click.argument("dst")
@click.option("--probe", is_flag=True, help="Send one probe now on the chosen rung and say whether it came back.")
@click.option("--addr", default=defaults.METRICS_ADDR, show_default=True,
              help="The source node's agent (its --metrics-addr); with --lab the lab's agents are asked.")
@lab_option("A lab: ask its agents along the path (pod names of the lab work too).")
@output_option(TEXT_FORMATS)
def explain_cmd(src: str, dst: str, probe: bool, addr: str, lab_name: str | None, output: str) -> None:
    """The path one packet takes from SRC to DST (pod addresses or nodes, `cluster/node` for
    another cluster's), hop by hop: interface, rung and why, probes, WireGuard peer, path MTU,
    fast-path entry and counters, read from the agents' own state. DST may be a Multi-Cluster
    Services name, <service>.<namespace>.svc.clusterset.local: the path to each of its endpoints."""
    from meshctl.agent.explain import absolute, cluster_of, format_explanation
    from meshctl.agent.server import fetch_probe

    pods = lab_nodes = None
    if lab_name is not None:
        loc = targets.lab("--lab")
        pods, lab_nodes = loc.pods(lab_name), loc.nodes(lab_name)
    src = check_end(src, "SRC", pods, lab_nodes)
    agents = Agents(addr, lab_name)
    if dst.lower().rstrip(".").endswith(".clusterset.local"):
        _explain_name(agents, src, dst, pods or {}, probe, output)
        return
    dst = check_end(dst, "DST", pods, lab_nodes)
    e, src_st = build(agents, src, dst, {k: v for k, v in (pods or {}).items() if k in (src, dst)})
    if probe and e.no_path is None and e.hops:
        t = agents.where(absolute(src_st.node, cluster_of(src_st)) if lab_name else None)
        e = dataclasses.replace(e, probe=fetch_probe(t.addr, e.hops[0].to, t.netns))
    if output == "json":
        click.echo(json.dumps(e.to_json(), indent=2, sort_keys=True))
    else:
        click.echo(format_explanation(e, time.time()))
    lost = e.probe is not None and e.probe.error is None and not e.probe.answered and e.probe.rung == e.hops[0].rung
    if e.no_path is not None or lost:
        sys.exit(1)



def _explain_name(agents: Agents, src: str, dst: str, pods: dict[str, str], probe: bool, output: str) -> None:
    """DST a clusterset.local name: the source cluster's ServiceImport of it (as the source's
    agent reports it), then the path to each endpoint its kube-proxy balances over. Exit 1 when
    the name is not imported there, has no endpoints, or an endpoint has no path."""
    from meshctl.agent.explain import format_explanation
    from meshctl.mesh.mcs import check_name

    ns, name = check_name(dst, "DST")
    first = agents.status(src if agents.lab is not None and src not in pods and _is_name(src) else None)
    remotes = first.summary.remotes if first.summary is not None else None
    cs = remotes.clusterset if remotes is not None else None
    imp = next((i for i in (cs.imports if cs is not None else ()) if (i.namespace, i.name) == (ns, name)), None)
    if imp is None:
        why = "it serves no Multi-Cluster Services" if cs is None else f"no ServiceImport {ns}/{name} there"
        raise MeshError(f"DST: {dst!r} is not imported in {first.node}'s cluster ({why})")
    eps = [(c, a) for c, addrs in sorted(imp.endpoints.items()) for a in addrs]
    head = (f"{dst}: ServiceImport {ns}/{name}, {imp.type} {', '.join(imp.ips) or '(headless)'}, "
            f"{len(eps)} endpoint(s): " + (", ".join(f"{c} {a}" for c, a in eps) or "none"))
    paths = []
    for _, a in eps:
        e, _ = build(agents, src, a, {k: v for k, v in pods.items() if k == src})
        paths.append(e)
    if output == "json":
        click.echo(json.dumps({"name": dst, "import": imp.to_json(), "paths": [e.to_json() for e in paths]},
                              indent=2, sort_keys=True))
    else:
        click.echo(head)
        for e in paths:
            click.echo(format_explanation(e, time.time()))
    if not eps or any(e.no_path is not None for e in paths):
        sys.exit(1)
