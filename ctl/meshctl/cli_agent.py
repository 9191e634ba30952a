"""`meshctl` commands of the agent area."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
