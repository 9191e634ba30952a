# SPDX-License-Identifier: Apache-2.0
"""Guest side: one warm interpreter that forks `python -m MODULE ARGS` instead of starting it.

A guest reads the host's files over 9p under emulation: a fresh `python -m meshctl.cli` imports
~640 modules and took three minutes on a loaded two-core host, so each node command (a `maps dump`,
an agent start) paid that again. The guest's request server imports the lab's entry modules once,
in the background, and runs such a command in a forked child, where every import is already done
(one that comes earlier waits for the imports). Anything else runs as a new process."""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import runpy
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Mapping, Sequence

from meshctl.setns import join_netns

# What the guest runs as `python -m`: the CLI (node commands, the agent) and the node's own set-up.
WARM_MODULES = ("meshctl.cli", "meshctl.lab.vms.vmnodes")
# ... and what the warm server imports: those, and what an agent forked from it would import next.
WARM_IMPORTS = (*WARM_MODULES, "meshctl.agent.run")
_WAIT_STEP = 0.05
_MAX_FD = 65536

_ready = threading.Event()


def warm_in_background() -> None:
    """Import WARM_IMPORTS in a thread; `forkable` holds only once every import has finished, so
    no fork happens while a module lock is held."""

    def warm() -> None:
        for name in WARM_IMPORTS:
            with contextlib.suppress(Exception):
                importlib.import_module(name)
        _ready.set()

    threading.Thread(target=warm, name="zygote-warm", daemon=True).start()


def forkable(argv: Sequence[str]) -> tuple[str, list[str]] | None:
    """(module, args) when `argv` is `<this python> -m <a warm module> ...`."""
    if len(argv) >= 3 and argv[0] == sys.executable and argv[1] == "-m" and argv[2] in WARM_MODULES:
        return argv[2], list(argv[3:])
    return None


def warm_here() -> bool:
    """Whether this process is a warm server (its imports done) or a child forked from one: only
    there is forking a command cheaper, and known safe, than starting it."""
    return _ready.is_set()


def split_netns(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """(namespace file, the command) of `nsenter --net=FILE -- COMMAND...` (node.shell.exec_prefix's
    form), so a command bound for a lab node's namespace can be forked too; (None, argv) otherwise."""
    if len(argv) >= 3 and argv[0] == "nsenter" and argv[1].startswith("--net=") and argv[2] == "--":
        return argv[1].removeprefix("--net="), list(argv[3:])
    return None, list(argv)


def await_warm(timeout: float | None) -> None:
    """Wait for the imports (at most `timeout`): a command that came before them would only import
    the same modules again, beside them, and finish no sooner."""
    _ready.wait(timeout)


def _exit_code(e: SystemExit) -> int:
    if e.code is None or isinstance(e.code, int):
        return e.code or 0
    print(e.code, file=sys.stderr)
    return 1


def _run_module_here(module: str, args: list[str]) -> int:
    """In the forked child: run the module as `__main__` with `args`, as `python -m` would."""
    sys.argv = [module, *args]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # "found in sys.modules": it is, by design
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        return 0
    except SystemExit as e:
        return _exit_code(e)
    except BaseException:  # noqa: BLE001 - the child reports any failure as python would
        traceback.print_exc()
        return 1


def spawn(module: str, args: list[str], *, stdout: int, stderr: int, env: Mapping[str, str], cwd: str = "/",
          new_session: bool = False, netns: str | None = None) -> int:
    """Fork a child that runs `python -m module args` with these descriptors, environment and
    directory, in the network namespace file `netns` (None: this one); its PID. The child never
    returns into the caller's code."""
    pid = os.fork()
    if pid:
        return pid
    # The child closes every inherited descriptor above stderr, but the parent's Python objects
    # that owned them are still here; were the collector to free one (garbage of the parent not yet
    # collected at the fork), its finaliser would close the number again, by then the child's own
    # socket (an agent's status listener vanished so). Frozen objects are never collected.
    gc.freeze()
    code = 1
    try:
        if new_session:
            os.setsid()
        if netns is not None:
            fd = os.open(netns, os.O_RDONLY)
            join_netns(fd, netns)  # the child has one thread: the whole process moves
            os.close(fd)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(stdout, 1)
        os.dup2(stderr, 2)
        os.closerange(3, _MAX_FD)  # other requests' files, the server's directory handles
        sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
        sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        code = _run_module_here(module, args)
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def wait(pid: int, timeout: float | None) -> tuple[int, bool]:
    """(exit status, timed out) of a spawned child; SIGKILL once `timeout` passes."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status), False
        if deadline is not None and time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            return os.waitstatus_to_exitcode(status), True
        time.sleep(_WAIT_STEP)
