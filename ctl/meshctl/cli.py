"""`meshctl`: the command line. Each area keeps its commands in its own module; this file only
wires them together and turns every expected error into one line and a non-zero exit."""

from __future__ import annotations

import sys

import click

from .errors import InputError, MeshError


class _Group(click.Group):
    """Turns InputError/MeshError from any command into `error: ...` and exit 2/1."""

    def invoke(self, ctx: click.Context):  # type: ignore[override]
        try:
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


def _register() -> None:
    from . import cli_agent, cli_datapath, cli_lab, cli_plan

    for mod in (cli_plan, cli_datapath, cli_agent, cli_lab):
        for cmd in mod.COMMANDS:
            main.add_command(cmd)


_register()

if __name__ == "__main__":
    main()
