# SPDX-License-Identifier: Apache-2.0
"""The option walk: every command and option of `meshctl` against docs/cli.md and the grammar's
rules (cli.options), and the walker itself on a tiny click group, so an undocumented option, a
documented one that is gone, a deprecated name left visible, an `-o` without `--output`, an
option without help text or a `--node` that means a lab node fail."""

from __future__ import annotations

from pathlib import Path

import click
from click.testing import CliRunner

from meshctl.cli import main
from meshctl.cli.options import DEPRECATED_OPTIONS, REPURPOSED_OPTIONS, lab_node_option, option, output_option

from .grammar import Row, compare, grammar_problems, parse_table, subcommands, table, walk, without_help

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"

# The names issue 25 found speaking for the same thing as another name.
OLD_NAMES = {"--node-name", "--pin-root", "--private-if", "--tunnel-if", "--pod-if", "--topology"}
# The commands whose node is a lab's (its agent asked inside the lab): `--lab-node`, never `--node`.
LAB_NODE_COMMANDS = {"meshctl status", "meshctl node list"}


def test_every_command_and_option_is_in_docs_cli_md_and_nothing_more() -> None:
    tree = walk(main)
    assert {"meshctl lab down", "meshctl datapath load", "meshctl status"} <= tree.keys()  # the lab is walked too
    assert compare(tree, parse_table(DOC.read_text())) == []


def test_the_commands_keep_the_grammar() -> None:
    assert grammar_problems(main) == []
    visible = {n for row in walk(main).values() for o in row.options for n in o.split("/")}
    assert not visible & OLD_NAMES
    assert DEPRECATED_OPTIONS.keys() >= OLD_NAMES
    shared = {"--node", "--lab", "--lab-node", "--bpf-pin-root", "--private-interface", "--wg-interface",
              "--pod-interfaces"}
    assert visible >= shared


def test_every_option_and_command_has_help_text() -> None:
    """A new option needs `help=...` (the failure names the command and the option)."""
    assert without_help(main) == []


def test_node_means_a_node_of_the_cluster_and_lab_nodes_have_their_own_flag() -> None:
    for cmd, row in walk(main).items():
        if cmd in LAB_NODE_COMMANDS:
            assert "--lab-node" in row.options and "--node" not in row.options, cmd
        else:
            assert "--lab-node" not in row.options, cmd


def test_every_output_option_is_o_output_with_a_known_vocabulary() -> None:
    for cmd, row in walk(main).items():
        outs = [o for o in row.options if "--output" in o.split("/") or "-o" in o.split("/")]
        assert outs in ([], ["-o/--output"]), cmd
        if outs and cmd not in ("meshctl showconf", "meshctl graph"):  # config formats; a drawing (dot)
            assert row.formats in (["table", "json"], ["text", "json"]), cmd


# The walker on a tiny tree: what it must catch.

@click.group()
def tiny() -> None:
    """A tiny tree."""


@tiny.command("show")
@option("--node", aliases=("--node-name",), help="A node.")
@output_option()
def tiny_show(node: str | None, output: str) -> None:
    """Show."""


TINY_DOC = """
| command | arguments | options | `-o` formats |
|---|---|---|---|
| `meshctl` |  |  |  |
| `meshctl show` |  | `--node`, `-o/--output` | `table` `json` |
"""


def test_the_walker_sees_options_but_not_hidden_aliases() -> None:
    assert walk(tiny) == {"meshctl": Row([], [], []), "meshctl show": Row([], ["--node", "-o/--output"],
                                                                          ["table", "json"])}
    assert compare(walk(tiny), parse_table(TINY_DOC)) == []
    assert parse_table(table(walk(tiny))) == walk(tiny)
    assert grammar_problems(tiny) == []


def test_an_undocumented_option_fails_the_walk() -> None:
    @tiny.command("extra")
    @click.option("--brand-new")
    def extra(brand_new: str | None) -> None:
        """Extra."""

    try:
        doc = parse_table(TINY_DOC + "| `meshctl extra` |  |  |  |\n")
        assert compare(walk(tiny), doc) == ["meshctl extra: --brand-new is not in docs/cli.md"]
        assert compare(walk(tiny), parse_table(TINY_DOC)) == ["meshctl extra: not in docs/cli.md"]
    finally:
        del tiny.commands["extra"]


def test_a_documented_option_that_is_gone_and_a_changed_vocabulary_fail_the_walk() -> None:
    doc = parse_table(TINY_DOC.replace("`--node`,", "`--node`, `--node-name`,").replace("`table` `json`", "`text`"))
    assert compare(walk(tiny), doc) == [
        "meshctl show: -o takes ['table', 'json'] but docs/cli.md says ['text']",
        "meshctl show: docs/cli.md lists --node-name, which it does not take"]


def test_a_visible_old_name_or_a_bare_o_breaks_the_grammar() -> None:
    @click.group()
    def bad() -> None:
        """Bad."""

    @bad.command("x")
    @click.option("--node-name")
    @click.option("-o", "output", type=click.Choice(["text", "json"]))
    @click.option("--topo", "-f")
    def x(node_name: str | None, output: str | None, topo: str | None) -> None:
        """X."""

    assert grammar_problems(bad) == ["meshctl x: --node-name is visible; it is deprecated for --node",
                                     "meshctl x: -o should be -o/--output",
                                     "meshctl x: -f/--topo should be -f/--file"]


def test_an_alias_must_point_at_its_options_name() -> None:
    @click.command()
    @option("--wg-interface", aliases=("--private-if",))
    def y(wg_interface: str | None) -> None:
        """Y."""

    assert grammar_problems(y) == ["--private-if: an alias of --wg-interface, but DEPRECATED_OPTIONS says "
                                   "--private-interface"]


def test_an_option_without_help_fails_naming_the_command_and_the_option() -> None:
    @click.group()
    def g() -> None:
        """G."""

    @g.command("y")
    @click.option("--with-help", help="Has some.")
    @click.option("--bare")
    def y(with_help: str | None, bare: str | None) -> None:
        """Y."""

    @g.command("z")
    def z() -> None:
        pass

    assert without_help(g) == ["meshctl y: --bare has no help text (help=...)",
                               "meshctl z: the command has no help text (a docstring)"]


def test_a_repurposed_name_is_an_alias_only_of_its_new_option() -> None:
    assert REPURPOSED_OPTIONS["--node"] == "--lab-node"

    @click.command()
    @lab_node_option()
    def w(lab_node: str | None) -> None:
        """W."""

    assert grammar_problems(w) == []
    res = CliRunner().invoke(w, ["--node", "a1"])
    assert res.stderr.splitlines() == ["meshctl: --node is deprecated; use --lab-node"]


def test_the_lab_is_listed_without_loading_a_command() -> None:
    assert "lab" in main.list_commands(click.Context(main)) and "lab" in subcommands(main)
