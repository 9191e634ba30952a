# SPDX-License-Identifier: Apache-2.0
"""`lab down` without --lab takes down the only lab up and refuses, naming them, when several are
(so it never removes a lab someone else is using); --all takes every one. The other lab commands
read an omitted --lab as "the only lab up" with the same kind of line."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from meshctl.cli import main
from meshctl.errors import MeshError
from meshctl.lab.cli import labs_to_take_down
from meshctl.lab.namespaces import state


def test_the_only_lab_up_is_the_one_taken_down() -> None:
    assert labs_to_take_down(None, False, None, ["h1"]) == ["h1"]


def test_several_labs_up_need_a_name_or_all() -> None:
    with pytest.raises(MeshError, match=r"^several labs are up \(h1, h2\): pass --lab NAME or --all$"):
        labs_to_take_down(None, False, None, ["h1", "h2"])
    assert labs_to_take_down(None, True, None, ["h1", "h2"]) == ["h1", "h2"]
    assert labs_to_take_down("h2", False, None, ["h1", "h2"]) == ["h2"]
    assert labs_to_take_down(None, False, "h9-", ["h1", "h2"]) == ["h9"]


def test_with_no_lab_up_the_default_labs_leftovers_are_removed() -> None:
    assert labs_to_take_down(None, False, None, []) == ["ml"]
    assert labs_to_take_down(None, True, None, []) == ["ml"]


@pytest.mark.parametrize("argv", [["lab", "down"], ["lab", "status"], ["lab", "check"], ["lab", "etcdctl"]])
def test_several_labs_up_is_one_line_naming_them(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> None:
    # only the refusal runs: with two labs "up" and none named, nothing is touched
    monkeypatch.setattr(state, "labs_up", lambda: ["h1", "h2"])
    res = CliRunner().invoke(main, argv)
    assert res.exit_code == 1
    want = "or --all" if argv[1] == "down" else "pass --lab NAME"
    assert res.stderr.startswith("error: several labs are up (h1, h2): pass --lab NAME") and want in res.stderr
    assert len(res.stderr.splitlines()) == 1 and "Traceback" not in res.output
