"""`meshctl` commands of the lab area."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
