"""The load-time feature probe: what it finds on this kernel, that its adjust_room probes can say
no, and the settings each answer gives the compiler (the variants older kernels load)."""

from __future__ import annotations

import pytest

from meshctl.datapath import features, libbpf

pytestmark = pytest.mark.root


@pytest.fixture
def fresh(monkeypatch):
    """probe() is cached per process: start and end each test with a fresh one."""
    features.probe.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    features.probe.cache_clear()


def test_the_settings_follow_what_this_kernel_has(fresh):
    """Every kernel of the matrix (5.10 on) loads the programs; what it lacks of OPTIONAL is named
    and compiled out (this host's 6.18 lacks nothing)."""
    f = features.probe()
    assert f.missing() == [], f.as_dict()
    for name, macro in features.OPTIONAL.items():
        assert f"-D{macro}={int(f.has(name))}" in f.cflags()
    assert len(f.fallbacks()) == sum(not f.has(n) for n in features.OPTIONAL)


@pytest.mark.parametrize("name", sorted(features._ADJ_ROOM_PROBES))
def test_an_adjust_room_probe_says_no_to_a_flag_the_kernel_does_not_know(fresh, name):
    """On this host every flag is known (6.18); on 5.10 both probes say no, on 6.1 the decap one."""
    so = libbpf.lib()
    features.probe()  # declares bpf_prog_load's signature
    diff, flags = features._ADJ_ROOM_PROBES[name]
    assert features._probe_adjust_room(so, diff, flags) == features.probe().flags[name]
    assert not features._probe_adjust_room(so, diff, flags | (1 << 40)), "an unknown bit: EINVAL at run time"
    assert features._probe_adjust_room(so, diff, 0), "the same call without flags works on every kernel"


def test_without_optional_features_the_settings_and_fallbacks_say_so(fresh):
    fresh.setenv(features.WITHOUT_ENV, ",".join(features.OPTIONAL))
    f = features.probe()
    assert f.missing() == [], "each optional feature has a fallback: the programs still load"
    assert f.fallbacks() == ["helper bpf_check_mtu", "flag BPF_F_ADJ_ROOM_ENCAP_L2_ETH",
                             "flag BPF_F_ADJ_ROOM_DECAP_L3_IPV4"]
    assert f.cflags() == ["-DMC_HAVE_ADJ_ROOM_DECAP_L3=0", "-DMC_HAVE_ADJ_ROOM_L2_ETH=0", "-DMC_HAVE_CHECK_MTU=0"]
