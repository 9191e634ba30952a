# SPDX-License-Identifier: Apache-2.0
"""Appliers: what the agent changes on its node (WireGuard, routes, NAT, sysctls, keys) and what it
reads from it (discovery). Each compares desired with actual state and changes only what differs."""
