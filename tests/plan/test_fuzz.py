# SPDX-License-Identifier: Apache-2.0
"""Fuzzing every door bad input comes through: topology files (random bytes, random mutations of
valid files, through the CLI as a person runs it), etcd records and Kubernetes objects (through the
backends' own parsing and admission). The promise: an error line or a rejection, never a traceback."""

from __future__ import annotations

import copy
import json
import tempfile
import threading
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshctl.backends.etcd import EtcdBackend, node_key, peer_key
from meshctl.backends.kube.nodes import parse_kube_node
from meshctl.backends.kube.peers import parse_peer_object
from meshctl.cli import main
from meshctl.errors import InputError
from meshctl.etcd.client import Event, KeyValue
from meshctl.mesh.admit import admit_nodes
from meshctl.mesh.model import Cluster
from meshctl.mesh.records import node_to_record

from .fixtures import CROSS_TWO_SUBNETS, KILO_CLASSIC, topo

VALID = [KILO_CLASSIC, CROSS_TWO_SUBNETS]
FUZZ = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# Values a field may be replaced with: every YAML type, and strings that look almost right.
TRICKY = ["10.0.0.1/33", "10.0.0.0/8", "::/0", "[::1]:51820", "a:b:c", "host", "host:", ":1", "10.2.1.0/24", "²",
          "٣", "1e9", "0x10", "-1", "65536", "true", "~", "AAAA=", "=" * 44, "fe80::1%eth0/64", "10.0.0.1/32",
          "1.2.3.4:0", "1.2.3.4:²", "x" * 300]
strings = st.one_of(st.text(max_size=30), st.text("0123456789²³٣१.:/", min_size=1, max_size=6),
                    st.sampled_from(TRICKY))
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True), strings)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                      max_leaves=6)


def paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path into a document (keys of mappings, indexes of lists)."""
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += paths(v, (*prefix, i))
    return out


@st.composite
def mutated(draw: Any, base: Any = None) -> Any:
    """A valid document with one to three fields replaced, deleted or added."""
    doc = copy.deepcopy(base if base is not None else draw(st.sampled_from(VALID)))
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(paths(doc)))
        if not where:
            doc = draw(values) if draw(st.integers(0, 9)) == 0 else doc
            continue
        parent = doc
        for p in where[:-1]:
            parent = parent[p]
        op = draw(st.sampled_from(["replace", "delete", "add"]))
        if op == "replace":
            parent[where[-1]] = draw(values)
        elif op == "delete":
            del parent[where[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(max_size=8))] = draw(values)
        else:
            parent.append(draw(values))
    return doc


def plan_cli(data: bytes, *extra: str) -> None:
    with tempfile.TemporaryDirectory(prefix="k8fuzz") as d:
        f = Path(d) / "topo.yaml"
        f.write_bytes(data)
        r = CliRunner().invoke(main, ["plan", "-f", str(f), "--node", "a", *extra])
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert "Traceback" not in r.output
    assert r.exit_code in (0, 2), (r.exit_code, r.output)
    err = [x for x in r.stderr.splitlines() if not x.startswith("warning: ")]
    if r.exit_code == 2:
        assert len(err) == 1 and err[0].startswith("error: "), r.stderr
    elif "-o" in extra:
        json.loads(r.stdout)


@FUZZ
@given(st.binary(max_size=400))
def test_random_bytes_to_plan(data: bytes) -> None:
    plan_cli(data)


@FUZZ
@given(mutated())
def test_mutated_files_to_plan(doc: Any) -> None:
    plan_cli(yaml.safe_dump(doc, allow_unicode=True).encode(), "-o", "json")


@FUZZ
@given(st.sampled_from(VALID), st.data())
def test_mutated_yaml_text_to_plan(doc: Any, data: Any) -> None:
    text = bytearray(yaml.safe_dump(doc).encode())
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(text) - 1))
        op = data.draw(st.sampled_from(["flip", "insert", "delete"]))
        if op == "flip":
            text[i] = data.draw(st.integers(0, 255))
        elif op == "insert":
            text[i:i] = data.draw(st.binary(min_size=1, max_size=8))
        else:
            del text[i:i + data.draw(st.integers(1, 8))]
    plan_cli(bytes(text))


# --- records ------------------------------------------------------------------------------------

CLUSTER = Cluster("k8fuzz", 7)
_lock = threading.Lock()


def _records() -> list[dict[str, Any]]:
    return [node_to_record(n) for n in topo(KILO_CLASSIC).nodes]


@FUZZ
@given(st.data())
def test_etcd_records_to_admission(data: Any) -> None:
    """Records as etcd holds them (JSON bytes, some mutated, some not JSON at all) through the etcd
    backend's parsing and the agent's admission: bad ones become rejections, the rest are admitted."""
    recs = _records()
    backend = EtcdBackend(client=None, cluster=CLUSTER)  # type: ignore[arg-type]  # no store is read here
    events = []
    bad: set[str] = set()
    for i, rec in enumerate(recs):
        how = data.draw(st.sampled_from(["keep", "keep", "mutate", "bytes"]))
        if how == "mutate":
            value = json.dumps(data.draw(mutated(rec)), default=str).encode()
        elif how == "bytes":
            value = data.draw(st.binary(max_size=80))
        else:
            value = json.dumps(rec).encode()
        if how != "keep":
            bad.add(rec["name"])
        events.append(Event("PUT", KeyValue(node_key(CLUSTER.name, rec["name"]), value, i + 1, i + 1)))
    peer = data.draw(mutated(KILO_CLASSIC["peers"][0]))
    events.append(Event("PUT", KeyValue(peer_key(CLUSTER.name, "p1"), json.dumps(peer, default=str).encode(), 9, 9)))
    backend._apply(10, events)
    snap = backend.snapshot()
    admitted, rejected = admit_nodes(list(snap.nodes), snap.mesh.subnet)
    names = {n.name for n in admitted}
    # Every untouched record is admitted (the valid ones do not clash with each other).
    assert {r["name"] for r in recs} - bad <= names | {n.name for n in snap.nodes}
    for r in [*snap.rejections, *rejected]:
        assert "\n" not in r.reason and r.reason


@settings(FUZZ, max_examples=1500)
@given(st.dictionaries(st.sampled_from([
    "meshctl.io/public-key", "meshctl.io/last-seen", "meshctl.io/endpoint", "meshctl.io/internal-ip",
    "meshctl.io/force-endpoint", "meshctl.io/force-internal-ip", "meshctl.io/location", "meshctl.io/leader",
    "meshctl.io/persistent-keepalive", "meshctl.io/allowed-location-ips", "meshctl.io/wireguard-ip",
    "meshctl.io/granularity", "kilo.squat.ai/force-endpoint", "kilo.squat.ai/location",
    "kilo.squat.ai/persistent-keepalive", "kilo.squat.ai/leader"]), strings),
    st.one_of(st.just("10.2.1.0/24"), st.none(), strings))
def test_kubernetes_nodes_to_records(ann: dict[str, str], pod_cidr: str | None) -> None:
    ann.setdefault("meshctl.io/public-key", KILO_CLASSIC["nodes"][0]["public_key"])
    ann.setdefault("meshctl.io/last-seen", "1700000000")
    obj = {"metadata": {"name": "n1", "annotations": ann}, "spec": {"podCIDR": pod_cidr}}
    try:
        parse_kube_node(obj, default_port=51820)
    except InputError as e:
        assert "\n" not in str(e)


@FUZZ
@given(mutated({"apiVersion": "meshctl.io/v1alpha1", "kind": "Peer", "metadata": {"name": "p1"},
                "spec": {"publicKey": KILO_CLASSIC["peers"][0]["public_key"], "allowedIPs": ["10.5.0.1/32"],
                         "endpoint": {"dnsOrIP": {"ip": "192.0.2.1"}, "port": 51820}, "persistentKeepalive": 10}}))
def test_kubernetes_peers_to_records(obj: Any) -> None:
    try:
        parse_peer_object(obj)
    except InputError as e:
        assert "\n" not in str(e)
