# SPDX-License-Identifier: Apache-2.0
"""`--cni calico|cilium`: the checks AgentConfig makes, and what the fast path does beside each CNI."""

from __future__ import annotations

from ipaddress import ip_network

import pytest

from meshctl.agent.config import AgentConfig, fastpath_off
from meshctl.errors import InputError
from meshctl.node.cni import CNI_MODES, FASTPATH_OFF


@pytest.mark.parametrize(("cni", "fastpath", "want"), [
    pytest.param("keep", True, None, id="keep-loads"),
    pytest.param("calico", True, None, id="calico-loads-on-cali-veths"),
    pytest.param("cilium", True, FASTPATH_OFF["cilium"], id="cilium-stays-off"),
    pytest.param("calico", False, "disabled", id="no-fastpath-says-disabled"),
])
def test_fastpath_off(cni: str, fastpath: bool, want: str | None) -> None:
    cfg = AgentConfig("a", backend="kubernetes", cni=cni, fastpath=fastpath).check()
    assert fastpath_off(cfg) == want


@pytest.mark.parametrize("cni", ["calico", "cilium"])
def test_ipam_modes_need_the_kubernetes_backend(cni: str) -> None:
    with pytest.raises(InputError) as e:
        AgentConfig("a", backend="etcd", etcd_endpoints=("https://x:2379",), pod_cidrs=(ip_network("10.42.0.0/24"),),
                    cni=cni).check()
    assert str(e.value).startswith(f"--cni: '{cni}'")
    assert "--backend kubernetes" in str(e.value)


def test_unknown_cni_names_the_value() -> None:
    with pytest.raises(InputError) as e:
        AgentConfig("a", backend="kubernetes", cni="weave").check()
    assert str(e.value) == f"--cni: 'weave' is not one of {', '.join(CNI_MODES)}"
    assert {"calico", "cilium"} <= set(CNI_MODES)
