# SPDX-License-Identifier: Apache-2.0
"""The option walk: every command and subcommand of a click tree with its visible options and
arguments, compared against the command table of docs/cli.md and against the grammar's rules
(cli.options). Pure: a click group and a document in, a list of one-line problems out."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import click

from meshctl.cli.options import DEPRECATED_OPTIONS, REPURPOSED_OPTIONS, AliasedOption


@dataclass
class Row:
    """One command's visible surface: its arguments (NAME), options (`-o/--output`) and the
    formats its `-o` takes."""

    arguments: list[str] = field(default_factory=list)
    options: list[str] = field(default_factory=list)
    formats: list[str] = field(default_factory=list)


def spelling(opt: click.Option) -> str:
    """How docs/cli.md writes an option: its short then long names, `/`-joined (`-o/--output`)."""
    return "/".join([*sorted(opt.opts, key=lambda o: (o.startswith("--"), o)), *opt.secondary_opts])


def subcommands(group: click.Group) -> dict[str, click.Command]:
    """A group's commands by name, lazily registered ones loaded (cli.MeshctlGroup)."""
    ctx = click.Context(group)
    found = {name: group.get_command(ctx, name) for name in group.list_commands(ctx)}
    return {name: cmd for name, cmd in sorted(found.items()) if cmd is not None}


def walk(cmd: click.Command, path: str = "meshctl") -> dict[str, Row]:
    """Every command under `cmd` (itself included), keyed by its full name (`meshctl lab down`).
    Hidden options (the deprecated aliases' own options) and --help are left out."""
    visible = [p for p in cmd.params if isinstance(p, click.Option) and not p.hidden]
    formats = [str(c) for p in visible if "-o" in p.opts and isinstance(p.type, click.Choice) for c in p.type.choices]
    row = Row([p.human_readable_name for p in cmd.params if isinstance(p, click.Argument)],
              [spelling(p) for p in visible], formats)
    rows = {path: row}
    if isinstance(cmd, click.Group):
        for name, sub in subcommands(cmd).items():
            rows.update(walk(sub, f"{path} {name}"))
    return rows


def options_of(cmd: click.Command) -> list[click.Option]:
    """Every option of every command under `cmd`, hidden ones included."""
    opts = [p for p in cmd.params if isinstance(p, click.Option)]
    if isinstance(cmd, click.Group):
        for sub in subcommands(cmd).values():
            opts += options_of(sub)
    return opts


def without_help(cmd: click.Command, path: str = "meshctl") -> list[str]:
    """Every visible option with no help text, and every command with none, one line each naming
    the command and the option (`meshctl plan: --granularity has no help text`)."""
    problems = [] if cmd.help or cmd.short_help else [f"{path}: the command has no help text (a docstring)"]
    problems += [f"{path}: {spelling(p)} has no help text (help=...)" for p in cmd.params
                 if isinstance(p, click.Option) and not p.hidden and not (p.help or "").strip()]
    if isinstance(cmd, click.Group):
        for name, sub in subcommands(cmd).items():
            problems += without_help(sub, f"{path} {name}")
    return problems


_ROW = re.compile(r"^\|\s*`(meshctl[^`]*)`\s*\|([^|]*)\|([^|]*)\|([^|]*)\|\s*$")


def parse_table(doc: str) -> dict[str, Row]:
    """The command table's rows of a document: `| \\`meshctl CMD\\` | arguments | options | formats |`,
    each cell's names in backticks."""
    rows: dict[str, Row] = {}
    for line in doc.splitlines():
        m = _ROW.match(line.strip())
        if m:
            cells = [re.findall(r"`([^`]+)`", m.group(i)) for i in (2, 3, 4)]
            rows[m.group(1)] = Row(*cells)
    return rows


def compare(tree: dict[str, Row], doc: dict[str, Row]) -> list[str]:
    """What the tree and the document disagree on, one line each (empty: they agree)."""
    problems = [f"{c}: not in docs/cli.md" for c in tree if c not in doc]
    problems += [f"{c}: in docs/cli.md but not a command" for c in doc if c not in tree]
    for c in tree.keys() & doc.keys():
        t, d = tree[c], doc[c]
        problems += [f"{c}: {o} is not in docs/cli.md" for o in t.options if o not in d.options]
        problems += [f"{c}: docs/cli.md lists {o}, which it does not take" for o in d.options if o not in t.options]
        if t.arguments != d.arguments:
            problems.append(f"{c}: arguments {t.arguments} but docs/cli.md says {d.arguments}")
        if t.formats != d.formats:
            problems.append(f"{c}: -o takes {t.formats} but docs/cli.md says {d.formats}")
    return sorted(problems)


def grammar_problems(cmd: click.Command) -> list[str]:
    """Breaks of the grammar: a deprecated name visible, an `-o` that is not `-o/--output`, an
    alias that is not listed in DEPRECATED_OPTIONS or does not point at its option's name."""
    problems: list[str] = []
    for c, row in walk(cmd).items():
        for o in row.options:
            names = o.split("/")
            problems += [f"{c}: {n} is visible; it is deprecated for {DEPRECATED_OPTIONS[n]}"
                         for n in names if n in DEPRECATED_OPTIONS]
            if ("-o" in names or "--output" in names) and o != "-o/--output":
                problems.append(f"{c}: {o} should be -o/--output")
            if ("-f" in names or "--file" in names) and o != "-f/--file":
                problems.append(f"{c}: {o} should be -f/--file")
    for opt in options_of(cmd):
        for alias in opt.aliases if isinstance(opt, AliasedOption) else ():
            if REPURPOSED_OPTIONS.get(alias) in opt.opts:
                continue
            if DEPRECATED_OPTIONS.get(alias) not in opt.opts:
                problems.append(f"{alias}: an alias of {spelling(opt)}, but DEPRECATED_OPTIONS says "
                                f"{DEPRECATED_OPTIONS.get(alias)}")
    return problems


def table(tree: dict[str, Row]) -> str:
    """The command table docs/cli.md carries (to write it afresh after adding a command)."""
    lines = ["| command | arguments | options | `-o` formats |", "|---|---|---|---|"]
    for c, r in tree.items():
        lines.append(f"| `{c}` | {' '.join(f'`{a}`' for a in r.arguments)} | "
                     f"{', '.join(f'`{o}`' for o in r.options)} | {' '.join(f'`{f}`' for f in r.formats)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    from meshctl.cli import main

    print(table(walk(main)))
