# SPDX-License-Identifier: Apache-2.0
"""The few libbpf calls the datapath needs, through ctypes (libbpf.so.1 ships with bpftool/bcc).

Why libbpf and not bcc for these: pinned maps and programs must be reopened by a restarted agent
without compiling anything, links (tcx) are newer than bcc 0.26, and batch map operations are
what keeps a 100,000-entry sync well under a second.

libbpf >= 1.0 returns -errno; every wrapper turns that into OSError.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import struct
from functools import cache
from typing import TypeVar

BPF_PROG_TYPE_SCHED_CLS = 3  # every program here is a tc classifier (datapath.c's and the probes')
BPF_TCX_INGRESS = 46
BPF_TCX_EGRESS = 47
BPF_ANY = 0
BPF_NOEXIST = 1
LICENSE = b"GPL"  # the programs call GPL-only helpers
INSN = struct.Struct("<BBhi")  # struct bpf_insn: code, dst|src regs, off, imm


class TestRunOpts(ctypes.Structure):
    """struct bpf_test_run_opts (libbpf 1.1)."""

    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("data_in", ctypes.c_void_p),
        ("data_out", ctypes.c_void_p),
        ("data_size_in", ctypes.c_uint32),
        ("data_size_out", ctypes.c_uint32),
        ("ctx_in", ctypes.c_void_p),
        ("ctx_out", ctypes.c_void_p),
        ("ctx_size_in", ctypes.c_uint32),
        ("ctx_size_out", ctypes.c_uint32),
        ("retval", ctypes.c_uint32),
        ("repeat", ctypes.c_int),
        ("duration", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("cpu", ctypes.c_uint32),
        ("batch_size", ctypes.c_uint32),
    ]


class BatchOpts(ctypes.Structure):
    """struct bpf_map_batch_opts."""

    _fields_ = [("sz", ctypes.c_size_t), ("elem_flags", ctypes.c_uint64), ("flags", ctypes.c_uint64)]


class MapCreateOpts(ctypes.Structure):
    """struct bpf_map_create_opts (libbpf 1.x)."""

    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("btf_fd", ctypes.c_uint32),
        ("btf_key_type_id", ctypes.c_uint32),
        ("btf_value_type_id", ctypes.c_uint32),
        ("btf_vmlinux_value_type_id", ctypes.c_uint32),
        ("inner_map_fd", ctypes.c_uint32),
        ("map_flags", ctypes.c_uint32),
        ("map_extra", ctypes.c_uint64),
        ("numa_node", ctypes.c_uint32),
        ("map_ifindex", ctypes.c_uint32),
    ]


class MapInfo(ctypes.Structure):
    """The head of struct bpf_map_info (the kernel fills what fits in the size we pass)."""

    _fields_ = [
        ("type", ctypes.c_uint32),
        ("id", ctypes.c_uint32),
        ("key_size", ctypes.c_uint32),
        ("value_size", ctypes.c_uint32),
        ("max_entries", ctypes.c_uint32),
        ("map_flags", ctypes.c_uint32),
        ("name", ctypes.c_char * 16),
    ]


class ProgInfo(ctypes.Structure):
    """The head of struct bpf_prog_info: type, id, tag."""

    _fields_ = [("type", ctypes.c_uint32), ("id", ctypes.c_uint32), ("tag", ctypes.c_uint8 * 8)]


class LinkInfo(ctypes.Structure):
    """struct bpf_link_info up to its tcx member (union at offset 16: ifindex, attach_type)."""

    _fields_ = [
        ("type", ctypes.c_uint32),
        ("id", ctypes.c_uint32),
        ("prog_id", ctypes.c_uint32),
        ("_pad", ctypes.c_uint32),
        ("ifindex", ctypes.c_uint32),
        ("attach_type", ctypes.c_uint32),
        ("_rest", ctypes.c_uint64 * 6),
    ]


# int (*ring_buffer_sample_fn)(void *ctx, void *data, size_t size)
RingSampleFn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)


@cache
def lib() -> ctypes.CDLL:
    """libbpf, or OSError when it is not installed (the caller falls back to kernel routes)."""
    name = ctypes.util.find_library("bpf") or "libbpf.so.1"
    so = ctypes.CDLL(name, use_errno=True)
    vp, u32, i = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int
    sigs = {
        "bpf_obj_get": ([ctypes.c_char_p], i),
        "bpf_obj_pin": ([i, ctypes.c_char_p], i),
        "bpf_map_lookup_elem": ([i, vp, vp], i),
        "bpf_map_update_elem": ([i, vp, vp, ctypes.c_uint64], i),
        "bpf_map_delete_elem": ([i, vp], i),
        "bpf_map_get_next_key": ([i, vp, vp], i),
        "bpf_map_lookup_batch": ([i, vp, vp, vp, vp, ctypes.POINTER(u32), ctypes.POINTER(BatchOpts)], i),
        "bpf_map_update_batch": ([i, vp, vp, ctypes.POINTER(u32), ctypes.POINTER(BatchOpts)], i),
        "bpf_map_delete_batch": ([i, vp, ctypes.POINTER(u32), ctypes.POINTER(BatchOpts)], i),
        "bpf_link_create": ([i, i, i, vp], i),
        "bpf_link_update": ([i, i, vp], i),
        "bpf_obj_get_info_by_fd": ([i, vp, ctypes.POINTER(u32)], i),
        "bpf_prog_test_run_opts": ([i, ctypes.POINTER(TestRunOpts)], i),
        "bpf_prog_load": ([i, ctypes.c_char_p, ctypes.c_char_p, vp, ctypes.c_size_t, vp], i),
        "bpf_map_create": ([i, ctypes.c_char_p, u32, u32, u32, ctypes.POINTER(MapCreateOpts)], i),
        "libbpf_num_possible_cpus": ([], i),
        "libbpf_probe_bpf_helper": ([i, i, vp], i),
        "libbpf_probe_bpf_map_type": ([i, vp], i),
        "ring_buffer__new": ([i, RingSampleFn, vp, vp], vp),
        "ring_buffer__poll": ([vp, i], i),
        "ring_buffer__free": ([vp], None),
    }
    for fn, (args, res) in sigs.items():
        f = getattr(so, fn)
        f.argtypes, f.restype = args, res
    return so


def _check(ret: int, what: str) -> int:
    if ret < 0:
        code = -ret if ret != -1 else (ctypes.get_errno() or errno.EIO)
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return ret


def obj_get(path: str) -> int:
    return _check(lib().bpf_obj_get(path.encode()), f"bpf_obj_get {path}")


def obj_pin(fd: int, path: str) -> None:
    _check(lib().bpf_obj_pin(fd, path.encode()), f"bpf_obj_pin {path}")


def unpin(path: str) -> None:
    """Remove a pin; quiet when it is already gone. The object lives on while anything holds it."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def prog_load(name: str, insns: bytes | bytearray) -> int:
    """A tc classifier from raw instructions (map fds already in place): its fd, or OSError
    naming it when the kernel refuses it."""
    buf = ctypes.create_string_buffer(bytes(insns), len(insns))
    return _check(lib().bpf_prog_load(BPF_PROG_TYPE_SCHED_CLS, name.encode()[:15], LICENSE, ctypes.addressof(buf),
                                      len(insns) // INSN.size, None), f"BPF_PROG_LOAD {name}")


def map_create(name: str, map_type: int, key_size: int, value_size: int, max_entries: int, map_flags: int) -> int:
    """A new map's fd, or OSError naming it."""
    opts = MapCreateOpts(sz=ctypes.sizeof(MapCreateOpts), map_flags=map_flags)
    return _check(lib().bpf_map_create(map_type, name.encode()[:15], key_size, value_size, max_entries,
                                       ctypes.byref(opts)), f"bpf_map_create {name}")


def probe_helper(helper: int) -> bool:
    """Whether a tc classifier may call BPF_FUNC `helper` on this kernel (libbpf's probe)."""
    return bool(lib().libbpf_probe_bpf_helper(BPF_PROG_TYPE_SCHED_CLS, helper, None) == 1)


def probe_map_type(map_type: int) -> bool:
    """Whether this kernel creates maps of BPF_MAP_TYPE `map_type` (libbpf's probe)."""
    return bool(lib().libbpf_probe_bpf_map_type(map_type, None) == 1)


def possible_cpus() -> int:
    return _check(lib().libbpf_num_possible_cpus(), "libbpf_num_possible_cpus")


InfoT = TypeVar("InfoT", "MapInfo", "ProgInfo", "LinkInfo")


def _info(fd: int, cls: type[InfoT]) -> InfoT:
    """bpf_obj_get_info_by_fd into the head of the kernel's info struct (it fills what fits)."""
    info = cls()
    n = ctypes.c_uint32(ctypes.sizeof(info))
    _check(lib().bpf_obj_get_info_by_fd(fd, ctypes.byref(info), ctypes.byref(n)), f"{cls.__name__} of fd {fd}")
    return info


def map_info(fd: int) -> MapInfo:
    return _info(fd, MapInfo)


def prog_info(fd: int) -> ProgInfo:
    return _info(fd, ProgInfo)


def link_info(fd: int) -> LinkInfo:
    return _info(fd, LinkInfo)


def lookup(fd: int, key: bytes, value_size: int) -> bytes | None:
    out = ctypes.create_string_buffer(value_size)
    ret = lib().bpf_map_lookup_elem(fd, key, out)
    if ret == -errno.ENOENT:
        return None
    _check(ret, "bpf_map_lookup_elem")
    return out.raw


def update(fd: int, key: bytes, value: bytes, flags: int = BPF_ANY) -> None:
    _check(lib().bpf_map_update_elem(fd, key, value, flags), "bpf_map_update_elem")


def delete(fd: int, key: bytes) -> bool:
    ret = lib().bpf_map_delete_elem(fd, key)
    if ret == -errno.ENOENT:
        return False
    _check(ret, "bpf_map_delete_elem")
    return True


def keys(fd: int, key_size: int) -> list[bytes]:
    """Every key, by get_next_key (works on every map type, including the LPM trie)."""
    out: list[bytes] = []
    cur = None
    nxt = ctypes.create_string_buffer(key_size)
    while True:
        ret = lib().bpf_map_get_next_key(fd, cur, nxt)
        if ret == -errno.ENOENT:
            return out
        _check(ret, "bpf_map_get_next_key")
        out.append(nxt.raw)
        cur = ctypes.create_string_buffer(nxt.raw, key_size)


def empty(fd: int, key_size: int) -> bool:
    """Whether the map holds no key: one get_next_key (any map type)."""
    ret = lib().bpf_map_get_next_key(fd, None, ctypes.create_string_buffer(key_size))
    if ret == -errno.ENOENT:
        return True
    _check(ret, "bpf_map_get_next_key")
    return False


def lookup_batch(fd: int, key_size: int, value_size: int, max_entries: int) -> list[tuple[bytes, bytes]]:
    """Every (key, value) in few syscalls. Raises OSError(EINVAL/ENOTSUPP) where the map type has
    no batch lookup; the caller then walks keys."""
    chunk = min(max(max_entries, 1), 65536)
    keys_buf = ctypes.create_string_buffer(key_size * chunk)
    vals_buf = ctypes.create_string_buffer(value_size * chunk)
    opts = BatchOpts(ctypes.sizeof(BatchOpts), 0, 0)
    out: list[tuple[bytes, bytes]] = []
    in_batch = None
    out_batch = ctypes.create_string_buffer(max(key_size, 8))
    while True:
        count = ctypes.c_uint32(chunk)
        ret = lib().bpf_map_lookup_batch(fd, in_batch, out_batch, keys_buf, vals_buf, ctypes.byref(count), opts)
        n = count.value
        if ret < 0 and ret != -errno.ENOENT:
            _check(ret, "bpf_map_lookup_batch")
        kr, vr = keys_buf.raw, vals_buf.raw
        out.extend((kr[i * key_size:(i + 1) * key_size], vr[i * value_size:(i + 1) * value_size]) for i in range(n))
        if ret == -errno.ENOENT:
            return out
        in_batch = ctypes.create_string_buffer(out_batch.raw)


def update_batch(fd: int, keys_blob: bytes, values_blob: bytes, count: int) -> None:
    if count == 0:
        return
    opts = BatchOpts(ctypes.sizeof(BatchOpts), 0, 0)
    n = ctypes.c_uint32(count)
    _check(lib().bpf_map_update_batch(fd, keys_blob, values_blob, ctypes.byref(n), opts), "bpf_map_update_batch")


def delete_batch(fd: int, keys_blob: bytes, count: int) -> None:
    if count == 0:
        return
    opts = BatchOpts(ctypes.sizeof(BatchOpts), 0, 0)
    n = ctypes.c_uint32(count)
    _check(lib().bpf_map_delete_batch(fd, keys_blob, ctypes.byref(n), opts), "bpf_map_delete_batch")


def link_create(prog_fd: int, ifindex: int, attach_type: int) -> int:
    return _check(lib().bpf_link_create(prog_fd, ifindex, attach_type, None), "bpf_link_create")


def link_update(link_fd: int, prog_fd: int) -> None:
    _check(lib().bpf_link_update(link_fd, prog_fd, None), "bpf_link_update")


def test_run(prog_fd: int, data: bytes, repeat: int = 1, ctx: bytes = b"") -> tuple[int, int, bytes, bytes]:
    """BPF_PROG_TEST_RUN: (program return value, mean ns per run, packet as the program left it,
    context as the program left it). `ctx` is the head of a struct __sk_buff (e.g. to set mark)."""
    inb = ctypes.create_string_buffer(data, len(data))
    size = len(data) + 256
    outb = ctypes.create_string_buffer(size)
    opts = TestRunOpts()
    opts.sz = ctypes.sizeof(TestRunOpts)
    opts.data_in = ctypes.cast(inb, ctypes.c_void_p)
    opts.data_size_in = len(data)
    opts.data_out = ctypes.cast(outb, ctypes.c_void_p)
    opts.data_size_out = size
    opts.repeat = repeat
    if ctx:
        ctx_in = ctypes.create_string_buffer(ctx, len(ctx))
        ctx_out = ctypes.create_string_buffer(256)  # >= sizeof(struct __sk_buff)
        opts.ctx_in = ctypes.cast(ctx_in, ctypes.c_void_p)
        opts.ctx_size_in = len(ctx)
        opts.ctx_out = ctypes.cast(ctx_out, ctypes.c_void_p)
        opts.ctx_size_out = 256
    _check(lib().bpf_prog_test_run_opts(prog_fd, ctypes.byref(opts)), "bpf_prog_test_run_opts")
    return opts.retval, opts.duration, outb.raw[: opts.data_size_out], ctx_out.raw if ctx else b""


class RingBuffer:
    """A reader of one BPF_MAP_TYPE_RINGBUF map (libbpf's ring_buffer__new/poll): poll() returns
    the records that arrived, each as bytes. The map fd stays the caller's."""

    def __init__(self, map_fd: int) -> None:
        self._got: list[bytes] = []

        def sample(_ctx: int | None, data: int | None, size: int) -> int:
            self._got.append(ctypes.string_at(data or 0, size))
            return 0

        self._cb = RingSampleFn(sample)  # kept: libbpf calls it for as long as the ring lives
        ctypes.set_errno(0)
        rb = lib().ring_buffer__new(map_fd, self._cb, None, None)
        if not rb:
            code = ctypes.get_errno() or errno.EINVAL
            raise OSError(code, f"ring_buffer__new: {os.strerror(code)}")
        self._rb: int | None = rb

    def poll(self, timeout_ms: int) -> list[bytes]:
        """The records that arrive within `timeout_ms` (0: only those waiting now). A signal ends
        the wait early (the caller's handler then runs)."""
        if self._rb is None:
            return []
        ret = lib().ring_buffer__poll(self._rb, timeout_ms)
        if ret < 0 and ret != -errno.EINTR:
            _check(ret, "ring_buffer__poll")
        got, self._got = self._got, []
        return got

    def close(self) -> None:
        if self._rb is not None:
            lib().ring_buffer__free(self._rb)
            self._rb = None
