# SPDX-License-Identifier: Apache-2.0
"""The CLI's one grammar (docs/cli.md): the shared option names, the output formats, and the
old spellings kept as hidden, deprecated aliases.

Every command declares its shared options through these factories, so a name means one thing
everywhere (`--node` a node, `--lab` a lab, `-o/--output` a format) and an old spelling keeps
working for a release: it parses exactly like the new name, stays out of `--help` and docs/cli.md,
and prints one line on stderr (`meshctl: --lab-node is deprecated; use --node`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import click

from meshctl.defaults import PIN_ROOT as _PIN_ROOT

# The output vocabularies: tables (rows and columns) and prose (lines a person reads).
TABLE_FORMATS = ("table", "json")
TEXT_FORMATS = ("text", "json")

# Old spelling -> the grammar's name. The deprecated names never appear in --help.
DEPRECATED_OPTIONS: Mapping[str, str] = {
    "--node-name": "--node",
    "--pin-root": "--bpf-pin-root",
    "--private-if": "--private-interface",
    "--tunnel-if": "--wg-interface",
    "--pod-if": "--pod-interfaces",
    "--topology": "--file",
    "--cluster": "--cluster-name",
}

# A name that meant something else on a few commands, kept there for a release as an alias of
# the name it now has there (`status --node a1` asked a lab node's agent: now `--lab-node`).
REPURPOSED_OPTIONS: Mapping[str, str] = {
    "--node": "--lab-node",
}

FC = TypeVar("FC", bound=Callable[..., Any])


def deprecation(old: str, new: str) -> None:
    """The one stderr line an old spelling prints."""
    click.echo(f"meshctl: {old} is deprecated; use {new}", err=True)


class AliasedOption(click.Option):
    """A click option with hidden old spellings: each parses into the same value as the option's
    own names (so defaults, envvars and callbacks are shared) and prints one deprecation line."""

    _MARK = "\0alias\0"

    def __init__(self, *args: Any, aliases: Sequence[str] = (), **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.aliases = tuple(aliases)

    def add_to_parser(self, parser: Any, ctx: click.Context) -> None:
        super().add_to_parser(parser, ctx)
        action = "append" if self.multiple else "store"
        for alias in self.aliases:
            parser.add_option(obj=self, opts=[alias], dest=f"{self.name}{self._MARK}{alias}", action=action,
                              nargs=self.nargs)

    def handle_parse_result(self, ctx: click.Context, opts: Mapping[str, Any], args: list[str]) -> Any:
        merged = dict(opts)
        for alias in self.aliases:
            key = f"{self.name}{self._MARK}{alias}"
            if key not in merged:
                continue
            deprecation(alias, self._canonical())
            value = merged.pop(key)
            if self.multiple:
                merged[self.name or ""] = [*merged.get(self.name or "", []), *value]
            else:
                merged.setdefault(self.name or "", value)
        return super().handle_parse_result(ctx, merged, args)

    def _canonical(self) -> str:
        return next((o for o in self.opts if o.startswith("--")), self.opts[0])


class Formats(click.Choice):
    """An `-o` vocabulary whose old values (`text` where the output is a table) still parse,
    with one deprecation line, into the new value."""

    def __init__(self, choices: Sequence[str], deprecated: Mapping[str, str] | None = None) -> None:
        super().__init__(list(choices))
        self.deprecated = dict(deprecated or {})

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and value in self.deprecated:
            deprecation(f"-o {value}", f"-o {self.deprecated[value]}")
            value = self.deprecated[value]
        return super().convert(value, param, ctx)


def option(*decls: str, aliases: Sequence[str] = (), **kw: Any) -> Callable[[FC], FC]:
    """`click.option` with hidden deprecated `aliases` (each listed in DEPRECATED_OPTIONS, or in
    REPURPOSED_OPTIONS for the option it now names)."""
    for a in aliases:
        assert a in DEPRECATED_OPTIONS or REPURPOSED_OPTIONS.get(a) in decls, f"{a} is not a known deprecated option"
    return click.option(*decls, cls=AliasedOption, aliases=aliases, **kw)


def node_option(dest: str = "node", aliases: Sequence[str] = (), **kw: Any) -> Callable[[FC], FC]:
    """`--node NAME`: the node a command is about, by its name in the cluster's records. (No
    default: click takes an explicit `default=None` for a value, and `required` would never fire.)"""
    return option("--node", dest, aliases=aliases, **kw)


def lab_node_option(dest: str = "lab_node") -> Callable[[FC], FC]:
    """`--lab-node NAME`: a node of a lab, whose agent the command asks inside its namespace (or VM).
    The old spelling on these commands, `--node`, still parses with one deprecation line."""
    return option("--lab-node", dest, aliases=("--node",),
                  help="Ask the agent of this lab node (inside its namespace or VM); --lab picks the lab.")


def lab_option(help: str = "Lab name (default: the only lab up).") -> Callable[[FC], FC]:
    """`--lab NAME`: the lab a command is about; omitted, the only lab that is up."""
    return click.option("--lab", "lab_name", default=None, help=help)


# What each format of the shared vocabularies prints (a command's own formats say it in its help).
_FORMAT_WORDS: Mapping[str, str] = {"table": "rows and columns", "text": "lines to read",
                                    "json": "one JSON document"}


def output_option(formats: Sequence[str] = TABLE_FORMATS, default: str | None = None,
                  deprecated: Mapping[str, str] | None = None, **kw: Any) -> Callable[[FC], FC]:
    """`-o/--output FORMAT`: TABLE_FORMATS for tables, TEXT_FORMATS for prose, or a command's own
    (showconf's config formats)."""
    kw.setdefault("help", "What to print: " + "; ".join(f"{f}: {_FORMAT_WORDS.get(f, f)}" for f in formats) + ".")
    return click.option("-o", "--output", "output", type=Formats(formats, deprecated),
                        default=default or formats[0], show_default=True, **kw)


def file_option(dest: str = "path", aliases: Sequence[str] = (), **kw: Any) -> Callable[[FC], FC]:
    """`-f/--file PATH`: a topology (or lab) file."""
    return option("-f", "--file", dest, aliases=aliases, **kw)


def pin_root_option(dest: str = "pin_root", aliases: Sequence[str] = ("--pin-root",), **kw: Any) -> Callable[[FC], FC]:
    """`--bpf-pin-root DIR`: the bpffs folder the fast path's objects are pinned under."""
    kw.setdefault("help", pin_root_help(kw.get("default")))
    return option("--bpf-pin-root", dest, aliases=aliases, **kw)


def pin_root_help(default: str | None = None) -> str:
    return f"bpffs folder of the fast path's pins (each node's under DIR/NODE; default {default or _PIN_ROOT})."


def flag(parse: Callable[[Any, str], Any]) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """A click callback that runs one mesh.fields parser and names the flag on failure."""

    def cb(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is None or value == "":
            return None
        name = next((o for o in param.opts if o.startswith("--")), "--" + (param.name or "").replace("_", "-"))
        return parse(value, name)

    return cb


def endpoint_list(text: str) -> tuple[str, ...]:
    """Comma-separated URLs (`--etcd-endpoints`) as a tuple, blanks dropped."""
    return tuple(e.strip() for e in text.split(",") if e.strip())


def cluster_name_option(default: str | None = "default") -> Callable[[FC], FC]:
    """`--cluster-name NAME`: the cluster (its records under /meshctl/NAME/). A command that reads a
    lab gives it no default: left out, the lab's own cluster(s)."""
    from meshctl.mesh import fields

    if default is None:
        return click.option("--cluster-name", default=None, callback=flag(fields.cluster_name),
                            help="The cluster whose records to read (default: with --lab, the lab's cluster(s); "
                            "else default).")
    return click.option("--cluster-name", default=default, show_default=True, callback=flag(fields.cluster_name),
                        help="The cluster (its records under /meshctl/NAME/ in etcd).")


def etcd_options(f: FC, cluster_default: str | None = "default") -> FC:
    """The six flags that reach a cluster's etcd, and `--cluster-name`."""
    for opt in reversed([
        click.option("--etcd-endpoints", default="", help="Comma-separated etcd client URLs."),
        click.option("--etcd-ca", default=None, help="CA file that signed etcd's certificate."),
        click.option("--etcd-cert", default=None, help="Client certificate for etcd."),
        click.option("--etcd-key", default=None, help="Client key for etcd."),
        click.option("--etcd-user", default=None, help="etcd user of this identity (a node: its node name)."),
        click.option("--etcd-password-file", default=None, help="File holding the etcd user's password."),
        cluster_name_option(cluster_default),
    ]):
        f = opt(f)
    return f


def lab_etcd_options(f: FC) -> FC:
    """The etcd flags of a command that reads a lab's etcd when given no endpoints: `--cluster-name`
    without a default (left out, the lab's own cluster or clusters)."""
    return etcd_options(f, cluster_default=None)


def log_level_option() -> Callable[[FC], FC]:
    """`--log-level`: how much a long-running command logs."""
    return click.option("--log-level", default="info", show_default=True,
                        type=click.Choice(["debug", "info", "warning", "error"]), help="Least severity logged.")
