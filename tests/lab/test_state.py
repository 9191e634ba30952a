# SPDX-License-Identifier: Apache-2.0
"""The lab state file as typed dataclasses: every shape a lab writes (a namespace lab, a lab in one
VM, a VM-per-node lab, the one-node state in a node's VM) reads back, and what is saved is the same
JSON object with the same keys. No namespace is made here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshctl.lab.namespaces import state as labstate
from meshctl.lab.namespaces.state import LabState, from_json, to_json

NODE = {
    "name": "a1", "netns": "ml-a1", "location": "loc-a", "pod_cidrs": ["10.42.1.0/24"], "internal_ip": "10.10.1.11/24",
    "public_ip": "198.51.100.10", "leader": True, "persistent_keepalive": 0, "allowed_location_ips": [],
    "private_interface": "priv", "public_interface": "pub", "metrics_addr": "127.0.0.1:9736",
    "dir": "/run/meshctl-lab/ml/nodes/a1", "state_dir": "/run/meshctl-lab/ml/nodes/a1/state",
    "wg_run_dir": "/run/meshctl-lab/ml/nodes/a1/wg", "pid": 4242, "agent_args": [],
    "pods": [{"netns": "ml-a1-p0", "ip": "10.42.1.2", "host_if": "pod0"}],
    "nat": {"kind": "cone", "router_ns": "ml-a1-nat", "table": "ml-nat", "inside_ip": "192.168.1.2",
            "router_ip": "192.168.1.1", "public_ip": "198.51.100.10", "port": 20000, "rebinds": 1},
}
VM_NODE = dict(NODE, name="a2", netns=None, nat=None, pid=None, kernel="5.10", status_netns="ml-etcd-default",
               guest_pid=77, nics=[{"tap": "n1u", "mac": "52:54:00:6d:01:00", "name": "pub"}],
               vm={"name": "ml-a2", "series": "5.10", "version": "5.10.0-35-amd64", "workdir": "/run/meshctl-vm/ml/a2",
                   "pid": 100, "qemu_pid": 101, "accel": "tcg", "boot_seconds": 40.5, "cpus": 1, "memory": "1G",
                   "netns": "ml-fab", "nics": [["n1u", "52:54:00:6d:01:00"]]})
ETCD = {"endpoints": ["https://198.51.100.250:2379"], "ca": "/ca.pem", "cert": "/admin.pem", "key": "/admin-key.pem",
        "user": "root", "password_file": "/admin.password", "netns": "ml-etcd-default", "pid": 99,
        "identities": {"a1": {"user": "node:a1", "password_file": "/a1.pw", "cert": "/a1.pem", "key": "/a1.key"}},
        "server": {"name": "ml-default", "data_dir": "/d", "host": "198.51.100.250", "port": 2379, "cert": "/s.pem",
                   "key": "/s.key", "log": "/etcd.log"}}
NAMESPACE_LAB = {
    "name": "ml", "prefix": "ml-", "source": "/labs/default.yaml", "created": 1764600000.5, "namespaces": ["ml-fab"],
    "pids": {"etcd/default": 99, "agent/default/a1": 4242}, "pin_root": "/sys/fs/bpf/ml-lab",
    "dir": "/run/meshctl-lab/ml", "fastpath": True, "lease_ttl": 5, "agent_args": [], "vms": False,
    "fabrics": {"10.10.1.0/24": {"index": 0, "kind": "vpc", "network": "n1", "loss": 0, "bridge": "bpriv0",
                                 "router": "ml-rt0", "addressing": "vpc"}},
    "clusters": [{"name": "default", "id": 1, "etcd": ETCD, "port": 51820, "mesh": {"granularity": "location"},
                  "nodes": [NODE, VM_NODE], "clustermesh_dir": "/cm/default",
                  "kube": {"url": "http://198.51.100.240:6443", "kubeconfig": "/kc", "netns": "ml-kube-default",
                           "pid": 98}}],
}
LAB_IN_A_VM = {"name": "mk", "prefix": "mk-", "source": "/l.yaml", "kernel": "6.1", "dir": "/run/meshctl-lab/mk",
               "vm": VM_NODE["vm"], "timings": {"boot_s": 40.1, "lab_s": 90.2, "total_s": 131.0}}
GUEST = {"name": "ml", "prefix": "ml-", "dir": "/run/meshctl-lab/ml", "in_vm": {"node": "a2", "series": "5.10"},
         "clusters": [{"name": "default", "id": 1, "port": 51820, "mesh": {}, "clustermesh_dir": None,
                       "etcd": {k: v for k, v in ETCD.items() if k not in ("pid", "server")} | {"netns": None},
                       "nodes": [dict(VM_NODE, vm=None, status_netns=None)]}]}


def holds(out: object, doc: object) -> bool:
    """Every key of `doc`, at any depth, is in `out` with the same value (`out` may hold more)."""
    if isinstance(doc, dict):
        return isinstance(out, dict) and all(k in out and holds(out[k], v) for k, v in doc.items())
    if isinstance(doc, list):
        return isinstance(out, list) and len(out) == len(doc) and all(map(holds, out, doc))
    return out == doc


@pytest.mark.parametrize("doc", [NAMESPACE_LAB, LAB_IN_A_VM, GUEST], ids=["namespaces", "in-a-vm", "guest"])
def test_every_shape_reads_back_and_saves_the_same_keys(doc) -> None:
    st = from_json(LabState, json.loads(json.dumps(doc)))
    out = to_json(st)
    assert holds(out, doc)  # every key written before is there, with its value
    assert from_json(LabState, out) == st


def test_attributes_of_a_namespace_lab() -> None:
    st = from_json(LabState, NAMESPACE_LAB)
    c, a1 = st.lookup("default/a1")
    assert c is st.cluster("default") and a1.pods[0].index == 0 and a1.nat and a1.nat.port == 20000
    assert a1.dial_netns == "ml-a1" and a1.agent_started
    _, a2 = st.lookup("a2")
    assert a2.vm and a2.vm.qemu_pid == 101 and a2.nics[0].tap == "n1u"
    assert a2.dial_netns == "ml-etcd-default" and a2.agent_started  # its guest's agent
    assert c.etcd.server and c.etcd.server.port == 2379 and c.etcd.identities["a1"].user == "node:a1"
    assert c.kube and c.kube.pid == 98 and st.fabrics["10.10.1.0/24"].router == "ml-rt0"
    with pytest.raises(labstate.MeshError, match="lab ml has no node zz"):
        st.lookup("zz")


def test_save_and_load_through_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(labstate, "LAB_ROOT", tmp_path)
    st = from_json(LabState, NAMESPACE_LAB)
    labstate.save(st)
    assert json.loads(labstate.state_path("ml").read_text())["clusters"][0]["nodes"][0]["nat"]["port"] == 20000
    assert labstate.load("ml") == st and labstate.labs_up() == ["ml"]
    assert labstate.find_node(None, "a2") == ("ml-etcd-default", "127.0.0.1:9736")
    labstate.state_path("ml").write_text('{"name": 1}')  # not a lab state: as if no lab were up
    assert labstate.load("ml") is None
