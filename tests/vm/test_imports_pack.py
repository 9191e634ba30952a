# SPDX-License-Identifier: Apache-2.0
"""The guests' packed imports (lab/vms/imports.py), checked on the host: a package is packed whole
(the guest may import modules the listing did not: `click.testing` failed in the guest when only
the imported half of `click` was packed), with its data, meshctl's own modules stay out, and an
interpreter with the pack first on PYTHONPATH imports from it."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile

from meshctl.lab.vms import imports


def test_the_pack_holds_whole_packages_their_data_and_no_meshctl_module(tmp_path):
    with tarfile.open(fileobj=io.BytesIO(imports.pack())) as tar:
        names = set(tar.getnames())
        tar.extractall(tmp_path)  # noqa: S202 - our own pack, built just now
    assert {"click/testing.pyc", "json/tool.pyc", "certifi/cacert.pem", "pyroute2/__init__.pyc"} <= names
    assert not [n for n in names if n.startswith("meshctl")]
    assert not [n for n in names if n.endswith(".py")], "sources are packed compiled"
    out = subprocess.run(
        [sys.executable, "-c", "import click.testing, certifi, yaml, meshctl.cli; "
         "print(click.testing.__file__); print(certifi.where()); print(meshctl.cli.__file__)"],
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=True)
    click_file, ca, cli = out.stdout.split()
    assert click_file == str(tmp_path / "click" / "testing.pyc") and ca == str(tmp_path / "certifi" / "cacert.pem")
    assert not cli.startswith(str(tmp_path)), "meshctl's modules load from the checkout, beside their data"
