# SPDX-License-Identifier: Apache-2.0
"""`meshctl plan|graph|showconf --backend kubernetes`: the live cluster's Nodes and Peers, read
through a real (in-process) API server, give the same plan as a topology file with the same
records; `showconf node X --as-peer -o yaml` is a Peer a second cluster's API server accepts and
its backend admits."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from click.testing import CliRunner
from lightkube import Client, KubeConfig
from lightkube.config.models import Cluster, User
from lightkube.generic_resource import create_global_resource

from meshctl.backends.kube.backend import backend_from_options
from meshctl.cli import main
from meshctl.lab.rigs.kube_apiserver import ApiServer, load_manifests

from .helpers import MANIFESTS, create_node, node_obj, wg_key

NODES = [
    # name, pod CIDR, key seed, internal, endpoint, location
    ("n1", "10.42.1.0/24", 1, "10.0.1.1/24", "198.51.100.1:51820", "fsn"),
    ("n2", "10.42.2.0/24", 2, "10.0.1.2/24", "198.51.100.2:51820", "fsn"),
    ("n3", "10.42.3.0/24", 3, "10.0.2.3/24", "198.51.100.3:51820", "hel"),
]
Peer = create_global_resource("meshctl.io", "v1alpha1", "Peer", "peers")


def cli(*args: str):
    return CliRunner().invoke(main, list(args))


def fill(c: Client) -> None:
    for name, pod, seed, internal, ep, loc in NODES:
        create_node(c, node_obj(name, pod, key=seed, internal=internal, endpoint=ep,
                                labels={"topology.kubernetes.io/region": loc}))
    c.create(Peer.from_dict({"apiVersion": "meshctl.io/v1alpha1", "kind": "Peer", "metadata": {"name": "laptop"},
                             "spec": {"publicKey": wg_key(9), "allowedIPs": ["10.5.0.1/32"]}}))


def same_topology_file(tmp_path: Path) -> str:
    doc = {"cluster": {"name": "default", "id": 1}, "mesh": {"granularity": "location"},
           "nodes": [{"name": n, "pod_cidr": pod, "public_key": wg_key(seed), "internal_ip": internal, "endpoint": ep,
                      "location": loc} for n, pod, seed, internal, ep, loc in NODES],
           "peers": [{"name": "laptop", "public_key": wg_key(9), "allowed_ips": ["10.5.0.1/32"]}]}
    f = tmp_path / "topo.yaml"
    f.write_text(yaml.safe_dump(doc))
    return str(f)


def test_plan_from_the_api_equals_plan_from_the_file(api: ApiServer, kclient: Client, tmp_path: Path) -> None:
    fill(kclient)
    f = same_topology_file(tmp_path)
    for node in ("n1", "n2", "n3"):
        live = cli("plan", "--backend", "kubernetes", "--api-server", api.url, "--node", node, "-o", "json")
        assert live.exit_code == 0, live.output
        offline = cli("plan", "-f", f, "--node", node, "-o", "json")
        assert json.loads(live.stdout) == json.loads(offline.stdout)
    live = cli("graph", "--backend", "kubernetes", "--api-server", api.url)
    assert live.exit_code == 0 and live.stdout == cli("graph", "-f", f).stdout
    live = cli("showconf", "--backend", "kubernetes", "--api-server", api.url, "node", "n3")
    assert live.exit_code == 0 and live.stdout == cli("showconf", "-f", f, "node", "n3").stdout


def test_rejected_records_are_warnings_and_the_rest_plans(api: ApiServer, kclient: Client) -> None:
    fill(kclient)
    create_node(kclient, node_obj("thief", "10.42.9.0/24", key=1, internal="10.0.1.9/24"))  # n1's key
    r = cli("plan", "--backend", "kubernetes", "--api-server", api.url, "--node", "n1", "-o", "json")
    assert r.exit_code == 0, r.output
    assert f"warning: rejected thief: nodes[3].public_key: {wg_key(1)!r} is already the key of node n1" in r.stderr
    assert "thief" not in r.stdout
    # Live records get the file's warnings too: a node nobody can reach and a peer that never calls.
    create_node(kclient, node_obj("n4", "10.42.4.0/24", key=4))
    r = cli("plan", "--backend", "kubernetes", "--api-server", api.url, "--node", "n1", "-o", "json")
    assert ("warning: kubernetes: node n4 and peer laptop: neither has an endpoint, so the WireGuard tunnel between "
            "them can never start (give one an endpoint)") in r.stderr.splitlines()


def test_unreachable_api_is_one_line() -> None:
    r = cli("plan", "--backend", "kubernetes", "--api-server", "http://127.0.0.1:1", "--node", "n1")
    assert r.exit_code == 1 and len(r.stderr.strip().splitlines()) == 1, r.output
    assert r.stderr.startswith("error: kubernetes: ") and "Traceback" not in r.output


def test_as_peer_yaml_applies_in_a_second_cluster(api: ApiServer, kclient: Client) -> None:
    fill(kclient)
    r = cli("showconf", "--backend", "kubernetes", "--api-server", api.url, "node", "n2", "--as-peer", "-o", "yaml",
            "--allowed-ips", "10.43.0.0/16")
    assert r.exit_code == 0, r.output
    other = ApiServer("127.0.0.1", 0).start()
    try:
        load_manifests(other.store, [str(MANIFESTS / "00-namespace.yaml"), str(MANIFESTS / "01-crd-peers.yaml")])
        c2 = Client(KubeConfig.from_one(cluster=Cluster(server=other.url), user=User()), trust_env=False)
        c2.create(Peer.from_dict(yaml.safe_load(r.stdout)))
        create_node(c2, node_obj("m1", "10.52.1.0/24", key=21, endpoint="203.0.113.21:51820"))
        be = backend_from_options(None, other.url, "m1")
        try:
            st = be.snapshot()
        finally:
            be.close()
        assert st.ready and not st.rejections
        (peer,) = st.peers
        # n2 does not lead fsn: the Peer is fsn's segment under its leader n1, with the extra CIDR.
        assert peer.name == "default-n1" and peer.public_key == wg_key(1)
        assert str(peer.endpoint) == "198.51.100.1:51820"
        assert [str(a) for a in peer.allowed_ips] == ["10.0.1.1/32", "10.0.1.2/32", "10.4.0.1/32", "10.42.1.0/24",
                                                      "10.42.2.0/24", "10.43.0.0/16"]
        # ... and the second cluster's node plans a WireGuard peer to it.
        plan = json.loads(cli("plan", "--backend", "kubernetes", "--api-server", other.url, "--node", "m1",
                              "-o", "json").stdout)
        assert [(p["name"], p["kind"], p["endpoint"]) for p in plan["peers"]] == \
            [("default-n1", "peer", "198.51.100.1:51820")]
        c2._client._client.close()
    finally:
        other.stop()


def test_mesh_set_writes_the_configmap_and_mesh_get_reads_it(api: ApiServer, kclient: Client, tmp_path: Path) -> None:
    from lightkube.resources.core_v1 import ConfigMap

    fill(kclient)
    f = same_topology_file(tmp_path)
    other = yaml.safe_load(Path(f).read_text())
    other["mesh"] = {"granularity": "full", "port": 51999}
    g = tmp_path / "full.yaml"
    g.write_text(yaml.safe_dump(other))
    live = ("--backend", "kubernetes", "--api-server", api.url)
    dry = cli("mesh", "set", "--dry-run", "granularity=full", "port=51999", *live, "-o", "json")
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.stdout) == json.loads(cli("plan", "-f", f, "--diff", str(g), "-o", "json").stdout)
    assert json.loads(cli("mesh", "get", *live, "-o", "json").stdout)["granularity"] == "location"  # nothing written
    r = cli("mesh", "set", "granularity=full", "port=51999", *live)
    assert r.exit_code == 0 and r.stdout.splitlines()[-1] == "wrote configmap meshctl/meshctl", r.output
    assert kclient.get(ConfigMap, "meshctl", namespace="meshctl").data == {"granularity": "full", "port": "51999"}
    got = json.loads(cli("mesh", "get", *live, "-o", "json").stdout)
    assert (got["granularity"], got["port"], got["intra_subnet"]) == ("full", 51999, "auto")
    r = cli("mesh", "set", "intra_subnet=vxlan", *live)  # a second write merges into the ConfigMap
    assert r.exit_code == 0, r.output
    assert kclient.get(ConfigMap, "meshctl", namespace="meshctl").data == {
        "granularity": "full", "port": "51999", "intra_subnet": "vxlan"}
    assert cli("mesh", "set", "granularity=full", "--lab", "x", *live).stderr == (
        "error: --lab: 'x' reads a lab's etcd: leave out --backend kubernetes\n")
