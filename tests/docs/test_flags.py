# SPDX-License-Identifier: Apache-2.0
"""Every flag docs/cli.md and docs/agent.md name is an option of a command (renaming one fails
here), the agent's Flags table lists every flag of `meshctl agent` and nothing else, and the
mesh record's row names every field of a mesh record (`records.MESH_FIELDS`)."""

from __future__ import annotations

import click

from meshctl.cli import main
from meshctl.mesh.records import MESH_FIELDS
from tests.cli.grammar import options_of, subcommands

from .snippets import ROOT, first_cells, flags, section

CLI_MD, AGENT_MD = ROOT / "docs" / "cli.md", ROOT / "docs" / "agent.md"
# Flags of other programs these two pages quote.
FOREIGN = {"--help", "--version"}


def all_option_names() -> set[str]:
    """Every long name of every option of every command, deprecated aliases included."""
    names: set[str] = set()
    for opt in options_of(main):
        names.update(o for o in opt.opts + opt.secondary_opts if o.startswith("--"))
        names.update(getattr(opt, "aliases", ()))
    return names


def agent_flags() -> set[str]:
    agent = subcommands(main)["agent"]
    return {o for p in agent.params if isinstance(p, click.Option) and not p.hidden for o in p.opts
            if o.startswith("--")}


def test_every_flag_docs_cli_md_names_is_an_option() -> None:
    unknown = sorted(flags(CLI_MD.read_text()) - all_option_names() - FOREIGN - {"--bogus"})
    assert unknown == [], f"docs/cli.md names flags no command takes: {unknown}"


def test_every_flag_docs_agent_md_names_is_an_option() -> None:
    unknown = sorted(flags(AGENT_MD.read_text()) - all_option_names() - FOREIGN)
    assert unknown == [], f"docs/agent.md names flags no command takes: {unknown}"


def test_the_agent_flags_table_is_the_agent_command() -> None:
    table = flags("".join(first_cells(section(AGENT_MD, "Flags"))))
    assert sorted(agent_flags() - table) == [], "flags of meshctl agent missing from docs/agent.md's Flags table"
    assert sorted(table - agent_flags()) == [], "docs/agent.md's Flags table lists flags meshctl agent does not take"


def test_the_mesh_record_row_names_every_field() -> None:
    row = next(r for r in AGENT_MD.read_text().splitlines() if r.startswith("| `/meshctl/<cluster>/mesh`"))
    missing = [f for f in MESH_FIELDS if f'"{f}"' not in row]
    assert missing == [], f"docs/agent.md's mesh record row misses {missing}"


def test_a_renamed_flag_would_fail() -> None:
    """The check itself: a flag that no command takes is seen."""
    assert "--no-such-flag" not in all_option_names() and "--pod-cidr" in all_option_names()
    assert flags("`--pod-cidr` and --etcd-ca, not -x or --") == {"--pod-cidr", "--etcd-ca"}
