# SPDX-License-Identifier: Apache-2.0
"""`meshctl agent`'s address flags take one value per IP family, comma-separated
(`--force-internal-ip 10.0.0.4/24,fd10::4/64`, `--endpoint`, `--internal-cidr`); a bad one is one
line naming the flag (and the item) and its value, exit 2. Parsed by the real click command up to
`run_agent`, which is swapped for a function that keeps the AgentConfig."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
from click.testing import CliRunner

from meshctl.agent.config import AgentConfig
from meshctl.cli import main
from meshctl.mesh.model import Endpoint
from meshctl.node.discovery import discover_endpoints

BASE = ["agent", "--node=n1", "--pod-cidr=10.42.1.0/24,fd42:1::/64", "--backend=file", "-f", "/nonexistent.yaml"]
IF = ipaddress.ip_interface
N = ipaddress.ip_network


def parse(monkeypatch: pytest.MonkeyPatch, extra: list[str]) -> tuple[Any, AgentConfig | None]:
    import meshctl.agent.run as run

    got: list[AgentConfig] = []
    monkeypatch.setattr(run, "run_agent", got.append)
    res = CliRunner().invoke(main, [*BASE, *extra], catch_exceptions=False)
    return res, (got[0] if got else None)


@pytest.mark.parametrize(("case", "extra", "field", "want"), [
    ("two internal addresses", ["--force-internal-ip=10.0.0.4/24,fd10::4/64"], "force_internal_ip",
     (IF("10.0.0.4/24"), IF("fd10::4/64"))),
    ("an IPv6 internal address alone", ["--force-internal-ip", "fd10::4/64"], "force_internal_ip", (IF("fd10::4/64"),)),
    ("no internal address", [], "force_internal_ip", ()),
    ("a CIDR per family", ["--internal-cidr=fd10::/48, 10.0.0.0/8"], "internal_cidr",
     (N("fd10::/48"), N("10.0.0.0/8"))),
    ("no CIDR", [], "internal_cidr", ()),
    ("two endpoints", ["--endpoint=203.0.113.4,[2001:db8::4]:51999"], "endpoint", "203.0.113.4,[2001:db8::4]:51999"),
])
def test_address_flags_take_one_value_per_family(monkeypatch, case, extra, field, want):
    res, cfg = parse(monkeypatch, extra)
    assert res.exit_code == 0, (case, res.output)
    assert cfg is not None and getattr(cfg, field) == want, case


def test_the_endpoint_flag_reaches_the_record_with_the_mesh_port():
    """The text `--endpoint` keeps is what discovery publishes: one endpoint per family, the
    mesh's port where an item names none."""
    assert discover_endpoints("203.0.113.4,[2001:db8::4]:51999", None, 51820) == (
        Endpoint("203.0.113.4", 51820), Endpoint("2001:db8::4", 51999))


@pytest.mark.parametrize(("case", "extra", "line"), [
    ("two IPv4 internal addresses", ["--force-internal-ip=10.0.0.4/24,10.0.9.4/24"],
     "--force-internal-ip[1]: '10.0.9.4/24' is a second IPv4 internal address (after 10.0.0.4/24): one per family"),
    ("a bad internal address", ["--force-internal-ip=10.0.0.4/24,fd10::4/129"],
     "--force-internal-ip[1]: 'fd10::4/129' is not an address with a prefix"),
    ("an internal address without its prefix", ["--force-internal-ip=10.0.0.4"],
     "--force-internal-ip[0]: '10.0.0.4' is not an address with a prefix"),
    ("two IPv6 endpoints", ["--endpoint=[2001:db8::4]:1,[2001:db8::5]:1"],
     "--endpoint[1]: '[2001:db8::5]:1' is a second IPv6 endpoint (after [2001:db8::4]:1): one per family"),
    ("an IPv6 endpoint without brackets", ["--endpoint=203.0.113.4,2001:db8::4:51820"],
     "--endpoint[1]: '2001:db8::4:51820'"),
    ("two IPv4 CIDRs", ["--internal-cidr=10.0.0.0/8,10.1.0.0/16"],
     "--internal-cidr[1]: '10.1.0.0/16' is a second IPv4 internal CIDR (after 10.0.0.0/8): one per family"),
    ("a bad CIDR", ["--internal-cidr=fd10::/48,10.0.0.0/33"], "--internal-cidr[1]: '10.0.0.0/33'"),
])
def test_a_bad_address_flag_is_one_line_and_exit_2(monkeypatch, case, extra, line):
    res, cfg = parse(monkeypatch, extra)
    assert res.exit_code == 2 and cfg is None, (case, res.output)
    assert res.stderr.startswith(f"error: {line}"), (case, res.stderr)
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.output, case


def _node(ann: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": "k1", "annotations": ann, "labels": {}}, "spec": {"podCIDR": "10.42.1.0/24"}}


def test_the_force_annotations_take_one_value_per_family_too():
    """--backend kubernetes: a Node's `meshctl.io/force-internal-ip` and `force-endpoint` stand in
    for the flags the agent was not given, with the same lists and the same one-line errors."""
    from meshctl.backends.kube.nodes import settings_for_agent
    from meshctl.errors import InputError

    got = settings_for_agent(_node({"meshctl.io/force-internal-ip": "10.0.0.4/24,fd10::4/64",
                                    "meshctl.io/force-endpoint": "203.0.113.4,[2001:db8::4]:51999"}))
    assert got["force_internal_ip"] == (IF("10.0.0.4/24"), IF("fd10::4/64"))
    assert discover_endpoints(got["endpoint"], None, 51820) == (Endpoint("203.0.113.4", 51820),
                                                                Endpoint("2001:db8::4", 51999))
    with pytest.raises(InputError) as e:
        settings_for_agent(_node({"meshctl.io/force-internal-ip": "fd10::4/64,fd10::5/64"}))
    assert str(e.value) == ("node k1: meshctl.io/force-internal-ip[1]: 'fd10::5/64' is a second IPv6 internal "
                            "address (after fd10::4/64): one per family")
