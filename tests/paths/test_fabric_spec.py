# SPDX-License-Identifier: Apache-2.0
"""`lab.fabrics` and `meshctl lab fabric`: every bad input is one line naming the field and value."""

from __future__ import annotations

import copy

import pytest
from click.testing import CliRunner

from meshctl.cli import main
from meshctl.errors import InputError
from meshctl.lab.namespaces import fabric
from meshctl.lab.namespaces.spec import parse_lab
from meshctl.lab.namespaces.state import FabricState, LabState

from .conftest import FABRICS_DOC


def lab(fabrics) -> dict:
    d = copy.deepcopy(FABRICS_DOC)
    d["lab"]["fabrics"] = fabrics
    return d


def test_the_fabrics_of_the_shipped_lab() -> None:
    spec = parse_lab(FABRICS_DOC)
    kinds = {str(f.subnet): (f.kind, f.network) for f in spec.options.fabrics}
    assert kinds["10.30.2.0/24"] == ("vpc", "rack") and kinds["10.30.3.0/24"] == ("vpc", "rack")
    assert kinds["10.30.1.0/24"] == ("l2", "") and kinds["10.50.0.0/24"] == ("blackhole", "")
    assert str(fabric.fabric_of(spec.options.fabrics, spec.private_subnets()[0]).gateway).endswith(".1")


@pytest.mark.parametrize("fabrics, line", [
    ({"10.30.1.0/24": "mesh"}, "lab.fabrics.10.30.1.0/24.kind: 'mesh' is not one of l2, vpc, vpc-udp, hetzner, "
                                "blackhole"),
    ({"10.30.1.0/24": {"kind": "l2", "network": "x"}}, "lab.fabrics.10.30.1.0/24.network: 'x' is for routed kinds"),
    ({"10.30.1.0/24": {"kind": "vpc", "loss": 101}}, "lab.fabrics.10.30.1.0/24.loss: 101 is not a loss percentage"),
    ({"10.30.1.0/24": {"kind": "vpc", "speed": 1}}, "lab.fabrics.10.30.1.0/24.speed: is not a known field"),
    ({"10.30.9.0/24": "l2"}, "lab.fabrics: '10.30.9.0/24' is not the subnet of any node's internal_ip"),
    ({"10.30.1.1/24": "l2"}, "lab.fabrics: '10.30.1.1/24' has host bits set"),
    ({"10.30.0.0/16": "l2", "10.30.1.0/24": "l2"}, "lab.fabrics: '10.30.1.0/24' overlaps 10.30.0.0/16"),
])
def test_bad_fabrics_are_one_line(fabrics, line) -> None:
    with pytest.raises(InputError) as e:
        parse_lab(lab(fabrics))
    assert str(e.value).startswith(line), str(e.value)


def test_a_node_on_the_gateway_address_is_refused() -> None:
    d = lab({"10.30.1.0/24": "vpc"})
    d["nodes"][0]["internal_ip"] = "10.30.1.1/24"
    with pytest.raises(InputError, match=r"nodes.l1.internal_ip: '10.30.1.1' is the gateway of the vpc fabric"):
        parse_lab(d)


def test_lab_fabric_refuses_what_it_cannot_build(tmp_path) -> None:
    st = LabState(name="pbx", prefix="pbx-", dir=str(tmp_path),
                  fabrics={"10.30.1.0/24": FabricState(index=0, kind="l2", network="", loss=0, bridge="bpriv0",
                                                       router=None, addressing="l2")})
    for subnet, kind, loss, line in [
        ("10.30.9.0/24", "l2", 0, "SUBNET: '10.30.9.0/24' is not a private subnet of lab pbx (10.30.1.0/24)"),
        ("10.30.1.0/24", "cloud", 0, "KIND: 'cloud' is not one of"),
        ("10.30.1.0/24", "l2", 120, "--loss: 120 is not a loss percentage"),
        ("10.30.1.0/24", "hetzner", 0, "KIND: 'hetzner' cannot replace l2 addressing on a running fabric"),
    ]:
        with pytest.raises(InputError) as e:
            fabric.change(st, subnet, kind, loss)
        assert str(e.value).startswith(line), str(e.value)
    r = CliRunner().invoke(main, ["lab", "fabric", "10.30.1.0/24", "blackhole", "--lab", "pbnone"])
    assert r.exit_code != 0 and "Traceback" not in r.output + r.stderr
