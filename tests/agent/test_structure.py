# SPDX-License-Identifier: Apache-2.0
"""The agent's shape: its configuration is a frozen value (what the backend learns at run time is
a NodeSettings the pass reads, never written into the config)."""

from __future__ import annotations

import dataclasses

import pytest

from meshctl.agent.config import AgentConfig, FlagSettings, NodeSettings


def test_the_agent_config_is_frozen() -> None:
    assert AgentConfig.__dataclass_params__.frozen  # type: ignore[attr-defined]
    cfg = AgentConfig(node_name="a1")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.location = "elsewhere"  # type: ignore[misc]
    assert NodeSettings.__dataclass_params__.frozen  # type: ignore[attr-defined]


def test_the_flags_settings_are_the_configs() -> None:
    cfg = AgentConfig(node_name="a1", location="loc-a", leader=True, persistent_keepalive=5)
    own = FlagSettings(cfg).current()
    assert (own.location, own.leader, own.persistent_keepalive) == ("loc-a", True, 5)
    assert {f.name for f in dataclasses.fields(NodeSettings)} <= {f.name for f in dataclasses.fields(AgentConfig)}
