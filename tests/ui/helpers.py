# SPDX-License-Identifier: Apache-2.0
"""`meshctl ui` as a person runs it: the command in its own process on a free loopback port, and
the page in a real browser (Debian's headless chromium driven by Playwright), with every console
message and page error the page gave kept for the test to check."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DOCS = Path(__file__).resolve().parents[2] / "docs"
START_S = 120.0  # a 500-node cross mesh draws its model in seconds; a lab's etcd answers at once


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def meshctl(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "meshctl.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


@dataclass
class Served:
    """A running `meshctl ui`: its process and the page's address."""

    proc: subprocess.Popen[str]
    url: str

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        req = urllib.request.Request(self.url.rstrip("/") + path, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()

    def json(self, path: str) -> Any:
        status, _, body = self.get(path)
        assert status == 200, (path, status, body)
        return json.loads(body)


@contextmanager
def served(*args: str) -> Iterator[Served]:
    """`meshctl ui --listen 127.0.0.1:PORT ARGS` until the block ends (then SIGTERM, and its stderr
    checked for a traceback)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "meshctl.cli", "ui", "--listen", f"127.0.0.1:{port}", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the command prints its address once the page is served
        if not line.startswith("meshctl ui: http://"):
            proc.kill()
            raise AssertionError(f"meshctl ui did not start: {line!r} {proc.communicate(timeout=10)}")
        yield Served(proc, f"http://127.0.0.1:{port}/")
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
        assert "Traceback" not in err, err


@dataclass
class Page:
    """A browser tab on the page, with what its console said."""

    page: Any
    console: list[tuple[str, str]] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)

    def errors(self) -> list[tuple[str, str]]:
        return [(t, m) for t, m in self.console if t in ("error", "pageerror")]

    def elsewhere(self, origin: str) -> list[str]:
        """The requests the page made anywhere but `origin` (offline: none)."""
        return [u for u in self.requests if not u.startswith(origin)]

    def nodes(self) -> set[str]:
        return set(self.page.eval_on_selector_all("svg#map g.node", "els => els.map(e => e.dataset.node)"))

    def edge(self, a: str, b: str) -> dict[str, str] | None:
        """The drawn line of the pair a-b (both ends open): its colour, dashes and rung."""
        key = "|".join(sorted((a, b)))
        return self.page.evaluate(
            """key => { const e = document.querySelector(`svg#map path.edge[data-pair="${key}"]`);
                return e && {stroke: e.getAttribute("stroke"), dash: e.getAttribute("stroke-dasharray"),
                             rung: e.dataset.rung, fell_back: e.dataset.fellBack}; }""", key)


@contextmanager
def browser(url: str, width: int = 1400, height: int = 860) -> Iterator[Page]:
    """The page at `url` in headless chromium (as root: without its sandbox), loaded and drawn."""
    sync = pytest.importorskip("playwright.sync_api")
    with sync.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--headless=new"])
        try:
            pg = b.new_page(viewport={"width": width, "height": height})
            out = Page(pg)
            pg.on("console", lambda m: out.console.append((m.type, m.text)))
            pg.on("pageerror", lambda e: out.console.append(("pageerror", str(e))))
            pg.on("request", lambda r: out.requests.append(r.url))
            pg.goto(url)
            pg.wait_for_selector("svg#map g.loc")
            yield out
        finally:
            b.close()
