"""The per-node agent: configuration (`config`), the one reconcile loop (`loop`) that drives a
list of steps (`steps`), its status/metrics HTTP server (`server`) and the wiring of `meshctl
agent` (`run`)."""

from meshctl.agent.config import AgentConfig
from meshctl.agent.loop import Agent

__all__ = ["Agent", "AgentConfig"]
