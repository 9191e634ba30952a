# SPDX-License-Identifier: Apache-2.0
"""The load-time feature probe: what it finds on this kernel, that its adjust_room probes can say
no, the settings each answer gives the compiler (the variants older kernels load), and that the
C header of those settings names the same ones."""

from __future__ import annotations

import re

import pytest

from meshctl.datapath import features
from meshctl.datapath.loader import bpf_dir


@pytest.fixture
def fresh(monkeypatch):
    """probe() is cached per process: start and end each test with a fresh one."""
    features.probe.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    features.probe.cache_clear()


@pytest.mark.root
def test_the_settings_follow_what_this_kernel_has(fresh):
    """Every kernel of the matrix (5.10 on) loads the programs; what it lacks of OPTIONAL is named
    and compiled out (this host's 6.18 lacks nothing)."""
    f = features.probe()
    assert f.missing() == [], f.as_dict()
    for name, macro in features.OPTIONAL.items():
        assert f"-D{macro}={int(f.has(name))}" in f.cflags()
    assert len(f.fallbacks()) == sum(not f.has(n) for n in features.OPTIONAL)


@pytest.mark.root
@pytest.mark.parametrize("name", sorted(features._ADJ_ROOM_PROBES))
def test_an_adjust_room_probe_says_no_to_a_flag_the_kernel_does_not_know(fresh, name):
    """On this host every flag is known (6.18); on 5.10 both probes say no, on 6.1 the decap one."""
    diff, flags = features._ADJ_ROOM_PROBES[name]
    assert features._probe_adjust_room(diff, flags) == features.probe().flags[name]
    assert not features._probe_adjust_room(diff, flags | (1 << 40)), "an unknown bit: EINVAL at run time"
    assert features._probe_adjust_room(diff, 0), "the same call without flags works on every kernel"


@pytest.mark.root
def test_without_optional_features_the_settings_and_fallbacks_say_so(fresh):
    fresh.setenv(features.WITHOUT_ENV, ",".join(features.OPTIONAL))
    f = features.probe()
    assert f.missing() == [], "each optional feature has a fallback: the programs still load"
    assert f.fallbacks() == ["helper bpf_check_mtu", "flag BPF_F_ADJ_ROOM_ENCAP_L2_ETH",
                             "flag BPF_F_ADJ_ROOM_DECAP_L3_IPV4"]
    assert f.cflags() == ["-DMC_HAVE_ADJ_ROOM_DECAP_L3=0", "-DMC_HAVE_ADJ_ROOM_L2_ETH=0", "-DMC_HAVE_CHECK_MTU=0"]


def test_the_feature_header_defaults_exactly_the_settings_the_probe_passes():
    """bpf/lib/features.h gives each setting of OPTIONAL its default (1: the feature is there), and
    no other source defines a default or tests a setting the probe does not pass."""
    header = bpf_dir() / "lib" / "features.h"
    defaults = re.findall(r"^#ifndef (MC_HAVE_\w+)\n#define \1 1\n#endif$", header.read_text(), re.M)
    assert sorted(defaults) == sorted(features.OPTIONAL.values())
    for f in sorted(p for p in bpf_dir().rglob("*") if p.suffix in (".c", ".h") and p != header):
        text = f.read_text()
        assert not re.search(r"^\s*#\s*define\s+MC_HAVE_", text, re.M), f"{f.name} defines a feature default"
        assert set(re.findall(r"\bMC_HAVE_\w+", text)) <= set(defaults), f"{f.name} tests a setting nobody passes"
