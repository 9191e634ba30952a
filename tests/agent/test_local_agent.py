# SPDX-License-Identifier: Apache-2.0
"""Talking to the local agent: /readyz apart from /healthz, and `status` / `node list` without
flags saying in one line that no agent runs."""

from __future__ import annotations

import socket

import requests
from click.testing import CliRunner

from meshctl.agent.server import StatusServer
from meshctl.agent.status import AgentStatus
from meshctl.cli import main


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_readyz_waits_for_the_first_plan_while_healthz_is_alive() -> None:
    applied = {"yes": False}
    port = free_port()
    starting = AgentStatus.from_json({"node": "n1", "ready": False, "reason": "starting"})
    srv = StatusServer(
        f"127.0.0.1:{port}", lambda node_list=True, fresh=False: starting, lambda: True, lambda: applied["yes"]
    )
    srv.start()
    s = requests.Session()
    s.trust_env = False
    try:
        base = f"http://127.0.0.1:{port}"
        assert s.get(f"{base}/healthz", timeout=3).status_code == 200
        r = s.get(f"{base}/readyz", timeout=3)
        assert r.status_code == 503 and r.text == "no plan applied yet\n"
        applied["yes"] = True
        assert s.get(f"{base}/readyz", timeout=3).status_code == 200
    finally:
        s.close()
        srv.stop()


def test_no_agent_is_one_line() -> None:
    addr = f"127.0.0.1:{free_port()}"
    for argv in (["status", "--addr", addr], ["node", "list", "--addr", addr]):
        r = CliRunner().invoke(main, argv)
        assert r.exit_code == 1, r.output
        assert r.stderr == (f"error: no meshctl agent answers at {addr} (is it running on this node? pass --addr "
                            "for another address)\n")
