# SPDX-License-Identifier: Apache-2.0
"""Polling helpers shared by the integration tests (they live with the lab, which the benchmarks use too)."""

from meshctl.lab.rigs.waiting import wait_for, wait_until

__all__ = ["wait_for", "wait_until"]
