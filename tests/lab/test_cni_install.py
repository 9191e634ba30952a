# SPDX-License-Identifier: Apache-2.0
"""`lab.cni: install`: the pods are made by the real bridge, host-local and portmap plugins from
the config each agent wrote (CNI ADD when a pod is made, DEL when it goes): addresses from
host-local within each node's pod CIDR, every pair reachable on its path, a hostPort through
portmap (its rules in the node's namespace only), and after `lab down` nothing of the plugins left
(IPAM state, veths, the host's /var/lib/cni). A config the plugins refuse fails the lab with the
plugin's own error."""

from __future__ import annotations

import ipaddress
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshctl.errors import MeshError
from meshctl.lab.namespaces import build, cni_install
from meshctl.lab.namespaces import check as labcheck
from meshctl.lab.namespaces import state as labstate
from meshctl.lab.namespaces.spec import parse_lab
from meshctl.lab.namespaces.state import LabState
from meshctl.lab.rigs import netns
from meshctl.node.cni import BRIDGE, CONF_NAME
from tests.names import unique

from .conftest import node_of, topo, wait_for

pytestmark = [pytest.mark.root, pytest.mark.slow]
HOST_CNI = Path("/var/lib/cni")


def _host_veths() -> set[str]:
    return {ln.split(":")[1].strip().split("@")[0] for ln in netns.run(None, ["ip", "-o", "link"]).stdout.splitlines()}


def _host_cni() -> set[str]:
    return {str(p) for p in HOST_CNI.rglob("*")} if HOST_CNI.exists() else set()


@pytest.fixture(scope="module")
def host_before() -> tuple[set[str], set[str]]:
    return _host_veths(), _host_cni()


@pytest.fixture(scope="module")
def lab(host_before: tuple[set[str], set[str]]) -> Iterator[LabState]:
    prefix = unique("im") + "-"
    try:
        yield build.up(parse_lab(topo("location", cni="install", pods_per_node=2)), prefix=prefix)
    finally:
        build.down(labstate.lab_name(prefix))


def _pods_on_bridge(ns: str) -> set[str]:
    out = netns.run(ns, ["ip", "-o", "link", "show", "master", BRIDGE]).stdout
    return {ln.split(":")[1].strip().split("@")[0] for ln in out.splitlines()}


def test_pods_got_their_addresses_from_host_local_in_their_nodes_pod_cidr(lab: LabState) -> None:
    for _, n in lab.nodes():
        conf = json.loads((cni_install.conf_dir(n) / CONF_NAME).read_text())  # the agent's own file
        (bridge, portmap) = conf["plugins"]
        assert (bridge["type"], bridge["ipam"]["type"], portmap["type"]) == ("bridge", "host-local", "portmap")
        assert bridge["ipam"]["ranges"] == [[{"subnet": c} for c in n.pod_cidrs]] and "dataDir" not in bridge["ipam"]
        cidr = ipaddress.ip_network(n.pod_cidrs[0])
        assert len(n.pods) == 2 and all(ipaddress.ip_address(p.ip) in cidr for p in n.pods), n.pods
        # host-local's reservations, in the node's own dataDir: one file per pod, naming its container
        reserved = {f.name: f.read_text().split()[0] for f in (cni_install.data_dir(n) / conf["name"]).iterdir()
                    if f.name[0].isdigit()}
        assert reserved == {p.ip: cni_install.container_id(lab, p.netns) for p in n.pods}
        # the bridge plugin's veths, on its bridge, which holds the pod CIDR's gateway
        assert _pods_on_bridge(n.netns) == {p.host_if for p in n.pods}
        assert f"{cidr.network_address + 1}/{cidr.prefixlen}" in netns.run(n.netns, ["ip", "-o", "addr", "show",
                                                                                      BRIDGE]).stdout


def test_pods_reach_each_other_across_nodes_on_their_paths(lab: LabState) -> None:
    results = labcheck.check(lab, count=3)
    assert len(results) == 6
    for r in results:
        assert r.ok and r.path == r.expected, r


def test_a_host_port_reaches_its_pod_through_portmap(lab: LabState) -> None:
    a1 = node_of(lab, "a1")
    assert a1.internal_ip is not None
    url = f"http://{a1.internal_ip.split('/')[0]}:{cni_install.HOST_PORT}/"
    server = subprocess.Popen([*netns.exec_prefix(a1.pods[0].netns), "python3", "-m", "http.server",
                               str(cni_install.POD_PORT)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def get(ns: str) -> bool:
            r = subprocess.run([*netns.exec_prefix(ns), "curl", "-s", "-m", "2", "-o", "/dev/null", "-w",
                                "%{http_code}", url], capture_output=True, text=True)
            return r.stdout == "200"
        assert wait_for(lambda: get(node_of(lab, "a2").netns), timeout=10)  # a node of the subnet
        assert get(node_of(lab, "b1").pods[0].netns)  # a pod of another location, through the tunnel
    finally:
        server.kill()
        server.wait()
    cid = cni_install.container_id(lab, a1.pods[0].netns)
    assert cid in netns.run(a1.netns, ["iptables-save", "-t", "nat"]).stdout
    assert cid not in subprocess.run(["nft", "list", "ruleset"], capture_output=True, text=True).stdout


def test_a_removed_pod_is_deleted_by_the_plugins_and_a_new_one_added(lab: LabState) -> None:
    a2 = node_of(lab, "a2")
    gone = a2.pods[1]
    build.remove_pod(lab.name, "a2", gone.ip)
    leases = cni_install.data_dir(a2) / "meshctl"
    assert not (leases / gone.ip).exists()  # host-local released it
    assert gone.host_if not in _pods_on_bridge(a2.netns)
    new = build.add_pod(lab.name, "a2")
    assert (leases / new.ip).read_text().split()[0] == cni_install.container_id(lab, new.netns)
    r = subprocess.run([*netns.exec_prefix(new.netns), "ping", "-c", "2", "-W", "2", node_of(lab, "b1").pods[0].ip],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


def test_lab_down_leaves_nothing_of_the_plugins(lab: LabState, host_before: tuple[set[str], set[str]]) -> None:
    dirs = [cni_install.node_root(n) for _, n in lab.nodes()]
    assert all(d.exists() for d in dirs)
    problems = build.down(lab.name)
    assert problems == []
    assert not [d for d in dirs if d.exists()] and not netns.list_prefixed(lab.prefix)
    assert (_host_veths(), _host_cni()) == host_before


def test_a_config_the_plugins_refuse_fails_the_lab_with_their_error() -> None:
    """A /30 pod CIDR: host-local has one address for pods (the bridge takes .1), the second pod
    is refused; lab up fails naming the plugin and its message, and removes what it built."""
    nodes = [{"name": "a1", "location": "loc-a", "internal_ip": "10.10.1.11/24", "pod_cidr": "10.42.1.0/30"}]
    prefix = unique("im") + "-"
    with pytest.raises(MeshError) as e:
        build.up(parse_lab(topo("location", nodes=nodes, cni="install", pods_per_node=2)), prefix=prefix)
    assert str(e.value).startswith(f"CNI ADD of pod {prefix}a1-p1 on node a1: plugin bridge: failed to allocate "
                                   "for range 0: no IP addresses available in range set: 10.42.1.1-10.42.1.2"), e.value
    assert not netns.list_prefixed(prefix) and labstate.load(labstate.lab_name(prefix)) is None
