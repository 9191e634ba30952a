# SPDX-License-Identifier: Apache-2.0
"""The old option spellings (cli.options.DEPRECATED_OPTIONS) and the old `-o text` of tables still
work for a release, each printing one deprecation line on stderr; one test per kind of alias, on
real commands where one runs offline, and on a tiny command for what needs a value back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from meshctl.agent.config import AgentConfig
from meshctl.cli import main
from meshctl.cli.options import TABLE_FORMATS, option, output_option


def run_agent_parse(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> tuple[Any, AgentConfig | None]:
    """`meshctl agent ...` parsed for real up to run_agent, which keeps the AgentConfig instead."""
    import meshctl.agent.run as run

    got: list[AgentConfig] = []
    monkeypatch.setattr(run, "run_agent", got.append)
    res = CliRunner().invoke(main, ["agent", *argv], catch_exceptions=False)
    return res, (got[0] if got else None)


def test_an_old_option_name_still_parses_and_warns(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    topo = tmp_path / "t.yaml"
    res, cfg = run_agent_parse(monkeypatch, ["--node-name", "n1", "--pod-cidr", "10.42.0.0/24", "--backend", "file",
                                             "--topology", str(topo)])
    assert res.exit_code == 0, res.output
    assert cfg is not None and cfg.node_name == "n1" and cfg.topology_file == str(topo)
    assert res.stderr.splitlines() == ["meshctl: --node-name is deprecated; use --node",
                                       "meshctl: --topology is deprecated; use --file"]


def test_the_new_names_print_nothing_on_stderr(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    res, cfg = run_agent_parse(monkeypatch, ["--node", "n1", "--pod-cidr", "10.42.0.0/24", "--backend", "file",
                                             "-f", str(tmp_path / "t.yaml")])
    assert res.exit_code == 0 and res.stderr == ""
    assert cfg is not None and cfg.node_name == "n1"


def test_a_bad_value_under_either_name_names_the_new_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    for flag in ("--node", "--node-name"):
        res, cfg = run_agent_parse(monkeypatch, [flag, "no such node!", "--pod-cidr", "10.42.0.0/24"])
        assert res.exit_code == 2 and cfg is None
        assert res.stderr.splitlines()[-1] == "error: --node: 'no such node!' is not a DNS-1123 name"


def test_an_old_output_value_still_parses_and_warns() -> None:
    res = CliRunner().invoke(main, ["node", "list", "--addr", "127.0.0.1:1", "-o", "text"])
    lines = res.stderr.splitlines()
    assert lines[0] == "meshctl: -o text is deprecated; use -o table"
    assert lines[1].startswith("error: no meshctl agent answers at 127.0.0.1:1")  # parsed, then ran
    assert res.exit_code == 1


@click.command()
@option("--pod-interfaces", "pods", aliases=("--pod-if",), multiple=True)
@option("--private-interface", "nic", aliases=("--private-if",), default="eth0")
@output_option(TABLE_FORMATS, deprecated={"text": "table"})
def tiny(pods: tuple[str, ...], nic: str, output: str) -> None:
    click.echo(f"{','.join(pods)} {nic} {output}")


def test_aliases_give_the_value_the_new_name_would() -> None:
    res = CliRunner().invoke(tiny, ["--pod-if", "v1", "--pod-interfaces", "v2", "--pod-if", "v3", "-o", "text"])
    assert res.exit_code == 0, res.output
    assert set(res.stdout.split()[0].split(",")) == {"v1", "v2", "v3"}
    assert res.stdout.split()[1:] == ["eth0", "table"]
    # one line per old name, however often it is given
    assert res.stderr.splitlines() == ["meshctl: --pod-if is deprecated; use --pod-interfaces",
                                       "meshctl: -o text is deprecated; use -o table"]
    res = CliRunner().invoke(tiny, ["--private-if=eth9"])
    assert res.stdout.split() == ["eth9", "table"] and "--private-if is deprecated" in res.stderr


def test_aliases_stay_out_of_help() -> None:
    res = CliRunner().invoke(tiny, ["--help"])
    assert "--pod-interfaces" in res.stdout and "--pod-if" not in res.stdout.replace("--pod-interfaces", "")
    assert "--private-if " not in res.stdout and "text" not in res.stdout
