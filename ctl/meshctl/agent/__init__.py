# SPDX-License-Identifier: Apache-2.0
"""The per-node agent: configuration (`config`), its life cycle (`lifecycle`), the one reconcile
loop (`loop`) that drives a list of steps (`steps`, run by `step_runner`) over memoised pure
results (`memos`), its status (`status`, built by `reporting`), its status/metrics HTTP server
(`server`) and the wiring of `meshctl agent` (`run`).

Nothing is imported here: a command that needs only `agent.config` or `agent.status` must not
pay for the loop's netlink and WireGuard imports."""
