# SPDX-License-Identifier: Apache-2.0
"""The labs of the page's tests: each test brings its own up under a `ui<pid><n>-` prefix and
takes it down on success and failure (one lab at a time)."""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml

from tests.names import unique

# MESHCTL_UI_SCREENSHOTS=1 writes the pictures into docs/ (docs/ui.md shows them); else a temporary folder.
SCREENSHOTS = os.environ.get("MESHCTL_UI_SCREENSHOTS") == "1"


def lab_doc(name: str, **agent: Any) -> dict[str, Any]:
    """A shipped lab file (lab/labs/NAME.yaml) without its prefix, agents given `agent` flags."""
    d: dict[str, Any] = copy.deepcopy(yaml.safe_load((files("meshctl.lab") / "labs" / f"{name}.yaml").read_text()))
    d["lab"].pop("prefix", None)
    d["lab"]["agent_args"] = [a for k, v in agent.items() for a in (f"--{k.replace('_', '-')}", str(v))]
    return d


def lab_up(doc: dict[str, Any]) -> Iterator[Any]:
    """A namespace lab of `doc`, up until the generator is closed."""
    from meshctl.lab.namespaces import build
    from meshctl.lab.namespaces import state as labstate
    from meshctl.lab.namespaces.spec import parse_lab

    prefix = unique("ui") + "-"
    st = build.up(parse_lab(doc), prefix=prefix, wait=120)
    try:
        yield st
    finally:
        build.down(labstate.lab_name(prefix))


def picture(name: str, tmp: Path) -> Path:
    """Where the picture `name` goes: docs/ with MESHCTL_UI_SCREENSHOTS=1, else `tmp`."""
    from .helpers import DOCS

    return (DOCS if SCREENSHOTS else tmp) / name
