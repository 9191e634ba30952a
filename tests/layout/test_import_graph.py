# SPDX-License-Identifier: Apache-2.0
"""The tree's imports, read from the code (function-level imports included), keep four promises:

- no module import circle (a circle hidden in function bodies still makes each module need the
  others, and the order they load in decides what works);
- no circle between rooms (a room is a folder under ctl/meshctl; files at the top are room "");
- `mesh/` holds no process state: it imports none of `gc`, `threading`, `os`, `time`, `signal` or
  `meshctl.process`; pausing the collector or reading the clock is the callers' business;
- nothing outside the lab rooms (`meshctl.lab` and the rooms under it) imports them, so the agent
  image can leave the lab out.

Each check runs on the real tree and on a small synthetic tree that breaks it, so each is seen to fail.
"""

from __future__ import annotations

from pathlib import Path

from tests.layout.graph import PKG, find_circle, forbidden_imports, module_graph, room_graph

PROCESS_STATE = ("gc", "threading", "os", "time", "signal", "meshctl.process")
LAB = ("meshctl.lab",)


def in_mesh(module: str) -> bool:
    return module == "meshctl.mesh" or module.startswith("meshctl.mesh.")


def outside_lab(module: str) -> bool:
    return not (module == "meshctl.lab" or module.startswith("meshctl.lab."))


def circle_text(circle: list[str]) -> str:
    return " -> ".join(repr(m) for m in circle)


def test_no_module_import_circle() -> None:
    circle = find_circle(module_graph(PKG))
    assert not circle, f"import circle: {circle_text(circle)}"


def test_no_room_import_circle() -> None:
    circle = find_circle(room_graph(PKG))
    assert not circle, f"room circle: {circle_text(circle)}"


def test_mesh_imports_no_process_state() -> None:
    bad = forbidden_imports(PKG, in_mesh, PROCESS_STATE)
    assert not bad, f"mesh/ imports process state: {bad}"


def test_nothing_outside_the_lab_rooms_imports_them() -> None:
    bad = forbidden_imports(PKG, outside_lab, LAB)
    assert not bad, f"imports of the lab from outside it: {bad}"


def tree(root: Path, files: dict[str, str]) -> Path:
    """A package `meshctl` under `root` holding `files` (path -> source); returns its folder."""
    pkg = root / "meshctl"
    for rel, text in {"__init__.py": "", **files}.items():
        f = pkg / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        for parent in f.relative_to(pkg).parents:
            (pkg / parent / "__init__.py").touch()
        f.write_text(text)
    return pkg


def test_a_module_circle_is_reported_in_order(tmp_path: Path) -> None:
    pkg = tree(tmp_path, {
        "lab/build.py": "def up():\n    from . import probe\n    return probe\n",
        "lab/probe.py": "from meshctl.lab.vmnodes import start\n",
        "lab/vmnodes.py": "def start():\n    import meshctl.lab.build\n",
        "lab/spec.py": "from .build import up\n",
    })
    assert find_circle(module_graph(pkg)) == ["meshctl.lab.build", "meshctl.lab.probe", "meshctl.lab.vmnodes",
                                              "meshctl.lab.build"]


def test_importing_a_module_from_its_package_is_no_circle(tmp_path: Path) -> None:
    """`from . import pods` needs `pods`, not the package's `__init__` that imports the importer."""
    pkg = tree(tmp_path, {
        "node/__init__.py": "from .discovery import find\n",
        "node/discovery.py": "from . import pods\n\ndef find():\n    return pods\n",
        "node/pods.py": "from meshctl.errors import MeshError\n",
        "errors.py": "class MeshError(Exception):\n    pass\n",
    })
    graph = module_graph(pkg)
    assert graph["meshctl.node.discovery"] == {"meshctl.node.pods"}
    assert graph["meshctl.node.pods"] == {"meshctl.errors"}
    assert find_circle(graph) == []


def test_a_room_circle_is_reported_when_the_modules_make_none(tmp_path: Path) -> None:
    pkg = tree(tmp_path, {
        "lab/vms/guest.py": "from meshctl.lab.rigs.waiting import wait_for\n",
        "lab/rigs/waiting.py": "def wait_for():\n    pass\n",
        "lab/rigs/testbed.py": "def boot():\n    from ..vms.lab import run\n",
        "lab/vms/lab.py": "def run():\n    pass\n",
        "defaults.py": "",
    })
    assert find_circle(module_graph(pkg)) == []
    assert find_circle(room_graph(pkg)) == ["lab/rigs", "lab/vms", "lab/rigs"]
    assert room_graph(pkg)[""] == set()


def test_process_state_in_mesh_is_reported(tmp_path: Path) -> None:
    pkg = tree(tmp_path, {
        "mesh/plan.py": "import itertools\n\ndef plan():\n    import gc\n    gc.disable()\n",
        "mesh/model.py": "from meshctl import process\n",
        "mesh/admit.py": "from time import monotonic\n",
        "mesh/pure.py": "from dataclasses import dataclass\nfrom meshctl.errors import MeshError\n",
        "mesh/deep/clock.py": "import os.path\n",
        "agent/loop.py": "import gc\nimport time\nfrom meshctl import process\n",
        "process.py": "import gc\n",
    })
    assert forbidden_imports(pkg, in_mesh, PROCESS_STATE) == {
        "meshctl.mesh.admit": ["time", "time.monotonic"],
        "meshctl.mesh.deep.clock": ["os.path"],
        "meshctl.mesh.model": ["meshctl.process"],
        "meshctl.mesh.plan": ["gc"],
    }


def test_a_lab_import_from_outside_the_lab_is_reported(tmp_path: Path) -> None:
    pkg = tree(tmp_path, {
        "node/probe.py": "def x():\n    from ..lab.namespaces import netns\n    return netns\n",
        "cli/main.py": "from meshctl import lab\n",
        "agent/run.py": "import meshctl.lab.vms.guest\n",
        "agent/labels.py": "import meshctl.labels\n",
        "labels.py": "",
        "lab/vms/guest.py": "from meshctl.lab.namespaces import netns\nfrom ..rigs import waiting\n",
        "lab/namespaces/netns.py": "from meshctl.node import probe\n",
        "lab/rigs/waiting.py": "",
    })
    assert forbidden_imports(pkg, outside_lab, LAB) == {
        "meshctl.agent.run": ["meshctl.lab.vms.guest"],
        "meshctl.cli.main": ["meshctl.lab"],
        "meshctl.node.probe": ["meshctl.lab.namespaces", "meshctl.lab.namespaces.netns"],
    }
