# SPDX-License-Identifier: Apache-2.0
"""`meshctl`: the command line. Each area keeps its commands in its own module; this file only
wires them together and turns every expected error into one line and a non-zero exit."""

from __future__ import annotations

import sys
from importlib.metadata import entry_points

import click

from meshctl.errors import InputError, MeshError


class _Group(click.Group):
    """Turns InputError/MeshError from any command into `error: ...` and exit 2/1. A command about
    a lab that runs inside a VM is run there (cli.targets.forward), with its output and status."""

    ARGV = "meshctl.argv"

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta[self.ARGV] = list(args)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> object:
        from meshctl.cli import targets

        try:
            rc = targets.forward(ctx.meta.get(self.ARGV, []))
            if rc is not None:
                sys.exit(rc)
            return super().invoke(ctx)
        except InputError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(2)
        except MeshError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(1)


@click.group(cls=_Group)
@click.version_option(package_name="meshctl")
def main() -> None:
    """meshctl: WireGuard between locations, an eBPF fast path on private networks, and
    several clusters' pod networks joined through their etcd."""


PLUGIN_GROUP = "meshctl.cli"


def _register() -> None:
    """The shipped command groups, then plugins: entry points of group `meshctl.cli`, each a
    function that takes the main group (the lab is one). A plugin whose code is not installed
    (the agent image leaves the lab out) is skipped."""
    from meshctl.cli import agent as cli_agent
    from meshctl.cli import clustermesh as cli_clustermesh
    from meshctl.cli import datapath as cli_datapath
    from meshctl.cli import explain as cli_explain
    from meshctl.cli import mesh_settings as cli_mesh
    from meshctl.cli import monitor as cli_monitor
    from meshctl.cli import plan as cli_plan
    from meshctl.cli import ui as cli_ui

    for mod in (cli_plan, cli_mesh, cli_datapath, cli_monitor, cli_agent, cli_clustermesh, cli_explain, cli_ui):
        for cmd in mod.COMMANDS:
            main.add_command(cmd)
    for ep in entry_points(group=PLUGIN_GROUP):
        try:
            register = ep.load()
        except ImportError:
            continue
        register(main)


_register()

if __name__ == "__main__":
    main()
