# SPDX-License-Identifier: Apache-2.0
"""`lab.cni` in a lab file: the values it takes, what it needs, and what it hands the agents."""

from __future__ import annotations

from typing import Any

import pytest

from meshctl.errors import InputError
from meshctl.lab.namespaces.cni_labs import CNI_LABS
from meshctl.lab.namespaces.spec import parse_lab

NODES = [{"name": "a1", "location": "a", "internal_ip": "10.10.1.11/24", "pod_cidr": "10.42.1.0/24"}]


def doc(**lab: Any) -> dict[str, Any]:
    return {"cluster": {"name": "default", "id": 1}, "nodes": NODES, "lab": lab}


@pytest.mark.parametrize(("lab", "args"), [
    pytest.param({"backend": "kubernetes", "cni": "calico"}, ("--cni", "calico"), id="calico"),
    pytest.param({"backend": "kubernetes", "cni": "cilium", "agent_args": ["--log-level", "debug"]},
                 ("--log-level", "debug", "--cni", "cilium"), id="cilium-after-agent-args"),
    pytest.param({"backend": "kubernetes"}, (), id="none"),
])
def test_lab_cni_reaches_the_agents(lab: dict[str, Any], args: tuple[str, ...]) -> None:
    spec = parse_lab(doc(**lab))
    assert spec.options.agent_args == args
    assert spec.options.cni == lab.get("cni", "")


@pytest.mark.parametrize(("lab", "line"), [
    pytest.param({"backend": "kubernetes", "cni": "weave"}, f"lab.cni: 'weave' is not one of {', '.join(CNI_LABS)}",
                 id="unknown"),
    pytest.param({"cni": "calico"}, "lab.cni: 'calico' needs lab.backend: kubernetes", id="etcd-backend"),
])
def test_lab_cni_refused(lab: dict[str, Any], line: str) -> None:
    with pytest.raises(InputError) as e:
        parse_lab(doc(**lab))
    assert str(e.value).startswith(line)
