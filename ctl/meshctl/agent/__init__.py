"""The per-node agent: configuration (`config`), the one reconcile loop (`core`) and its
metrics/status HTTP server (`metrics`)."""

from .config import DEFAULT_METRICS_ADDR, AgentConfig
from .core import Agent

__all__ = ["DEFAULT_METRICS_ADDR", "Agent", "AgentConfig"]
