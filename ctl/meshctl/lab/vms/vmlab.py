# SPDX-License-Identifier: Apache-2.0
"""`meshctl lab up --kernel 6.1`: the namespace lab inside one VM that boots that Debian kernel.

The host keeps a small state file, /run/meshctl-lab/<lab>/state.json with a `vm` entry (the VM's
PIDs and shared directory), so `lab down` finds and stops the VM even after a crash. The lab itself
is built by the same `meshctl lab up` inside the guest (the guest runs this checkout over the
host's root filesystem). Every other command about that lab (`lab check`, `lab status`,
`status --lab-node`, `maps dump --node`, `datapath status --node`, `node list`) is run inside the
guest as it was typed, its output and exit status passed back: the commands behave the same
whatever the lab runs in.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import time
from pathlib import Path

import yaml

from meshctl.backends.file import load_yaml
from meshctl.errors import MeshError
from meshctl.lab.namespaces import state as labstate
from meshctl.lab.namespaces.spec import LabSpec
from meshctl.lab.namespaces.state import LabState
from meshctl.lab.namespaces.wiring import Progress
from meshctl.lab.rigs.waiting import CONVERGE_WAIT, EMULATED_CONVERGE_WAIT, guest_env
from meshctl.lab.vms import vm
from meshctl.lab.vms.vm import VM_ROOT
from meshctl.lab.vms.vmnodes import machine_of
from meshctl.node.shell import pid_alive

GUEST_LAB_FILE = "lab.yaml"
# What the guest's `lab up` may take beyond its own --wait (building namespaces, etcd, certificates
# under emulation): past it the host gives up on the guest, stops the VM, and says so.
GUEST_BUILD_TIMEOUT = 600.0
# lab commands that build or remove the lab are the host's own; the rest run where the lab is
HOST_LAB_COMMANDS = ("up", "down")


def meshctl_argv(*args: str) -> list[str]:
    """`meshctl ARGS` as the guest runs it: this interpreter (the venv the guest sees too)."""
    return [sys.executable, "-m", "meshctl.cli", *args]


def vm_labs() -> list[LabState]:
    """States of the labs that are up inside a VM."""
    out = []
    for name in labstate.labs_up():
        st = labstate.load(name)
        if st and st.vm:
            out.append(st)
    return out


def up(spec: LabSpec, path: str, series: str, *, prefix: str | None, wait: float | None,
       progress: Progress) -> LabState:
    """Boot the kernel, build the lab inside, return the host's state of it (`wait` None: the
    default for the VM's accelerator). On failure the VM is stopped and nothing is left."""
    prefix = prefix or spec.options.prefix
    name = labstate.lab_name(prefix)
    if labstate.load(name) is not None:
        raise MeshError(f"lab {name} is already up (meshctl lab down --lab {name})")
    k = vm.kernel(series)
    t0 = time.monotonic()
    if not vm.warm_bpf_cache():
        progress("could not compile the datapath on the host: the guest's agents compile it (slow under TCG)")
    machine = vm.VM(k, f"{name}-vm", workdir=VM_ROOT / name)
    st = LabState(name=name, prefix=prefix, source=str(path), kernel=series, dir=str(labstate.lab_dir(name)),
                  vm=machine.describe())
    labstate.save(st)
    try:
        progress(f"booting Debian's {k.series} kernel ({k.version}) in a VM ({machine.accel}, "
                 f"{machine.cpus} vCPUs, {machine.memory})")
        machine.start()
        st.vm = machine.describe()
        labstate.save(st)
        progress(f"VM up in {machine.boot_seconds:.1f} s; building the lab inside")
        emulated = machine.accel != "kvm"
        _guest_lab_file(spec, path, machine.shared / GUEST_LAB_FILE, machine.accel, progress)
        if wait is None:
            wait = EMULATED_CONVERGE_WAIT if emulated else CONVERGE_WAIT
        argv = ["lab", "up", "-f", str(machine.shared / GUEST_LAB_FILE), "--wait", str(wait)]
        if prefix:
            argv += ["--prefix", prefix]
        t1 = time.monotonic()
        res = machine.run(meshctl_argv(*argv), timeout=wait + GUEST_BUILD_TIMEOUT, on_output=vm.echo)
        if res.rc != 0:
            raise MeshError(f"lab up inside the VM ({k.series}) failed (exit {res.rc}): {_last_error(res)}")
        st.timings = {"boot_s": round(machine.boot_seconds or 0, 1), "lab_s": round(time.monotonic() - t1, 1),
                      "total_s": round(time.monotonic() - t0, 1)}
        labstate.save(st)
        return st
    except BaseException:
        machine.stop()
        with contextlib.suppress(OSError):
            shutil.rmtree(labstate.lab_dir(name))
        raise


def _last_error(res: vm.Result) -> str:
    """The guest's last word: the last line of its stderr (its one-line error), else of its stdout."""
    for text in (res.stderr, res.stdout):
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if lines:
            return lines[-1]
    return "the guest printed nothing"


def _guest_lab_file(spec: LabSpec, path: str, dest: Path, accel_mode: str, progress: Progress) -> None:
    """The lab file as the guest reads it: the user's, with lab.lease_ttl and lab.agent_args as
    vm.lease_ttl and vm.agent_args say where the file leaves them to the lab (each said in a
    progress line)."""
    ttl = vm.lease_ttl(spec.options.lease_ttl, accel_mode)
    args = vm.agent_args(spec.options.agent_args, accel_mode)
    doc = load_yaml(path)
    changed: dict[str, object] = {}
    if ttl != spec.options.lease_ttl:
        changed["lease_ttl"] = ttl
    if args != spec.options.agent_args:
        changed["agent_args"] = list(args)
    if not changed or not isinstance(doc, dict):
        shutil.copyfile(path, dest)
        return
    block = doc.get("lab")
    doc["lab"] = {**(block if isinstance(block, dict) else {}), **changed}
    dest.write_text(yaml.safe_dump(doc, sort_keys=False))
    for key, note in (("lease_ttl", vm.EMULATED_LEASE_NOTE), ("agent_args", vm.EMULATED_RESYNC_NOTE)):
        if key in changed:
            progress(note)


def down(st: LabState, progress: Progress) -> list[str]:
    """Stop the lab's VM by its PIDs and remove the host's state; what is left, if anything."""
    if st.vm is None:
        raise MeshError(f"lab {st.name} is not a lab in a VM")
    machine = vm.VM.attach(st.vm)
    if machine.alive():
        progress(f"stopping the VM of lab {st.name} (qemu pid {machine.qemu_pid})")
    machine.stop()
    left = [f"VM process {p}" for p in (machine.pid, machine.qemu_pid) if p and pid_alive(p)]
    if machine.workdir.exists():
        left.append(str(machine.workdir))
    if not left:
        shutil.rmtree(labstate.lab_dir(st.name), ignore_errors=True)
    return left


def _wants_lab(argv: list[str]) -> bool:
    """Whether `argv` is about a lab (so it runs where that lab runs)."""
    if not argv:
        return False
    if argv[0] == "lab":
        return len(argv) > 1 and argv[1] not in HOST_LAB_COMMANDS and argv[1] not in ("--help", "-h")
    node_flags = ("--lab-node", "--node")  # --node: the deprecated spelling here (cli.options)
    if (argv[:1] == ["status"] or argv[:2] == ["node", "list"]) and any(_option(argv, f) for f in node_flags):
        return True
    if argv[:2] in (["maps", "dump"], ["datapath", "status"]) or argv[:1] == ["monitor"]:
        return _option(argv, "--node") is not None and not any(
            _option(argv, flag) is not None for flag in ("--bpf-pin-root", "--pin-root", "--netns"))
    if argv[:2] == ["node", "list"]:
        # a store or an agent named on the command line is read from here, a lab's from the lab
        return not any(a.startswith(("--etcd-endpoints", "--addr", "--kubeconfig")) for a in argv)
    return False


def _named_lab(argv: list[str]) -> str | None:
    return _option(argv, "--lab")


def _option(argv: list[str], name: str) -> str | None:
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(f"{name}="):
            return a.split("=", 1)[1]
    return None


def _forward_to_node_vm(argv: list[str], named: str | None) -> int | None:
    """A multi-VM lab (lab.vms): `maps dump --node N` and `datapath status --node N` read pinned maps,
    which live in N's VM, so they run there (against the guest's one-node lab state); every other
    command runs here (the host's state reaches each agent over the public segment)."""
    if argv[:2] not in (["maps", "dump"], ["datapath", "status"]) and argv[:1] != ["monitor"]:
        return None
    node = _option(argv, "--node")
    if node is None:
        return None
    for name in [named] if named else labstate.labs_up():
        st = labstate.load(name) if name else None
        if not st or not st.vms:
            continue
        for c, n in st.nodes():
            if node in (n.name, f"{c.name}/{n.name}"):
                return machine_of(n).run(meshctl_argv(*argv), on_output=vm.echo,
                                         env=guest_env(n.vm)).rc
    return None


class Forwarder:
    """cli.targets.Forwarder: commands about a VM lab run inside its VM (a multi-VM lab's node
    commands inside that node's VM)."""

    def forward(self, argv: list[str]) -> int | None:
        if not _wants_lab(argv):
            return None
        named = _named_lab(argv)
        rc = _forward_to_node_vm(argv, named)
        if rc is not None:
            return rc
        labs = vm_labs()
        if named is not None:
            labs = [st for st in labs if st.name == named]
        if not labs:
            return None
        if len(labs) > 1 or len(labstate.labs_up()) > 1 and named is None:
            raise MeshError(f"several labs are up ({', '.join(labstate.labs_up())}): pass --lab NAME")
        st = labs[0]
        d = st.vm
        assert d is not None  # vm_labs() holds labs in a VM only
        machine = vm.VM.attach(d)
        if not machine.alive():
            raise MeshError(f"the VM of lab {st.name} is not running (meshctl lab down --lab {st.name})")
        if argv[:2] == ["lab", "status"] and "json" not in argv:
            print(f"VM: Debian {d.series} kernel {d.version}, {d.accel}, qemu pid {d.qemu_pid}")
            sys.stdout.flush()
        return machine.run(meshctl_argv(*argv), on_output=vm.echo, env=guest_env(d)).rc
