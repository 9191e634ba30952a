# SPDX-License-Identifier: Apache-2.0
"""Peer pre-shared keys by Secret reference, and a real kube-apiserver (tests/kubernetes.py) pruning
and validating Peers against the CRD's openAPIV3Schema."""

from __future__ import annotations

import base64
import json

import pytest
import requests
from click.testing import CliRunner
from lightkube import Client

from meshctl.backends.kube.backend import backend_from_options
from meshctl.backends.kube.peers import parse_peer_object
from meshctl.cli import main
from meshctl.errors import InputError
from meshctl.mesh.model import KeyRef
from tests.kubernetes import Api

from .helpers import create_node, node_obj, wg_key

PSK = base64.b64encode(bytes(range(32))).decode()


def post(api: Api, path: str, obj: dict) -> requests.Response:
    """POST as the admin, the answer as it comes (ControlPlane.request raises on an error)."""
    with api.cp.http() as s:
        return s.post(api.url + path, json=obj, timeout=10)


def peer(spec: dict, name: str = "laptop") -> dict:
    return {"apiVersion": "meshctl.io/v1alpha1", "kind": "Peer", "metadata": {"name": name}, "spec": spec}


BASE = {"publicKey": wg_key(9), "allowedIPs": ["10.5.0.1/32"]}
PEERS = "/apis/meshctl.io/v1alpha1/peers"


def test_unknown_fields_are_pruned(api: Api) -> None:
    r = post(api, PEERS, {**peer({**BASE, "colour": "red", "endpoint": {"dnsOrIP": {"ip": "192.0.2.1", "x": 1},
                                                                          "port": 51820}}), "status": {"a": 1}})
    assert r.status_code == 201, r.text
    spec = r.json()["spec"]
    assert "colour" not in spec and spec["endpoint"] == {"dnsOrIP": {"ip": "192.0.2.1"}, "port": 51820}
    assert "status" not in r.json()
    # ... and the server says so (fieldValidation's default, Warn), naming each field it dropped
    warning = r.headers.get("Warning", "").replace('\\"', '"')  # quoted inside the header's own quotes
    for f in ("spec.colour", "spec.endpoint.dnsOrIP.x", "status"):
        assert f'unknown field "{f}"' in warning, warning


@pytest.mark.parametrize("spec, message", [
    ({**BASE, "persistentKeepalive": "25"}, 'spec.persistentKeepalive: Invalid value: "string": '
     'spec.persistentKeepalive in body must be of type integer: "string"'),
    ({"allowedIPs": ["10.5.0.1/32"]}, "spec.publicKey: Required value"),
    ({**BASE, "allowedIPs": []}, "spec.allowedIPs: Invalid value: 0: spec.allowedIPs in body should have at least 1 "
     "items"),
    ({**BASE, "endpoint": {"dnsOrIP": {"ip": "192.0.2.1"}, "port": 70000}}, "spec.endpoint.port: Invalid value: "
     "70000: spec.endpoint.port in body should be less than or equal to 65535"),
    ({**BASE, "presharedKey": PSK}, 'spec.presharedKey: Invalid value: "string": spec.presharedKey in body must be '
     'of type object: "string"'),
    ({**BASE, "presharedKey": {"secretKeyRef": {"name": "psk"}}}, "spec.presharedKey.secretKeyRef.key: Required "
     "value"),
])
def test_schema_violations_are_422_invalid(api: Api, spec: dict, message: str) -> None:
    r = post(api, PEERS, peer(spec))
    assert r.status_code == 422, r.text
    status = r.json()
    assert status["reason"] == "Invalid" and status["message"] == f'Peer.meshctl.io "laptop" is invalid: {message}'
    assert PSK not in r.text


def test_a_key_in_the_spec_is_refused_and_never_repeated() -> None:
    with pytest.raises(InputError) as e:
        parse_peer_object(peer({**BASE, "presharedKey": PSK}))
    assert PSK not in str(e.value) and "keep it in a Secret" in str(e.value)
    p = parse_peer_object(peer({**BASE, "presharedKey": {"secretKeyRef": {"name": "psk", "key": "laptop"}}}))
    assert p.preshared_key == KeyRef("secret", "psk", "laptop")


def test_secret_reference_reaches_the_backend_and_the_plan(api: Api, kclient: Client) -> None:
    from lightkube.generic_resource import create_global_resource
    from lightkube.resources.core_v1 import Secret

    Peer = create_global_resource("meshctl.io", "v1alpha1", "Peer", "peers")
    kclient.create(Peer.from_dict(peer({**BASE, "presharedKey": {"secretKeyRef": {"name": "psk", "key": "laptop"}}})))
    kclient.create(Secret.from_dict({"metadata": {"name": "psk", "namespace": "meshctl"},
                                     "data": {"laptop": base64.b64encode(PSK.encode()).decode()}}))
    create_node(kclient, node_obj("n1", "10.42.1.0/24", key=1, endpoint="198.51.100.1:51820"))
    be = backend_from_options(api.kubeconfig, "n1")
    try:
        (p,) = be.snapshot().peers
        assert p.preshared_key == KeyRef("secret", "psk", "laptop")
        from meshctl.node.wireguard.psk import SecretSource, read_key

        assert isinstance(be, SecretSource) and read_key(p.preshared_key, be) == PSK
    finally:
        be.close()
    r = CliRunner().invoke(main, ["plan", "--kubeconfig", api.kubeconfig, "--node", "n1",
                                  "-o", "json"])
    assert r.exit_code == 0, r.output
    (laptop,) = [x for x in json.loads(r.stdout)["peers"] if x["name"] == "laptop"]
    assert laptop["preshared_key"] == "secret psk key laptop"
    conf = CliRunner().invoke(main, ["showconf", "--kubeconfig", api.kubeconfig, "node", "n1"])
    assert "# PresharedKey = <from secret psk key laptop, never printed>" in conf.stdout
    assert PSK not in r.stdout + conf.stdout
    y = CliRunner().invoke(main, ["showconf", "--kubeconfig", api.kubeconfig, "peer", "laptop",
                                  "--as-peer", "-o", "json"])
    assert json.loads(y.stdout)["spec"]["presharedKey"] == {"secretKeyRef": {"name": "psk", "key": "laptop"}}
