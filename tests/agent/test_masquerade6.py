# SPDX-License-Identifier: Apache-2.0
"""`meshctl agent --masquerade6` reaches the NAT step's rules: IPv6 pod egress is masqueraded only
when asked, IPv4's always (the rules themselves are tested on a real netns in tests/node)."""

from __future__ import annotations

import pytest

from meshctl.agent.config import AgentConfig
from meshctl.agent.steps import NatStep


@pytest.mark.parametrize("masquerade6,v6_masquerades", [(False, False), (True, True)],
                         ids=["IPv6 left alone by default", "--masquerade6 masquerades IPv6"])
def test_the_flag_decides_the_ipv6_masquerade_rule(masquerade6: bool, v6_masquerades: bool) -> None:
    step = NatStep(AgentConfig("a", backend="kubernetes", masquerade6=masquerade6).check())
    nat4, _ = step.applier._rules(4, ["priv"])
    nat6, _ = step.applier._rules(6, ["priv"])
    assert any(r.endswith("-j MASQUERADE") for r in nat4)
    assert any(r.endswith("-j MASQUERADE") for r in nat6) is v6_masquerades
    assert any(r.endswith("-j RETURN") for r in nat6)  # the chain exists either way
