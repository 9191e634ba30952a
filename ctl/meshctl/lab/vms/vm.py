# SPDX-License-Identifier: Apache-2.0
"""Boot one of Debian's kernels in a VM over this machine's own root filesystem and run commands in it.

virtme-ng (`vng`) boots the kernel unpacked by `scripts/kernels.sh` under QEMU; the guest sees the
host's root read-only with writable overlays (/etc, /var, /tmp, ...), so the host's Python, bcc,
etcd and the project's venv run there unchanged, and the kernel's own module tree (from the kernel
cache) is linked to /lib/modules/<version> by vng's init.

The host talks to the guest through one shared directory (9p, `--rwdir`), private to root (0700):
a command is a request file the guest server picks up; its stdout/stderr are files the host reads
as they grow; its exit status is a file written last. No network, no port anyone else can reach.
The VM is stopped by the PIDs recorded at start (QEMU's pidfile and vng's own), and its directory
is removed: nothing is left behind.

`python -m meshctl.lab.vms.vm serve DIR` is the guest side; `python -m meshctl.lab.vms.vm run SERIES -- CMD`
boots, runs one command and stops (for the matrix and by hand).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from meshctl.datapath import loader, objcache
from meshctl.datapath.features import WITHOUT_ENV
from meshctl.errors import MeshError
from meshctl.lab.namespaces.state import VmRecord, to_json
from meshctl.lab.rigs.kernels import KERNEL_SERIES
from meshctl.lab.vms import imports, zygote
from meshctl.node.shell import exec_prefix, pid_alive

KERNEL_CACHE = Path(os.environ.get("MESHCTL_KERNELS", "/var/lib/meshctl/kernels"))
VM_ROOT = Path("/run/meshctl-vm")  # a lab's VMs' working directories: <VM_ROOT>/<lab>/...
HOST = "host"
VM_CPUS = 2
VM_MEMORY = "3G"
BOOT_TIMEOUT = 300.0
# Under TCG an agent busy starting can miss renewing a 5 s lease (its record expires and is
# published again, its peers churn): a lab in such a VM gets a longer lease unless its file sets
# one (and waits longer: rigs.waiting.EMULATED_CONVERGE_WAIT).
EMULATED_LEASE_TTL = 30
EMULATED_LEASE_NOTE = f"lease TTL {EMULATED_LEASE_TTL} s under emulation (lab.lease_ttl is not set)"
# An agent's full resync reads the kernel again through processes (iptables-nft-save, ipset save,
# tc on a kernel without tcx): under TCG about 1.3 s of host CPU per agent and pass, every 30 s a
# fifth of what an idle five-agent guest cost (docs/benchmarks.md). A lab in such a VM resyncs this
# often unless its file's lab.agent_args sets the flag. No VM test waits on a resync to repair
# drift (the host labs' tests do, at the agent's default).
EMULATED_RESYNC_S = 120
RESYNC_FLAG = "--resync-seconds"
EMULATED_RESYNC_NOTE = (f"full resync every {EMULATED_RESYNC_S} s under emulation "
                        f"(lab.agent_args does not set {RESYNC_FLAG})")
KVM_PROBE_TIMEOUT = 20.0
ACCEL_FILE = Path("/run/meshctl-vm-accel.json")
POLL = 0.05
# The guest's request loop polls a 9p directory: each look costs the emulated CPU a round trip, so
# it looks every POLL only while requests keep coming, and backs off to IDLE_POLL after IDLE_AFTER
# quiet seconds (a 1-vCPU TCG guest polling at 20 Hz spent a third of its CPU on it).
IDLE_POLL = 0.5
IDLE_AFTER = 5.0
PANIC = b"Kernel panic"
PANIC_CONTEXT = 12  # console lines kept in the error when a guest dies under a command


@dataclass(frozen=True)
class Kernel:
    """One unpacked Debian kernel: `series` (6.1), `version` (6.1.0-57-amd64), its image and tree."""

    series: str
    version: str
    image: Path
    root: Path


def kernel(series: str) -> Kernel:
    """The cached kernel of `series`, or MeshError saying how to fetch it."""
    if series not in KERNEL_SERIES:
        raise MeshError(f"kernel: {series!r} is not one of {', '.join((HOST, *KERNEL_SERIES))}")
    root = KERNEL_CACHE / series
    if not (root / ".complete").exists():
        raise MeshError(f"kernel {series} is not in {KERNEL_CACHE} (run: make kernels, or scripts/kernels.sh {series})")
    version = (root / ".kver").read_text().strip()
    return Kernel(series, version, root / "boot" / f"vmlinuz-{version}", root)


def _vng() -> str:
    """vng from the venv that runs us (virtme-run must be on PATH next to it)."""
    here = Path(sys.executable).parent / "vng"
    found = str(here) if here.exists() else shutil.which("vng")
    if not found:
        raise MeshError("vng (virtme-ng) is not installed (make setup installs it)")
    return found


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")))
    return env


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def kvm_probe(k: Kernel, timeout: float = KVM_PROBE_TIMEOUT) -> bool:
    """Whether a KVM guest gets through early boot here, bounded by `timeout`: the kernel is booted
    without a root filesystem and must reach its "no root" panic (a nested KVM guest that stalls never
    does). Only QEMU runs; it is killed by its PID when the time is up."""
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return False
    qemu = shutil.which("qemu-system-x86_64")
    if not qemu:
        return False
    cmd = [qemu, "-enable-kvm", "-cpu", "host", "-m", "256M", "-smp", "1", "-nodefaults", "-no-user-config",
           "-display", "none", "-serial", "stdio", "-no-reboot", "-kernel", str(k.image),
           "-append", "console=ttyS0 panic=-1 root=/dev/nonexistent"]
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = b""
    deadline = time.monotonic() + timeout
    assert p.stdout is not None
    os.set_blocking(p.stdout.fileno(), False)
    try:
        while time.monotonic() < deadline:
            chunk = p.stdout.read()
            if chunk:
                out += chunk
                if PANIC in out:
                    return True
            if p.poll() is not None:
                return PANIC in out
            time.sleep(0.1)
        return False
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()


def accel(k: Kernel | None = None) -> str:
    """`kvm` when a KVM guest boots here, else `tcg`; probed once per host boot (the answer is kept
    in /run). MESHCTL_VM_ACCEL=kvm|tcg overrides."""
    forced = os.environ.get("MESHCTL_VM_ACCEL")
    if forced in ("kvm", "tcg"):
        return forced
    boot = _boot_id()
    with contextlib.suppress(OSError, ValueError):
        saved = json.loads(ACCEL_FILE.read_text())
        if saved.get("boot_id") == boot and saved.get("accel") in ("kvm", "tcg"):
            return str(saved["accel"])
    k = k or next((kernel(s) for s in KERNEL_SERIES if (KERNEL_CACHE / s / ".complete").exists()), None)
    if k is None:
        raise MeshError(f"no kernel in {KERNEL_CACHE} to probe KVM with (run: make kernels)")
    result = "kvm" if kvm_probe(k) else "tcg"
    with contextlib.suppress(OSError):
        ACCEL_FILE.write_text(json.dumps({"boot_id": boot, "accel": result}))
    return result


@dataclass
class Result:
    """What a command in the guest did."""

    rc: int
    stdout: str
    stderr: str


class VM:
    """One running guest. `start()` boots and waits for the command server; `run()` executes a
    command; `stop()` ends QEMU and vng by PID and removes the shared directory."""

    def __init__(self, k: Kernel, name: str, workdir: Path | None = None, cpus: int = VM_CPUS,
                 memory: str = VM_MEMORY, rwdirs: Sequence[str] = (), accel_mode: str | None = None,
                 netns: str | None = None, nics: Sequence[tuple[str, str]] = ()) -> None:
        self.kernel = k
        self.name = name
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix=f"{name}-", dir="/run"))
        self.cpus = cpus
        self.memory = memory
        self.rwdirs = list(rwdirs)
        self.accel = accel_mode or accel(k)
        # NICs: (tap, MAC) pairs; the taps exist in `netns` (a lab namespace: QEMU runs there to
        # open them, so the guest's wires end on the lab's bridges and never in the host's namespace).
        self.netns = netns
        self.nics = list(nics)
        self.pid: int | None = None
        self.qemu_pid: int | None = None
        self.boot_seconds: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    # -- paths inside the shared directory
    @property
    def shared(self) -> Path:
        return self.workdir / "shared"

    def command(self) -> list[str]:
        """The vng command line that boots this VM with the guest server as its init's command."""
        serve = imports.guest_command(self.shared,
                                      [sys.executable, "-m", "meshctl.lab.vms.vm", "serve", str(self.shared)])
        qemu = [f"-pidfile {self.workdir / 'qemu.pid'}"]
        for i, (tap, mac) in enumerate(self.nics):
            qemu.append(f"-netdev tap,id=mn{i},ifname={tap},script=no,downscript=no "
                        f"-device virtio-net-pci,netdev=mn{i},mac={mac}")
        cmd = [_vng(), "--run", str(self.kernel.image), "--force-9p", "--cpus", str(self.cpus),
               "--memory", self.memory, "--name", self.name, "--rwdir", str(self.shared), "--cwd", "/",
               f"--qemu-opts={' '.join(qemu)}", "--exec", serve]
        if self.accel != "kvm":
            cmd.insert(3, "--disable-kvm")
        for d in self.rwdirs:
            cmd += ["--rwdir", d]
        return [*exec_prefix(self.netns), *cmd]

    def start(self, timeout: float = BOOT_TIMEOUT) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.workdir, 0o700)
        for d in ("req", "out"):
            (self.shared / d).mkdir(parents=True, exist_ok=True)
        imports.write_pack(self.shared)
        log = open(self.workdir / "console.log", "wb")  # noqa: SIM115 - handed to the child
        t0 = time.monotonic()
        self._proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                      env=_env(), cwd=str(self.workdir), start_new_session=True)
        log.close()
        self.pid = self._proc.pid
        self._save()
        ready = self.shared / "ready"
        try:
            while not ready.exists():
                if self._proc.poll() is not None:
                    raise MeshError(f"VM {self.name} ({self.kernel.series}) exited during boot: {self._console_tail()}")
                if time.monotonic() - t0 > timeout:
                    raise MeshError(f"VM {self.name} ({self.kernel.series}) did not boot within {timeout:.0f} s "
                                    f"({self.accel}): {self._console_tail()}")
                time.sleep(0.2)
        except BaseException:
            self.stop()
            raise
        self.boot_seconds = time.monotonic() - t0
        self._read_qemu_pid()
        self._save()

    def _read_qemu_pid(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.qemu_pid = int((self.workdir / "qemu.pid").read_text().strip())

    def _console_tail(self, n: int = 1) -> str:
        """The console's last `n` lines (a panic's reason is a few lines above its end)."""
        try:
            lines = (self.workdir / "console.log").read_text(errors="replace").strip().splitlines()
        except OSError:
            return "no console output"
        return " | ".join(lines[-n:]) if lines else "no console output"

    def _save(self) -> None:
        (self.workdir / "vm.json").write_text(json.dumps(to_json(self.describe()), sort_keys=True))

    def describe(self) -> VmRecord:
        """What `attach()` needs to find this VM again from another process."""
        return VmRecord(name=self.name, series=self.kernel.series, version=self.kernel.version,
                        workdir=str(self.workdir), pid=self.pid, qemu_pid=self.qemu_pid, accel=self.accel,
                        boot_seconds=self.boot_seconds, cpus=self.cpus, memory=self.memory, netns=self.netns,
                        nics=[list(n) for n in self.nics])

    @classmethod
    def attach(cls, desc: VmRecord) -> VM:
        """The VM described by `describe()` (started by another process)."""
        vm = cls(kernel(desc.series), desc.name, Path(desc.workdir), accel_mode=desc.accel)
        vm.pid, vm.qemu_pid, vm.boot_seconds = desc.pid, desc.qemu_pid, desc.boot_seconds
        return vm

    def alive(self) -> bool:
        return any(pid_alive(p) for p in (self.pid, self.qemu_pid) if p)

    def run(self, argv: Sequence[str], timeout: float | None = None, env: dict[str, str] | None = None,
            cwd: str = "/", on_output: Callable[[str, str], None] | None = None) -> Result:
        """Run `argv` in the guest as root. `on_output(stream, text)` sees stdout/stderr as they grow
        (e.g. to echo a long `lab up`). Raises MeshError when the VM is gone or `timeout` passes."""
        rid = uuid.uuid4().hex
        req = {"argv": list(argv), "env": env or {}, "cwd": cwd, "timeout": timeout}
        tmp = self.shared / "req" / f".{rid}.tmp"
        tmp.write_text(json.dumps(req))
        os.replace(tmp, self.shared / "req" / f"{rid}.json")
        out = {s: self.shared / "out" / f"{rid}.{s}" for s in ("stdout", "stderr")}
        rc_file = self.shared / "out" / f"{rid}.rc"
        seen = {"stdout": 0, "stderr": 0}
        texts: dict[str, list[str]] = {"stdout": [], "stderr": []}
        deadline = None if timeout is None else time.monotonic() + timeout + 10

        def drain() -> None:
            for s, path in out.items():
                with contextlib.suppress(FileNotFoundError), open(path, "rb") as f:
                    f.seek(seen[s])
                    data = f.read()
                    if data:
                        seen[s] += len(data)
                        text = data.decode(errors="replace")
                        texts[s].append(text)
                        if on_output:
                            on_output(s, text)

        try:
            while not rc_file.exists():
                drain()
                if not self.alive():
                    raise MeshError(f"VM {self.name} stopped while running {shlex.join(argv)} "
                                    f"(console: {self._console_tail(PANIC_CONTEXT)})")
                if deadline is not None and time.monotonic() > deadline:
                    raise MeshError(f"{shlex.join(argv)} did not finish in the VM within {timeout} s")
                time.sleep(POLL)
            drain()
            done = json.loads(rc_file.read_text() or "{}")
            if done.get("timed_out"):
                raise MeshError(f"{shlex.join(argv)} did not finish in the VM within {timeout} s (killed)")
            rc = int(done.get("rc", 1))
        finally:
            for p in (*out.values(), rc_file):
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
        return Result(rc, "".join(texts["stdout"]), "".join(texts["stderr"]))

    def stop(self, grace: float = 5.0) -> None:
        """Power the guest off: QEMU and vng by their PIDs (TERM, then KILL), then the shared dir."""
        self._read_qemu_pid()
        for pid in (self.qemu_pid, self.pid):
            if pid and pid_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and self.alive():
            self._reap()
            time.sleep(0.1)
        for pid in (self.qemu_pid, self.pid):
            if pid and pid_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self._reap(wait=True)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def _reap(self, wait: bool = False) -> None:
        if self._proc is not None:
            if wait:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(timeout=5)
            else:
                self._proc.poll()

    def __enter__(self) -> VM:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# The program variants the matrix's kernels load (meshctl.datapath.features.OPTIONAL): this host's
# and 6.12's (everything), 6.1's (no decapsulation flags: 6.3), 5.10's (no bpf_check_mtu: 5.12, no
# BPF_F_ADJ_ROOM_ENCAP_L2_ETH: 5.18, no decapsulation flags).
BPF_VARIANTS = ("", "adjust_room_decap_l3", "check_mtu,adjust_room_encap_l2_eth,adjust_room_decap_l3")


def lease_ttl(file_ttl: int | None, accel_mode: str) -> int | None:
    """The agents' lease in a lab of VMs: the file's lab.lease_ttl when it sets one, else
    EMULATED_LEASE_TTL without KVM, else None (the lab's default). One rule for the one-VM lab
    (vmlab) and the multi-VM lab (vmnodes)."""
    return file_ttl if file_ttl is not None or accel_mode == "kvm" else EMULATED_LEASE_TTL


def agent_args(file_args: Sequence[str], accel_mode: str) -> tuple[str, ...]:
    """The agents' extra arguments in a lab of VMs: the file's lab.agent_args, with RESYNC_FLAG
    EMULATED_RESYNC_S added without KVM when they do not set it. One rule for the one-VM lab
    (vmlab) and the multi-VM lab (vmnodes), as lease_ttl."""
    if accel_mode == "kvm" or any(a == RESYNC_FLAG or a.startswith(f"{RESYNC_FLAG}=") for a in file_args):
        return tuple(file_args)
    return (*file_args, RESYNC_FLAG, f"{EMULATED_RESYNC_S:g}")


def warm_bpf_cache() -> bool:
    """Compile the datapath here, on the host, into the compiled-object cache that the guests see
    (/var/lib is shared read-only), once per variant the matrix's kernels need, so no guest runs bcc
    under emulation. Each variant compiles in a child (the feature probe is per process). False when
    this host cannot compile (the guests' agents then compile, slowly, or fall back)."""
    ok = True
    for without in BPF_VARIANTS:
        p = subprocess.run([sys.executable, "-m", "meshctl.lab.vms.vm", "warm"],
                           env=dict(_env(), **{WITHOUT_ENV: without}), capture_output=True, text=True, timeout=300)
        ok = ok and p.returncode == 0
    return ok


def _warm_here() -> bool:
    """warm_bpf_cache's child: compile and load once into the cache, unless it already holds these programs."""
    if (objcache.cache_dir() / f"{loader.object_key()}.json").exists():
        return True
    pin_dir = f"/sys/fs/bpf/vm-warm-{os.getpid()}"
    try:
        loader.ensure_bpffs(pin_dir)
        loaded = loader.load(pin_dir)
        loaded.close()
    except (MeshError, OSError, ImportError):
        return False
    finally:
        loader.remove_maps_and_progs(pin_dir)
        shutil.rmtree(pin_dir, ignore_errors=True)
    return (objcache.cache_dir() / f"{loader.object_key()}.json").exists()


# -- the guest side ---------------------------------------------------------------------------


def _guest_setup() -> None:
    """What the lab needs that vng's init does not do: bpffs, and /dev/net/tun for wireguard-go
    (Debian builds tun as a module: loading it makes the device node)."""
    if not os.path.ismount("/sys/fs/bpf"):
        subprocess.run(["mount", "-t", "bpf", "bpf", "/sys/fs/bpf"], check=False)
    if not os.path.exists("/dev/net/tun"):
        subprocess.run(["modprobe", "tun"], check=False, capture_output=True)
    for d in ("/run/netns", "/var/run/netns"):
        with contextlib.suppress(OSError):
            os.makedirs(d, exist_ok=True)


def _serve_one(shared: Path, req_path: Path) -> None:
    rid = req_path.stem
    try:
        req = json.loads(req_path.read_text())
    except (OSError, ValueError):
        return
    with contextlib.suppress(FileNotFoundError):
        req_path.unlink()
    out = shared / "out"
    env = dict(os.environ)
    env.update(req.get("env") or {})
    rc, timed_out = 127, False
    cwd = req.get("cwd") or "/"
    with open(out / f"{rid}.stdout", "wb", buffering=0) as so, open(out / f"{rid}.stderr", "wb", buffering=0) as se:
        try:
            warm = zygote.forkable(req["argv"])
            if warm is not None:
                zygote.await_warm(req.get("timeout"))
                pid = zygote.spawn(*warm, stdout=so.fileno(), stderr=se.fileno(), env=env, cwd=cwd)
                rc, timed_out = zygote.wait(pid, req.get("timeout"))
            else:
                p = subprocess.Popen(req["argv"], stdin=subprocess.DEVNULL, stdout=so, stderr=se, env=env, cwd=cwd)
                try:
                    rc = p.wait(timeout=req.get("timeout"))
                except subprocess.TimeoutExpired:
                    p.kill()
                    rc, timed_out = p.wait(), True
        except OSError as e:
            se.write(f"{e}\n".encode())
    tmp = out / f".{rid}.rc.tmp"
    tmp.write_text(json.dumps({"rc": rc, "timed_out": timed_out}))
    os.replace(tmp, out / f"{rid}.rc")


def serve(shared: Path) -> None:
    """Guest: run every request that appears in `shared`/req, each in its own thread, forever."""
    _guest_setup()
    zygote.warm_in_background()
    info = {"kernel": os.uname().release, "uptime": Path("/proc/uptime").read_text().split()[0]}
    (shared / "ready").write_text(json.dumps(info))
    req_dir = shared / "req"
    last = time.monotonic()
    while True:
        for p in sorted(req_dir.glob("*.json")):
            claimed = p.with_suffix(".run")
            try:
                os.rename(p, claimed)
            except OSError:
                continue
            last = time.monotonic()
            threading.Thread(target=_serve_one, args=(shared, claimed), daemon=True).start()
        time.sleep(POLL if time.monotonic() - last < IDLE_AFTER else IDLE_POLL)


def echo(stream: str, text: str) -> None:
    """An `on_output` that passes the guest's output through to ours, stream for stream."""
    (sys.stdout if stream == "stdout" else sys.stderr).write(text)
    (sys.stdout if stream == "stdout" else sys.stderr).flush()


def _run_once(series: str, argv: list[str], name: str) -> int:
    vm = VM(kernel(series), name)
    try:
        vm.start()
        print(f"vm: {series} ({vm.kernel.version}) booted in {vm.boot_seconds:.1f} s ({vm.accel})", file=sys.stderr)
        res = vm.run(argv, on_output=echo)
        return res.rc
    finally:
        vm.stop()


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "serve":
        serve(Path(argv[1]))
        return 0
    if len(argv) >= 3 and argv[0] == "run" and "--" in argv:
        sep = argv.index("--")
        try:
            return _run_once(argv[1], argv[sep + 1:], "vm-run")
        except MeshError as e:
            print(str(e), file=sys.stderr)
            return 1
    if argv == ["warm"]:
        return 0 if _warm_here() else 1
    if argv == ["accel"]:
        print(accel())
        return 0
    print("usage: python -m meshctl.lab.vms.vm serve DIR | run SERIES -- CMD... | accel", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
