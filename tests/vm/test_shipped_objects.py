# SPDX-License-Identifier: Apache-2.0
"""No kernel headers on a node: a Debian 6.1 guest whose /usr/src is hidden (its
/lib/modules/<release>/build link dangles, as in a DaemonSet pod without the /usr/src mount) and
where bcc cannot be imported loads the programs built on this host by `meshctl datapath
build-objects` for the variant its probes select, and `datapath status` says `objects: shipped`;
without shipped objects the same guest runs on kernel routes and says why. One boot (TCG: minutes)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys

import pytest
from click.testing import CliRunner

from meshctl.cli import main
from meshctl.datapath import features
from meshctl.lab.vms import vm

SERIES = "6.1"
PIN_ROOT = "/sys/fs/bpf/oh-vm"  # the guest's own bpffs
GUEST_TIMEOUT = 900.0  # every Python start under TCG costs tens of seconds

# One interpreter in the guest (each Python start costs tens of seconds there): open the datapath and
# print what it chose, then `datapath status` as the CLI prints it, then unload; exit as the status did.
GUEST_SCRIPT = """
import json, sys
from meshctl.datapath import Datapath, features, loader, objcache
node, root = sys.argv[1], sys.argv[2]
dp = Datapath.open(node, pin_root=root)
print(json.dumps({'mode': dp.mode, 'reason': dp.reason, 'objects': dp.objects, 'bcc': 'bcc' in sys.modules,
                  'headers': objcache.have_headers(), 'variant': sorted(features.probe().variant()),
                  'file': str(loader.shipped_path())}))
dp.close()
try:
    from click.testing import CliRunner
    from meshctl.cli import main
    r = CliRunner().invoke(main, ['datapath', 'status', '--node', node, '--bpf-pin-root', root])
    print('---')
    print(r.output, end='')
finally:
    Datapath.unload(node, pin_root=root)
sys.exit(r.exit_code)
"""


@pytest.fixture(scope="module")
def objects(tmp_path_factory) -> str:
    """Every variant, built on this host as the image build does."""
    out = tmp_path_factory.mktemp("objects")
    pin_root = f"/sys/fs/bpf/oh-vmbuild{os.getpid()}"
    try:
        r = CliRunner().invoke(main, ["datapath", "build-objects", "--out", str(out), "--bpf-pin-root", pin_root])
    finally:
        shutil.rmtree(pin_root, ignore_errors=True)
    assert r.exit_code == 0, r.output
    return str(out)


@pytest.fixture(scope="module")
def guest(objects):
    try:
        k = vm.kernel(SERIES)
    except vm.MeshError as e:  # the kernel cache is filled by `make kernels`
        pytest.skip(str(e))
    machine = vm.VM(k, "oh-shipped")
    machine.start()
    try:
        shutil.copytree(objects, machine.shared / "objects")
        fake = machine.shared / "nobcc" / "bcc"
        fake.mkdir(parents=True)
        (fake / "__init__.py").write_text("raise ImportError('No module named bcc (test)')\n")
        yield machine
    finally:
        machine.stop()


def _without_headers(guest: vm.VM, node: str, shipped: str) -> tuple[dict, str]:
    """Datapath.open then `datapath status` in the guest, in a mount namespace whose /usr/src is an
    empty tmpfs, with bcc not importable (ahead of the guest's own PYTHONPATH, its packed imports:
    lab/vms/imports.py) and an empty object cache."""
    script = (f"mount -t tmpfs none /usr/src && mkdir -p /tmp/oh-cache && "
              f"PYTHONPATH={guest.shared / 'nobcc'}${{PYTHONPATH:+:$PYTHONPATH}} "
              f"{shlex.quote(sys.executable)} -c {shlex.quote(GUEST_SCRIPT)} {node} {PIN_ROOT}")
    env = {"MESHCTL_BPF_OBJECTS": shipped, "MESHCTL_BPF_CACHE": "/tmp/oh-cache"}
    res = guest.run(["unshare", "-m", "sh", "-c", script], timeout=GUEST_TIMEOUT, env=env)
    assert res.rc == 0, res.stderr
    opened, status = res.stdout.split("---\n", 1)
    return json.loads(opened.strip().splitlines()[-1]), status


@pytest.mark.slow
def test_a_guest_without_headers_loads_the_shipped_programs_and_says_so(guest):
    got, status = _without_headers(guest, "oh-g", str(guest.shared / "objects"))
    assert got["headers"] is False, "the guest sees no kernel headers"
    # 6.1 has no decapsulation flags (6.3): its probes select the variant without them
    assert set(got["variant"]) == set(features.OPTIONAL) - {"adjust_room_decap_l3"}
    assert got["file"].endswith("/adjust_room_encap_l2_eth+check_mtu.json")
    assert (got["mode"], got["objects"], got["bcc"]) == ("ebpf", "shipped", False), got
    lines = status.splitlines()
    assert lines[0] == "node oh-g: datapath ebpf" and lines[1] == "  objects: shipped", status


@pytest.mark.slow
def test_a_guest_without_headers_or_shipped_objects_runs_on_kernel_routes_and_says_why(guest):
    got, status = _without_headers(guest, "oh-k", str(guest.shared / "none"))
    assert (got["mode"], got["bcc"]) == ("kernel-routes", False), got
    assert got["objects"].startswith("kernel routes: no kernel headers at /lib/modules/"), got
    assert "no object at" in got["objects"]
    assert f"  objects: {got['objects']}" in status.splitlines(), status
