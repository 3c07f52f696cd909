"""FAKES of kvikio and of CUDA device memory, for machines without a GPU.

kvikio imports here (tests/test_kvikio_real.py runs the engine against the real package), but
every I/O call needs libcuda.so.1. So the gds engine's kvikio path is also run against
`FakeKvikio`, which follows the contracts of the real library (kvikio 26.10, read from its
sources: python/kvikio/kvikio/{__init__,cufile,defaults,cufile_driver,buffer}.py,
cpp/src/{file_handle,buffer,defaults}.cpp and cpp/include/kvikio/detail/parallel_operation.hpp)
where ckptbench depends on them, and stands in only where the hardware is needed. Its surface is
held against the real package by `test_the_fakes_surface_is_the_real_one`.

- A package of modules, imported through the import system (`FakeKvikio.install`): `import
  kvikio` gives the package alone; `kvikio.defaults` and `kvikio.cufile_driver` become its
  attributes only once imported, as the real `__init__.py` imports neither.
- `CuFile(file, flags)`: each handle decides at open time, from the `compat_mode` setting then in
  force, whether it uses cuFile or POSIX. OFF raises when cuFile cannot register the file; AUTO
  falls back to POSIX for that file silently (there is no per-handle query). A file that cannot
  be opened is a RuntimeError, as kvikio's C++ exceptions all are.
- `pwrite`/`pread(buf, size=None, file_offset=0, task_size=None)` return an IOFuture (`get()`,
  `done()`) whose work runs on the fake's thread pool (`num_threads` threads), split into tasks of
  `task_size`, as kvikio's parallel_io does; the buffer is not kept alive by the future (kvikio
  keeps only its address). `buf` is device memory if it has `__cuda_array_interface__`, else
  anything with the buffer protocol (host memory, always written through POSIX); anything else
  is a TypeError (a torch CPU tensor has neither), a non-contiguous buffer or a size beyond the
  buffer a ValueError. Device requests smaller than `gds_threshold` are done inside the call,
  through POSIX, and return a ready future. Failed I/O is a RuntimeError, from `get()` or from
  the call.
- `defaults.get(name)` / `defaults.set(name, value)` or `set({...})` (positional only): applied
  at once, usable as a context manager (whose `__enter__` returns None) that restores the old
  values; unknown names are a KeyError, a zero num_threads a ValueError, a compat_mode that is
  not a CompatMode a TypeError. Setting `num_threads` rebuilds the thread pool (`pool_resets`
  counts it). The defaults are kvikio's (num_threads 1, task_size 4 MiB, gds_threshold 16 KiB,
  compat_mode AUTO).
- `cufile_driver.properties` (`is_gds_available`, `allow_compat_mode`, ...) and
  `cufile_driver.libcufile_version()`.
- `memory_register`/`memory_deregister(buf)`: register the whole CUDA allocation that holds
  `buf` (found through `FakeCuda.allocation_of`, as kvikio uses cuMemGetAddressRange); a second
  registration inside a registered allocation is CU_FILE_MEMORY_ALREADY_REGISTERED and
  deregistering an unregistered one CU_FILE_MEMORY_NOT_REGISTERED (RuntimeErrors); no-ops while
  compat mode is preferred; host memory is a RuntimeError (not device memory).
- nvidia-fs's statistics file (`nvfs_stats`, a path the tests point the engine at): the bytes
  that went GPU-direct are counted there, floored to MiB, in the driver's format; `nvfs_io_stats`
  False prints it as the driver does with its IO statistics off (no byte counts).

The fake writes and reads real files with os.pwrite/os.pread and records every call: which
route its bytes took (`gds`, `posix` or `cufile-compat`: cuFile's own POSIX fallback when the
nvidia-fs driver is absent and cufile.json allows compat mode), and the settings in force.

`FakeCuda` stands in for CUDA device memory: host tensors it allocated count as "device" tensors
for the gds engine (through the seam functions in bench.engines.gds), handed to kvikio wrapped in
an object with `__cuda_array_interface__`, as torch CUDA tensors are. It packs allocations into
segments as torch's caching allocator does, so that several tensors share one CUDA allocation.
"""

from __future__ import annotations

import ctypes
import enum
import importlib.abc
import importlib.machinery
import os
import sys
import threading
import types
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

MiB = 1 << 20


class CompatMode(enum.IntEnum):
    """kvikio.CompatMode."""

    OFF = 0
    ON = 1
    AUTO = 2


DEFAULTS = {
    "compat_mode": CompatMode.AUTO,
    "num_threads": 1,
    "task_size": 4 * MiB,
    "gds_threshold": 16 << 10,
    "bounce_buffer_size": 16 * MiB,
}


def kvikio_failure(what: str) -> RuntimeError:
    """A kvikio C++ exception as Python sees it."""
    return RuntimeError(f"KvikIO failure at: fake_kvikio: {what}")


@dataclass(frozen=True)
class Call:
    """One pwrite or pread: file, size, offset, the buffer's kind and the route its bytes took,
    and the settings in force when it was issued."""

    op: str  # pwrite or pread
    path: str
    size: int
    offset: int
    memory: str  # device or host
    route: str  # gds, posix or cufile-compat
    num_threads: int
    task_size: int


class FakeFuture:
    """kvikio.IOFuture over the tasks of one call."""

    def __init__(self, tasks: list[Future], short_by: int = 0) -> None:
        self._tasks = tasks
        self._short_by = short_by
        self.got = False

    def get(self) -> int:
        self.got = True
        n = 0
        for t in self._tasks:
            n += t.result()  # a task's RuntimeError is raised here
        return n - self._short_by

    def done(self) -> bool:
        return all(t.done() for t in self._tasks)


def _ready(n: int) -> Future:
    f: Future = Future()
    f.set_result(n)
    return f


class ConfigContext:
    """What defaults.set returns: the values are in force already; `with` restores the old."""

    def __init__(self, fake: FakeKvikio, new: dict[str, Any]) -> None:
        store = fake.values
        for k, v in new.items():
            if k not in store:
                raise KeyError(k)
            if k in ("num_threads", "task_size", "bounce_buffer_size") and int(v) <= 0:
                raise kvikio_failure(f"{k} must be a positive integer") from None
            if k == "compat_mode" and not isinstance(v, CompatMode):
                raise TypeError("an integer is required")
        self._fake = fake
        self._old = {k: store[k] for k in new}
        fake.apply(new)

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        self._fake.apply(self._old)


def _parse(buf: Any, size: int | None) -> tuple[str, int, int]:
    """(memory kind, address, size) of a buffer, as kvikio's Array parses it: device memory by
    `__cuda_array_interface__`, else the buffer protocol; an object with neither is a
    TypeError. Only the address is kept, as kvikio keeps only the pointer."""
    if hasattr(buf, "__cuda_array_interface__"):
        cai = buf.__cuda_array_interface__
        if cai.get("strides") not in (None, (1,)):
            raise ValueError("Array must be contiguous")
        nbytes = int(cai["typestr"][2:])
        for d in cai["shape"]:
            nbytes *= d
        kind, addr = "device", cai["data"][0]
    else:
        mv = memoryview(buf)  # TypeError: a bytes-like object is required, not 'Tensor'
        if not mv.contiguous:
            raise ValueError("Array must be contiguous")
        arr = np.frombuffer(mv, dtype=np.uint8) if mv.nbytes else None
        kind, addr, nbytes = "host", (arr.ctypes.data if arr is not None else 0), mv.nbytes
    n = nbytes if size is None else size
    if n > nbytes:
        raise ValueError("Size is greater than the size of the buffer")
    return kind, addr, n


class FakeCuFile:
    """kvikio.CuFile over a real file (the fake's class is bound per FakeKvikio)."""

    _kv: FakeKvikio

    def __init__(self, file: Any, flags: str = "r") -> None:
        kv = self._kv
        path = os.fspath(file)
        mode = kv.values["compat_mode"]
        registers = kv.cufile_loads and not any(
            path.startswith(os.fspath(d).rstrip("/") + "/") for d in kv.unregistrable
        )
        if kv.cufile_loads and not kv.gds_available and not kv.allow_compat_mode:
            registers = False  # no nvidia-fs and cufile.json forbids its compat mode
        if mode == CompatMode.ON:
            compat = True
        elif mode == CompatMode.OFF:
            if not registers:
                raise kvikio_failure(f"cuFile error at {path}: cuFileHandleRegister failed")
            compat = False
        else:
            compat = not registers  # AUTO: a silent fallback for this file
        access = {"r": os.O_RDONLY, "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC}.get(flags)
        if access is None:
            raise ValueError("KvikIO failure at: fake_kvikio: Unknown file open flag")
        try:
            fd = os.open(path, access, 0o644)
        except OSError as e:
            raise RuntimeError(f"Unable to open file. {e.strerror}") from None
        self.path = path
        self.flags = flags
        self.fake_compat = compat  # private to the fake: kvikio's Python API cannot tell it
        # cuFile took the file but serves it through POSIX itself (its own compat mode)
        self.fake_cufile_posix = any(
            path.startswith(os.fspath(d).rstrip("/") + "/") for d in kv.posix_inside_cufile
        )
        self.fd = fd
        self._closed = False
        self.futures: list[FakeFuture] = []
        self.unawaited_at_close: int | None = None
        kv.files.append(self)

    @property
    def closed(self) -> bool:
        return self._closed

    def _route(self, memory: str, n: int) -> str:
        kv = self._kv
        if memory == "host" or self.fake_compat or n < kv.values["gds_threshold"]:
            return "posix"
        return "gds" if kv.gds_available and not self.fake_cufile_posix else "cufile-compat"

    def _io(self, op: str, buf: Any, size: int | None, file_offset: int) -> FakeFuture:
        kv = self._kv
        memory, addr, n = _parse(buf, size)
        if self._closed:
            raise kvikio_failure(f"{op} on a closed file")
        route = self._route(memory, n)
        kv.calls.append(
            Call(
                op,
                self.path,
                n,
                file_offset,
                memory,
                route,
                kv.values["num_threads"],
                kv.values["task_size"],
            )
        )
        failing = kv.fail_on_call == len(kv.calls)
        if failing and kv.fail_in == "call":
            raise kvikio_failure(f"fake I/O error in {op} of {self.path}")
        fd = self.fd

        def task(off: int, length: int) -> int:
            if failing:
                raise kvikio_failure(f"fake I/O error in {op} of {self.path}")
            if op == "pwrite":
                done = os.pwrite(fd, ctypes.string_at(addr + off, length), file_offset + off)
            else:
                data = os.pread(fd, length, file_offset + off)
                ctypes.memmove(addr + off, data, len(data))
                done = len(data)
            if route == "gds":
                kv.count_gds(op, done)
            return done

        if memory == "device" and n < kv.values["gds_threshold"]:
            tasks = [_ready(task(0, n))]  # kvikio does these inside the call
        else:
            step = max(kv.values["task_size"], 1)
            tasks = [kv.submit(task, off, min(step, n - off)) for off in range(0, n, step)] or [
                _ready(0)
            ]
        fut = FakeFuture(tasks, kv.short_by)
        self.futures.append(fut)
        return fut

    def pwrite(
        self, buf: Any, size: int | None = None, file_offset: int = 0, task_size: int | None = None
    ) -> FakeFuture:
        assert "w" in self.flags, "pwrite on a file opened for reading"
        return self._io("pwrite", buf, size, file_offset)

    def pread(
        self, buf: Any, size: int | None = None, file_offset: int = 0, task_size: int | None = None
    ) -> FakeFuture:
        return self._io("pread", buf, size, file_offset)

    def close(self) -> None:
        if not self._closed:
            os.close(self.fd)
            self._closed = True
            self.unawaited_at_close = sum(not f.got for f in self.futures)

    def __enter__(self) -> FakeCuFile:
        return self

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
        self.close()


class _Props:
    """cufile_driver.properties: read-only values that follow the fake's knobs."""

    def __init__(self, kv: FakeKvikio) -> None:
        self._kv = kv

    @property
    def is_gds_available(self) -> bool:
        return self._kv.cufile_loads and self._kv.gds_available

    @property
    def allow_compat_mode(self) -> bool:
        return self._kv.allow_compat_mode

    @property
    def major_version(self) -> int:
        return 2 if self.is_gds_available else 0

    @property
    def minor_version(self) -> int:
        return 20 if self.is_gds_available else 0


class _Importer(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves the fake's modules to the import system, which then sets each submodule as an
    attribute of its package when (and only when) it is imported."""

    def __init__(self, modules: dict[str, types.ModuleType]) -> None:
        self.modules = modules

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name in self.modules:
            return importlib.machinery.ModuleSpec(name, self, is_package=name == "kvikio")
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        return self.modules[spec.name]

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def _hide_kvikio(monkeypatch: Any) -> None:
    """Take any real kvikio out of sys.modules for the test (monkeypatch puts it back)."""
    for name in list(sys.modules):
        if name.split(".")[0] in ("kvikio", "libkvikio"):
            monkeypatch.delitem(sys.modules, name)


class FakeKvikio:
    """The parts of kvikio ckptbench uses, as a package of modules, plus the fake's knobs and
    records.

    Knobs: `cufile_loads` (libcufile opens; else every file is POSIX), `gds_available` (the
    nvidia-fs driver is loaded), `allow_compat_mode` (cufile.json), `unregistrable` (directories
    where cuFileHandleRegister fails, e.g. an overlayfs), `posix_inside_cufile` (directories
    whose files cuFile takes but serves through POSIX itself, as on a virtio disk when
    cufile.json allows its compat mode), `fail_on_call` + `fail_in` (the n-th
    call fails in the call itself or in its future), `short_by` (futures report fewer bytes),
    `allocation_of` (the fake CUDA's allocations, for memory_register), `nvfs_stats` (a path
    where nvidia-fs's statistics are kept while the driver is "loaded") and `nvfs_io_stats`.
    """

    __version__ = "26.10.00"

    def __init__(
        self,
        *,
        cufile_loads: bool = True,
        gds_available: bool = True,
        allow_compat_mode: bool = True,
        allocation_of: Callable[[int], tuple[int, int]] | None = None,
        nvfs_stats: str | None = None,
        nvfs_io_stats: bool = True,
    ) -> None:
        self.cufile_loads = cufile_loads
        self.gds_available = gds_available
        self.allow_compat_mode = allow_compat_mode
        self.allocation_of = allocation_of
        self.nvfs_stats = nvfs_stats
        self.nvfs_io_stats = nvfs_io_stats
        self.unregistrable: list[str] = []
        self.posix_inside_cufile: list[str] = []
        self.fail_on_call: int | None = None
        self.fail_in = "get"
        self.short_by = 0
        self.files: list[FakeCuFile] = []
        self.calls: list[Call] = []
        self.set_calls: list[dict[str, Any]] = []
        self.registered: dict[int, int] = {}  # allocation base -> bytes
        self.register_calls = 0
        self.pool_resets = 0
        self.values = dict(DEFAULTS)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="fake-kvikio")
        self._lock = threading.Lock()
        self.nvfs = {"write_bytes": 0, "writes": 0, "read_bytes": 0, "reads": 0}
        self._write_nvfs()
        self.modules = self._build_modules()

    # -- the modules ------------------------------------------------------------------------

    def _build_modules(self) -> dict[str, types.ModuleType]:
        pkg = types.ModuleType("kvikio")
        pkg.__path__ = []  # a package: its submodules are imported, not set
        pkg.__version__ = self.__version__
        pkg.CompatMode = CompatMode
        pkg.CuFile = type("CuFile", (FakeCuFile,), {"_kv": self})
        pkg.memory_register = self.memory_register
        pkg.memory_deregister = self.memory_deregister
        defaults = types.ModuleType("kvikio.defaults")
        defaults.get = self.get
        defaults.set = self.set
        defaults.is_compat_mode_preferred = self.is_compat_mode_preferred
        driver = types.ModuleType("kvikio.cufile_driver")
        driver.properties = _Props(self)
        driver.libcufile_version = self.libcufile_version
        return {"kvikio": pkg, "kvikio.defaults": defaults, "kvikio.cufile_driver": driver}

    def install(self, monkeypatch: Any) -> FakeKvikio:
        """Make `import kvikio` (and its submodules) import this fake for the test."""
        _hide_kvikio(monkeypatch)
        monkeypatch.setattr(sys, "meta_path", [_Importer(self.modules), *sys.meta_path])
        return self

    def uninstall(self) -> None:
        """Drop the fake's modules from sys.modules (before monkeypatch restores the real)."""
        for name in self.modules:
            if sys.modules.get(name) is self.modules[name]:
                del sys.modules[name]
        self._pool.shutdown(wait=True)

    # -- kvikio.defaults --------------------------------------------------------------------

    def get(self, config_name: str) -> Any:
        return self.values[config_name]

    def set(self, *config: Any) -> ConfigContext:
        if len(config) == 1 and isinstance(config[0], dict):
            new = dict(config[0])
        elif len(config) == 2 and isinstance(config[0], str):
            new = {config[0]: config[1]}
        else:
            raise ValueError("Valid arguments are kvikio.defaults.set(config: dict) or ...")
        self.set_calls.append(dict(new))
        return ConfigContext(self, new)

    def apply(self, new: dict[str, Any]) -> None:
        if "num_threads" in new and new["num_threads"] != self.values["num_threads"]:
            # kvikio's thread_pool().reset(n): the pool is torn down and spawned again.
            self._pool.shutdown(wait=True)
            self._pool = ThreadPoolExecutor(int(new["num_threads"]), thread_name_prefix="fake-kv")
            self.pool_resets += 1
        self.values.update(new)

    def is_compat_mode_preferred(self) -> bool:
        mode = self.values["compat_mode"]
        if mode == CompatMode.AUTO:
            return not self.cufile_loads
        return mode == CompatMode.ON

    def submit(self, fn: Callable[..., int], *args: Any) -> Future:
        return self._pool.submit(fn, *args)

    # -- kvikio.cufile_driver ---------------------------------------------------------------

    def libcufile_version(self) -> tuple[int, int]:
        return (1, 15)

    # -- kvikio.memory_register / memory_deregister ----------------------------------------

    def _allocation(self, buf: Any) -> tuple[int, int]:
        if not hasattr(buf, "__cuda_array_interface__") or self.allocation_of is None:
            raise kvikio_failure("cuMemGetAddressRange failed: not device memory")
        _, addr, _ = _parse(buf, None)
        return self.allocation_of(addr)

    def memory_register(self, buf: Any) -> None:
        base, size = self._allocation(buf)
        if self.is_compat_mode_preferred():
            return
        with self._lock:
            if base in self.registered:
                raise kvikio_failure("cuFile error: CU_FILE_MEMORY_ALREADY_REGISTERED")
            self.registered[base] = size
            self.register_calls += 1

    def memory_deregister(self, buf: Any) -> None:
        base, _ = self._allocation(buf)
        if self.is_compat_mode_preferred():
            return
        with self._lock:
            if self.registered.pop(base, None) is None:
                raise kvikio_failure("cuFile error: CU_FILE_MEMORY_NOT_REGISTERED")

    # -- nvidia-fs's statistics -------------------------------------------------------------

    def count_gds(self, op: str, n: int) -> None:
        with self._lock:
            key = "write" if op == "pwrite" else "read"
            self.nvfs[f"{key}_bytes"] += n
            self.nvfs[f"{key}s"] += 1
            self._write_nvfs()

    def _write_nvfs(self) -> None:
        """The statistics file in nvidia-fs's format (src/nvfs-stat.c), while it is loaded."""
        if self.nvfs_stats is None:
            return
        if not (self.cufile_loads and self.gds_available):
            if os.path.exists(self.nvfs_stats):
                os.unlink(self.nvfs_stats)
            return
        c = self.nvfs
        lines = [
            "GDS Version: 1.15.0.42 ",
            "NVFS statistics(ver: 4.0)",
            "NVFS Driver(version: 2.26.6)",
            "Mellanox PeerDirect Supported: False",
            f"IO stats: {'Enabled' if self.nvfs_io_stats else 'Disabled'}, peer IO stats: Disabled",
            "Logging level: info",
            "",
            "Active Shadow-Buffer (MiB): 0",
            "Active Process: 1",
        ]
        if self.nvfs_io_stats:
            lines += [
                "Batches\t\t\t\t: n=0 ok=0 err=0 Avg-Submit-Latency(usec)=0",
                f"Reads\t\t\t\t: n={c['reads']} ok={c['reads']} err=0 "
                f"readMiB={c['read_bytes'] >> 20} io_state_err=0",
                "Reads\t\t\t\t: Bandwidth(MiB/s)=0 Avg-Latency(usec)=0",
                "Sparse Reads\t\t        : n=0 io=0 holes=0 pages=0 ",
                f"Writes\t\t\t\t: n={c['writes']} ok={c['writes']} err=0 "
                f"writeMiB={c['write_bytes'] >> 20} io_state_err=0 pg-cache=0 pg-cache-fail=0 "
                "pg-cache-eio=0",
                "Writes\t\t\t\t: Bandwidth(MiB/s)=0 Avg-Latency(usec)=0",
            ]
        else:
            lines += [
                "Reads\t\t\t\t: err=0 io_state_err=0",
                "Sparse Reads\t\t        : n=0 io=0 holes=0 pages=0 ",
                "Writes\t\t\t\t: err=0 io_state_err=0 pg-cache=0 pg-cache-fail=0 pg-cache-eio=0",
            ]
        lines += [
            "Mmap\t\t\t\t: n=0 ok=0 err=0 munmap=0",
            "Error\t\t\t\t: cpu-gpu-pages=0 sg-ext=0 dma-map=0 dma-ref=0",
            "Ops\t\t\t\t: Read=0 Write=0 BatchIO=0",
            "GPU 0000:34:00.0 uuid:00000000-0000-0000-0000-000000000000 : Registered_MiB=0 "
            "Cache_MiB=0 max_pinned_MiB=0 ",
        ]
        tmp = self.nvfs_stats + ".tmp"
        with open(tmp, "w") as f:
            f.write("\n".join(lines) + "\n")
        os.replace(tmp, self.nvfs_stats)

    # -- records ----------------------------------------------------------------------------

    def routes(self, op: str = "pwrite") -> dict[str, int]:
        """Bytes per route over the calls of `op` so far."""
        out: dict[str, int] = {}
        for c in self.calls:
            if c.op == op:
                out[c.route] = out.get(c.route, 0) + c.size
        return out


class FakeDeviceArray:
    """A host byte tensor presented as device memory (`__cuda_array_interface__`)."""

    def __init__(self, t: torch.Tensor) -> None:
        assert t.dtype == torch.uint8 and t.dim() == 1 and t.is_contiguous()
        self.t = t

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {
            "shape": (self.t.numel(),),
            "typestr": "|u1",
            "strides": None,
            "data": (self.t.data_ptr(), False),
            "version": 3,
        }


# torch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp): requests of at most 1 MiB
# come from 2 MiB segments, requests up to 10 MiB from 20 MiB segments, larger ones get a
# segment of their own rounded up to 2 MiB; blocks are rounded up to 512 bytes.
SMALL, SMALL_SEGMENT = 1 << 20, 2 << 20
MID, MID_SEGMENT = 10 << 20, 20 << 20


@dataclass
class FakeCuda:
    """Fake device memory: host tensors allocated here count as CUDA tensors for the gds engine.

    Allocations are packed into segments as torch's caching allocator packs them, and
    `allocation_of` gives a pointer's segment, as cuMemGetAddressRange gives its cudaMalloc
    allocation. `to_device(state)` copies a state's tensors into fake device memory (leaving the
    keys listed in `keep_on_host` where they are, as an optimizer's `step` scalars stay on the
    host).
    """

    segments: list[torch.Tensor] = field(default_factory=list)
    _open: dict[int, tuple[torch.Tensor, int]] = field(default_factory=dict)  # pool -> (seg, used)
    copiers: list[FakeDeviceCopies] = field(default_factory=list)  # one per restore to the device

    def empty(self, nbytes: int, device: Any = None) -> torch.Tensor:
        size = max(-(-nbytes // 512) * 512, 512)
        if size > MID:
            seg = torch.empty(-(-size // SMALL_SEGMENT) * SMALL_SEGMENT, dtype=torch.uint8)
            self.segments.append(seg)
            return seg[:nbytes]
        pool, seg_bytes = (0, SMALL_SEGMENT) if size <= SMALL else (1, MID_SEGMENT)
        seg, used = self._open.get(pool, (None, seg_bytes))
        if seg is None or used + size > seg_bytes:
            seg, used = torch.empty(seg_bytes, dtype=torch.uint8), 0
            self.segments.append(seg)
        self._open[pool] = (seg, used + size)
        return seg[used : used + nbytes]

    def allocation_of(self, addr: int) -> tuple[int, int]:
        for seg in self.segments:
            base = seg.data_ptr()
            if base <= addr < base + seg.numel():
                return base, seg.numel()
        raise kvikio_failure("cuMemGetAddressRange failed: CUDA_ERROR_INVALID_VALUE")

    def is_device(self, t: torch.Tensor) -> bool:
        if t.device.type != "cpu" or not t.numel():
            return False
        p = t.data_ptr()
        return any(s.data_ptr() <= p < s.data_ptr() + s.numel() for s in self.segments)

    def clone(self, t: torch.Tensor) -> torch.Tensor:
        """A copy in fake device memory; like torch's `.to("cuda")` it keeps the strides of a
        dense tensor (a transposed tensor stays non-contiguous)."""
        src = t.detach()
        if not src.numel():
            return torch.empty(src.shape, dtype=src.dtype)
        raw = self.empty(src.numel() * src.element_size())
        dims = sorted(zip(src.stride(), src.shape, strict=True))
        expect, dense = 1, True
        for stride, size in dims:
            dense = dense and (size == 1 or stride == expect)
            expect *= size
        out = raw.view(src.dtype)
        out = out.as_strided(src.shape, src.stride()) if dense else out.view(src.shape)
        out.copy_(src)
        return out

    def to_device(self, state: Any, keep_on_host: tuple[str, ...] = ()) -> Any:
        if isinstance(state, dict):
            return type(state)(
                (k, v if k in keep_on_host else self.to_device(v, keep_on_host))
                for k, v in state.items()
            )
        if isinstance(state, list | tuple):
            return type(state)(self.to_device(v, keep_on_host) for v in state)
        if isinstance(state, torch.Tensor):
            return self.clone(state)
        return state

    def to(self, t: torch.Tensor, device: Any = None) -> torch.Tensor:
        """torch's `t.to("cuda")`."""
        return self.clone(t)

    def array(self, mem: torch.Tensor) -> Any:
        """What kvikio is handed for a slice of device memory (a torch CUDA tensor has
        `__cuda_array_interface__`)."""
        return FakeDeviceArray(mem)

    def allocation_of_tensor(self, mem: torch.Tensor) -> tuple[int, int]:
        return self.allocation_of(mem.data_ptr())

    def install(self, monkeypatch: Any) -> FakeCuda:
        """Put this fake at the gds engine's seams for device memory (which tensors are on the
        device, how kvikio is handed them, their allocations, allocation and copies on restore),
        and give engines that ask for device=cuda a Device of kind cuda whose torch device is
        the host: its memory is this fake's."""
        from bench.common.devices import Device
        from bench.engines import gds, striped

        monkeypatch.setattr(gds.cuda, "on_device", self.is_device)
        monkeypatch.setattr(gds.cuda, "cuda_array", self.array)
        monkeypatch.setattr(gds.cuda, "allocation_of", self.allocation_of_tensor)
        monkeypatch.setattr(gds.cuda, "device_empty", lambda n, dev: self.empty(n))
        monkeypatch.setattr(gds.cuda, "to_device", lambda t, dev: self.to(t))
        from bench.storage import readback

        def copies(dev: Any) -> FakeDeviceCopies:
            self.copiers.append(FakeDeviceCopies(self))
            return self.copiers[-1]

        monkeypatch.setattr(readback, "device_copies", copies)
        monkeypatch.setattr(readback, "on_device", self.is_device)
        real = striped.detect
        device = Device("cuda", torch.device("cpu"))
        monkeypatch.setattr(
            striped, "detect", lambda req="auto": device if req == "cuda" else real(req)
        )
        return self


class _FakeEvent:
    def __init__(self, wait: Callable[[], None]) -> None:
        self._wait = wait

    def synchronize(self) -> None:
        self._wait()


class FakeDeviceCopies:
    """bench.storage.readback.DeviceCopies over fake device memory. A copy is queued, and runs
    only when an event recorded after it is waited on, or at `finish` (as a stream runs it
    later): a ring slot read into again before its copy's event was waited on would change
    what that copy delivers, and the restored bytes show it."""

    def __init__(self, cuda: FakeCuda) -> None:
        self.cuda = cuda
        self.queue: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.done = 0
        self.events = 0
        self._lock = threading.Lock()

    def empty(self, nbytes: int) -> torch.Tensor:
        return self.cuda.empty(nbytes)

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        with self._lock:
            self.queue.append((dst, src))

    def _run(self, upto: int) -> None:
        with self._lock:
            for dst, src in self.queue[self.done : upto]:
                dst.copy_(src)
            self.done = max(self.done, upto)

    def record(self) -> _FakeEvent:
        with self._lock:
            mark = len(self.queue)
            self.events += 1
        return _FakeEvent(lambda: self._run(mark))

    def finish(self) -> None:
        self._run(len(self.queue))


class FakeCudart:
    """torch.cuda.cudart() for cudaHostRegister/cudaHostUnregister: records which host ranges
    are page-locked, refuses to lock a range twice or to unlock one that is not locked (as the
    CUDA runtime does: cudaErrorHostMemoryAlreadyRegistered / NotRegistered), returns cudaError
    codes (0 = success)."""

    def __init__(self) -> None:
        self.locked: dict[int, int] = {}  # address -> bytes
        self.calls: list[tuple[str, int, int]] = []

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:
        self.calls.append(("register", ptr, size))
        if ptr in self.locked:
            return 712  # cudaErrorHostMemoryAlreadyRegistered
        self.locked[ptr] = size
        return 0

    def cudaHostUnregister(self, ptr: int) -> int:
        self.calls.append(("unregister", ptr, 0))
        if self.locked.pop(ptr, None) is None:
            return 713  # cudaErrorHostMemoryNotRegistered
        return 0

    @property
    def locked_bytes(self) -> int:
        return sum(self.locked.values())
