"""`meshctl` commands of the datapath area."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
