# SPDX-License-Identifier: Apache-2.0
"""The docs read as data: their fenced code blocks, the meshctl command lines in their shell
blocks, the flags they name, and a Markdown table's rows. Pure: text in, values out."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
SHELLS = ("sh", "bash", "shell", "console")
_FENCE = re.compile(r"^[ \t]*```(\w*)[^\n]*\n(.*?)^[ \t]*```", re.S | re.M)
_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*")


@dataclass(frozen=True)
class Block:
    """A fenced block: the file, its first line's number, its language and its text."""

    doc: Path
    line: int
    lang: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def blocks(doc: Path) -> list[Block]:
    text = doc.read_text()
    return [Block(doc, text.count("\n", 0, m.start()) + 2, m.group(1), m.group(2)) for m in _FENCE.finditer(text)]


def meshctl_lines(block: Block) -> list[list[str]]:
    """The meshctl commands of a shell block, each as its arguments after `meshctl` (comments and
    a `.venv/bin/` prefix dropped)."""
    out = []
    for line in block.text.replace("\\\n", " ").splitlines():
        line = line.strip().removeprefix("$ ")
        if line.split(" ", 1)[0].rsplit("/", 1)[-1] == "meshctl":
            out.append(shlex.split(line, comments=True)[1:])
    return out


def offline(argv: list[str]) -> bool:
    """A command that runs on this machine with nothing but the repository: it reads a topology
    file of examples/, and no live store, lab or agent."""
    files = [a for a in argv if a.startswith("examples/")]
    live = {"--lab", "--backend", "--etcd-endpoints", "--kubeconfig", "--live"}
    return bool(files) and not live & set(argv)


def flags(text: str) -> set[str]:
    """Every `--flag` a text names."""
    return set(_FLAG.findall(text))


def section(doc: Path, heading: str) -> str:
    """The text under `## heading` up to the next `## `."""
    text = doc.read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def first_cells(table_text: str) -> list[str]:
    """The first cell of each row of the Markdown tables in `table_text`."""
    return [row.split("|")[1] for row in table_text.splitlines()
            if row.startswith("|") and not row.startswith("|---") and row.count("|") >= 3]
