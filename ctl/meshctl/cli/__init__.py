# SPDX-License-Identifier: Apache-2.0
"""`meshctl`: the command line. Each area keeps its commands in its own module; this file only
wires them together, loads a command's module when the command is named (so `meshctl --help` and
`meshctl X --help` import no agent, no netlink and no lab builder), and turns every expected
error, usage errors included, into one `error: ...` line and a non-zero exit."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO, Any, TypeVar

import click

from meshctl.errors import InputError, MeshError

T = TypeVar("T")


@dataclass(frozen=True)
class Lazy:
    """A command known by name before its module is imported: `target` is `module:attribute`,
    `short_help` the line `meshctl --help` lists it with (and the command's own short help)."""

    target: str
    short_help: str


class UsageLine(click.ClickException):
    """A usage error (a bad choice, a missing option, an unknown one) as the project's one line:
    `error: FLAG: VALUE REASON`, exit status 2, in place of click's `Usage:`/`Error:` block."""

    exit_code = 2

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"error: {self.message}", err=True)


def _flag_name(param: click.Parameter | None) -> str:
    """How a line names a parameter: an option by its long name, an argument by its metavar."""
    if param is None:
        return ""
    if isinstance(param, click.Argument):
        return param.human_readable_name
    return next((o for o in param.opts if o.startswith("--")), param.opts[0])


def usage_line(e: click.UsageError) -> UsageLine:
    """click's usage error `e` as one line naming the option (or argument) and the value."""
    where = e.ctx.command_path if e.ctx is not None else "meshctl"
    if isinstance(e, click.MissingParameter):
        what = "an option" if isinstance(e.param, click.Option) else "an argument"
        return UsageLine(f"{_flag_name(e.param)}: is required ({what} of {where})")
    if isinstance(e, click.BadParameter):
        return UsageLine(f"{_flag_name(e.param) or e.param_hint}: {e.message.rstrip('.')}")
    if isinstance(e, click.NoSuchOption):
        visible = {o for p in (e.ctx.command.params if e.ctx else ()) if isinstance(p, click.Option) and not p.hidden
                   for o in p.opts}
        near = sorted(p for p in e.possibilities or () if p in visible)
        return UsageLine(f"{e.option_name}: no such option of {where}"
                         + (f" (did you mean {', '.join(near)}?)" if near else ""))
    if isinstance(e, click.BadOptionUsage):
        reason = e.message.replace(f"'{e.option_name}' ", "").rstrip(".")
        reason = "needs a value" if reason.endswith("requires an argument") else reason[:1].lower() + reason[1:]
        return UsageLine(f"{e.option_name}: {reason}" + (f" ({where})" if e.ctx is not None else ""))
    return UsageLine(f"{where}: {e.message[:1].lower()}{e.message[1:].rstrip('.')}")


def _one_line_usage(fn: Callable[[], T]) -> T:
    """Runs `fn`, turning click's usage errors into UsageLine (a bare group's help stays help)."""
    try:
        return fn()
    except click.exceptions.NoArgsIsHelpError:
        raise
    except click.UsageError as e:
        raise usage_line(e) from None


def _wants_help(ctx: click.Context, argv: Sequence[str]) -> bool:
    """Whether `argv` asks for help (before a `--`): help is always answered here, never forwarded."""
    words = list(argv)[:list(argv).index("--")] if "--" in argv else list(argv)
    return any(h in words for h in ctx.help_option_names)


class MeshctlGroup(click.Group):
    """The `meshctl` group: commands registered by name (`add_lazy`) and imported when named;
    InputError/MeshError from any command become `error: ...` and exit 2/1, and so do click's
    usage errors. A command about a lab that runs inside a VM is run there (cli.targets.forward),
    with its output and status; `--help` never is."""

    ARGV = "meshctl.argv"

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.lazy: dict[str, Lazy] = {}

    def add_lazy(self, name: str, target: str, short_help: str) -> None:
        """Register command `name`, found at `target` (`module:attribute`) when first named."""
        self.lazy[name] = Lazy(target, short_help)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy:
            lazy = self.lazy[cmd_name]
            module, _, attr = lazy.target.partition(":")
            cmd = getattr(importlib.import_module(module), attr)
            cmd.short_help = lazy.short_help
            self.add_command(cmd, cmd_name)
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list of `meshctl --help`, from the registered lines (no module imported)."""
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.commands.get(name)
            if cmd is not None and cmd.hidden:
                continue
            rows.append((name, self.lazy[name].short_help if name in self.lazy else
                         cmd.get_short_help_str(formatter.width) if cmd is not None else ""))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def main(self, *args: Any, **kw: Any) -> Any:
        """As click's, named `meshctl` however it was started (`python -m meshctl.cli` too), so
        help and error lines name the command as a person types it."""
        kw.setdefault("prog_name", "meshctl")
        return super().main(*args, **kw)

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        return _one_line_usage(lambda: super(MeshctlGroup, self).make_context(info_name, args, parent, **extra))

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta[self.ARGV] = list(args)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> object:
        from meshctl.cli import targets

        argv = ctx.meta.get(self.ARGV, [])
        try:
            rc = None if _wants_help(ctx, argv) else targets.forward(argv)
            if rc is not None:
                sys.exit(rc)
            return _one_line_usage(lambda: super(MeshctlGroup, self).invoke(ctx))
        except InputError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(2)
        except MeshError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(1)


@click.group("meshctl", cls=MeshctlGroup)
@click.version_option(package_name="meshctl")
def main() -> None:
    """meshctl: WireGuard between locations, an eBPF fast path on private networks, and
    several clusters' pod networks joined through their etcd."""


PLUGIN_GROUP = "meshctl.cli"

# The shipped commands: name -> where it is, and the line `meshctl --help` lists it with.
COMMANDS: dict[str, Lazy] = {
    "plan": Lazy("meshctl.cli.plan:plan", "Print one node's WireGuard peers, routes and fast-path entries."),
    "graph": Lazy("meshctl.cli.plan:graph", "Print the mesh as a picture (Graphviz DOT, text or its model)."),
    "showconf": Lazy("meshctl.cli.plan:showconf", "Print the WireGuard config of a node or a peer."),
    "mesh": Lazy("meshctl.cli.mesh_settings:mesh", "Show or change the live cluster's mesh settings."),
    "maps": Lazy("meshctl.cli.datapath:maps", "The fast path's pinned maps."),
    "datapath": Lazy("meshctl.cli.datapath:datapath", "Load, unload or inspect one node's fast path."),
    "monitor": Lazy("meshctl.cli.monitor:monitor_cmd", "Watch the fast path's packet events on one node."),
    "agent": Lazy("meshctl.cli.agent:agent_cmd", "Run the node agent."),
    "status": Lazy("meshctl.cli.agent:status_cmd", "Print an agent's view of the mesh."),
    "node": Lazy("meshctl.cli.agent:node_group", "Node records in the backend, or as an agent sees them."),
    "cleanup": Lazy("meshctl.cli.agent:cleanup_cmd", "Remove what the agent made on this node."),
    "clustermesh": Lazy("meshctl.cli.clustermesh:clustermesh_group", "The cluster mesh's cache of remote clusters."),
    "explain": Lazy("meshctl.cli.explain:explain_cmd", "The path one packet takes from SRC to DST, hop by hop."),
    "ui": Lazy("meshctl.cli.ui:ui", "Serve the live map on a local web page."),
}


def _register() -> None:
    """The shipped commands, then plugins: entry points of group `meshctl.cli`, each a function
    that takes the main group (the lab is one) and registers its commands, lazily too. A plugin
    whose code is not installed (the agent image leaves the lab out) is skipped."""
    from importlib.metadata import entry_points

    for name, lazy in COMMANDS.items():
        main.add_lazy(name, lazy.target, lazy.short_help)
    for ep in entry_points(group=PLUGIN_GROUP):
        try:
            register = ep.load()
        except ImportError:
            continue
        register(main)


_register()

if __name__ == "__main__":
    main()
