# SPDX-License-Identifier: Apache-2.0
"""Every source file says its licence in its first lines (an SPDX identifier), and each identifier
used has its text under LICENSES/: the Python control plane is Apache-2.0, the BPF programs are
GPL-2.0-only OR BSD-2-Clause (the kernel loads them as "GPL", which GPL-only helpers need)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPDX = re.compile(r"SPDX-License-Identifier: (.+?)\s*$")
PYTHON = "Apache-2.0"
BPF = "(GPL-2.0-only OR BSD-2-Clause)"
SCRIPTS = {".ci/run", "Makefile", "Dockerfile", "vagrant/Vagrantfile", "scripts/container/meshctl-wireguard-go",
           "scripts/container/meshctl-build-objects"}


def sources() -> list[str]:
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [f for f in tracked.split() if f.endswith((".py", ".sh", ".c", ".h")) or f in SCRIPTS]


def licence_of(path: Path) -> str | None:
    for line in path.read_text().splitlines()[:3]:
        m = SPDX.search(line)
        if m:
            return m.group(1)
    return None


def test_every_source_file_names_its_licence() -> None:
    files = sources()
    assert len(files) > 100  # the walk found the tree
    missing = [f for f in files if (ROOT / f).exists() and licence_of(ROOT / f) is None]
    assert not missing, f"no SPDX line in the first three lines of: {missing}"


def test_python_is_apache_and_bpf_is_dual_licensed() -> None:
    wrong = []
    for f in sources():
        if not (ROOT / f).exists():
            continue
        want = BPF if f.endswith((".c", ".h")) else PYTHON
        if licence_of(ROOT / f) not in (want, None):
            wrong.append((f, licence_of(ROOT / f)))
    assert not wrong, wrong


def test_every_identifier_has_its_text() -> None:
    for ident in ("Apache-2.0", "GPL-2.0-only", "BSD-2-Clause"):
        text = ROOT / "LICENSES" / f"{ident}.txt"
        assert text.is_file() and text.stat().st_size > 1000, text


def test_licence_of_reads_the_identifier(tmp_path: Path) -> None:
    f = tmp_path / "x.py"
    f.write_text("#!/usr/bin/env python3\n# SPDX-License-Identifier: Apache-2.0\n\"\"\"doc\"\"\"\n")
    assert licence_of(f) == "Apache-2.0"
    f.write_text("\"\"\"doc\"\"\"\n\n\n# SPDX-License-Identifier: Apache-2.0\n")
    assert licence_of(f) is None
