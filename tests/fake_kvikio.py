"""FAKES of kvikio and of CUDA device memory, for machines without a GPU.

kvikio cannot load without libcuda.so.1, so the gds engine's kvikio path is tested against
`FakeKvikio`, which follows the contracts of the real library (kvikio 25.04-26.10, read from its
sources: python/kvikio/kvikio/{cufile,defaults,cufile_driver,buffer}.py, _lib/arr.pyx and
cpp/src/{file_handle,compat_mode_manager,defaults}.cpp) where ckptbench depends on them:

- `CuFile(file, flags)`: each handle decides at open time, from the `compat_mode` setting then in
  force, whether it uses cuFile or POSIX. OFF raises when cuFile cannot register the file
  (cuFileHandleRegister fails, or the O_DIRECT open does); AUTO falls back to POSIX for that file
  silently, and Python can not ask a handle which it chose (there is no per-handle query).
- `pwrite`/`pread(buf, size=None, file_offset=0, task_size=None)` return an IOFuture (`get()`,
  `done()`). `buf` is device memory if it has `__cuda_array_interface__`, else anything with the
  buffer protocol (host memory, always written through POSIX on the thread pool); anything else is
  a TypeError (a torch CPU tensor has neither), a non-contiguous buffer or a size beyond the
  buffer a ValueError. Device requests smaller than `gds_threshold` go through POSIX with a
  bounce buffer, whatever the handle's mode.
- `defaults.get(name)` / `defaults.set(name, value)` or `set({...})`: applied at once, and
  usable as a context manager that restores the old values; unknown names are a KeyError, a zero
  num_threads, task_size or bounce_buffer_size a ValueError. The defaults are kvikio's
  (num_threads 1, task_size 4 MiB, gds_threshold 16 KiB, compat_mode AUTO).
- `cufile_driver.properties` (`is_gds_available`, `allow_compat_mode`, ...) and
  `cufile_driver.libcufile_version()`; `memory_register`/`memory_deregister` (kvikio.buffer),
  no-ops while compat mode is preferred, refused for host memory.

The fake writes and reads real files with os.pwrite/os.preadv and records every call: which
route its bytes took (`gds`, `posix` or `cufile-compat`: cuFile's own POSIX fallback when the
nvidia-fs driver is absent and cufile.json allows compat mode), and the settings in force.

`FakeCuda` stands in for CUDA device memory: host tensors it allocated count as "device" tensors
for the gds engine (through the seam functions in bench.engines.gds), and are handed to kvikio
wrapped in an object with `__cuda_array_interface__`, as torch CUDA tensors are.
"""

from __future__ import annotations

import ctypes
import enum
import os
import types
from dataclasses import dataclass, field
from typing import Any

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
    """kvikio.IOFuture."""

    def __init__(self, n: int, error: Exception | None = None) -> None:
        self.n = n
        self.error = error
        self.got = False

    def get(self) -> int:
        self.got = True
        if self.error is not None:
            raise self.error
        return self.n

    def done(self) -> bool:
        return True


class ConfigContext:
    """What defaults.set returns: the values are in force already; `with` restores the old."""

    def __init__(self, store: dict[str, Any], new: dict[str, Any]) -> None:
        for k, v in new.items():
            if k not in store:
                raise KeyError(k)
            if k in ("num_threads", "task_size", "bounce_buffer_size") and int(v) <= 0:
                raise ValueError(f"{k} must be positive, got {v}")
            if k == "compat_mode" and not isinstance(v, CompatMode):
                raise TypeError(f"compat_mode must be a kvikio.CompatMode, got {v!r}")
        self.store = store
        self.old = {k: store[k] for k in new}
        store.update(new)

    def __enter__(self) -> ConfigContext:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.store.update(self.old)


class FakeDefaults:
    """kvikio.defaults."""

    def __init__(self, kv: FakeKvikio) -> None:
        self.kv = kv
        self.values = dict(DEFAULTS)

    def get(self, name: str) -> Any:
        return self.values[name]

    def set(self, config: Any, value: Any = None) -> ConfigContext:
        new = config if isinstance(config, dict) else {config: value}
        self.kv.set_calls.append(dict(new))
        return ConfigContext(self.values, new)

    def is_compat_mode_preferred(self) -> bool:
        mode = self.values["compat_mode"]
        if mode == CompatMode.AUTO:
            return not self.kv.cufile_loads
        return mode == CompatMode.ON


def _parse(buf: Any, size: int | None) -> tuple[str, Any, int]:
    """(memory kind, where, size) of a buffer, as kvikio's Array parses it: device memory by
    `__cuda_array_interface__` (where = its address), else the buffer protocol (where = a byte
    memoryview); an object with neither is a TypeError."""
    if hasattr(buf, "__cuda_array_interface__"):
        cai = buf.__cuda_array_interface__
        if cai.get("strides") not in (None, (1,)):
            raise ValueError("Array must be contiguous")
        nbytes = int(cai["typestr"][2:])
        for d in cai["shape"]:
            nbytes *= d
        kind, where = "device", cai["data"][0]
    else:
        mv = memoryview(buf)  # TypeError: a bytes-like object is required, not 'Tensor'
        if not mv.contiguous:
            raise ValueError("Array must be contiguous")
        kind, where = "host", mv.cast("B")
        nbytes = where.nbytes
    n = nbytes if size is None else size
    if n > nbytes:
        raise ValueError("Size is greater than the size of the buffer")
    return kind, where, n


class FakeCuFile:
    """kvikio.CuFile over a real file."""

    def __init__(self, kv: FakeKvikio, file: Any, flags: str = "r") -> None:
        path = os.fspath(file)
        mode = kv.defaults.values["compat_mode"]
        registers = kv.cufile_loads and not any(
            path.startswith(os.fspath(d).rstrip("/") + "/") for d in kv.unregistrable
        )
        if kv.cufile_loads and not kv.gds_available and not kv.allow_compat_mode:
            registers = False  # no nvidia-fs and cufile.json forbids its compat mode
        if mode == CompatMode.ON:
            compat = True
        elif mode == CompatMode.OFF:
            if not registers:
                raise RuntimeError(f"cuFile error at {path}: cuFileHandleRegister failed")
            compat = False
        else:
            compat = not registers  # AUTO: a silent fallback for this file
        access = {"r": os.O_RDONLY, "w": os.O_RDWR | os.O_CREAT | os.O_TRUNC}[flags]
        self.kv = kv
        self.path = path
        self.flags = flags
        self.fake_compat = compat  # private to the fake: kvikio's Python API cannot tell it
        self.fd = os.open(path, access, 0o644)
        self._closed = False
        self.futures: list[FakeFuture] = []
        self.unawaited_at_close: int | None = None
        kv.files.append(self)

    @property
    def closed(self) -> bool:
        return self._closed

    def _route(self, memory: str, n: int) -> str:
        if memory == "host" or self.fake_compat or n < self.kv.defaults.values["gds_threshold"]:
            return "posix"
        return "gds" if self.kv.gds_available else "cufile-compat"

    def _io(self, op: str, buf: Any, size: int | None, file_offset: int) -> FakeFuture:
        assert not self._closed, f"{op} on a closed file"
        memory, where, n = _parse(buf, size)
        kv = self.kv
        call = Call(
            op,
            self.path,
            n,
            file_offset,
            memory,
            self._route(memory, n),
            kv.defaults.values["num_threads"],
            kv.defaults.values["task_size"],
        )
        kv.calls.append(call)
        failing = kv.fail_on_call == len(kv.calls)
        error = OSError(5, "fake I/O error", self.path) if failing else None
        if error is not None and kv.fail_in == "call":
            raise error
        if op == "pwrite":
            data = ctypes.string_at(where, n) if memory == "device" else where[:n]
            done = os.pwrite(self.fd, data, file_offset) if n else 0
        else:
            data = os.pread(self.fd, n, file_offset)
            if memory == "device":
                ctypes.memmove(where, data, len(data))
            else:
                where[: len(data)] = data
            done = len(data)
        fut = FakeFuture(done - kv.short_by, error)
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

    def __exit__(self, *exc: Any) -> None:
        self.close()


class FakeKvikio(types.ModuleType):
    """The parts of kvikio ckptbench uses, plus the fake's knobs and records.

    Knobs: `cufile_loads` (libcufile opens; else every file is POSIX), `gds_available` (the
    nvidia-fs driver is loaded), `allow_compat_mode` (cufile.json), `unregistrable` (directories
    where cuFileHandleRegister fails, e.g. an overlayfs), `fail_on_call` + `fail_in` (the n-th
    call fails in the call itself or in its future), `short_by` (futures report fewer bytes).
    """

    CompatMode = CompatMode
    __version__ = "26.10.00"

    def __init__(
        self,
        *,
        cufile_loads: bool = True,
        gds_available: bool = True,
        allow_compat_mode: bool = True,
    ) -> None:
        super().__init__("kvikio")
        self.cufile_loads = cufile_loads
        self.gds_available = gds_available
        self.allow_compat_mode = allow_compat_mode
        self.unregistrable: list[str] = []
        self.fail_on_call: int | None = None
        self.fail_in = "get"
        self.short_by = 0
        self.files: list[FakeCuFile] = []
        self.calls: list[Call] = []
        self.set_calls: list[dict[str, Any]] = []
        self.registered: dict[int, int] = {}  # address -> bytes
        self.register_calls = 0
        self.defaults = FakeDefaults(self)
        self.cufile_driver = types.SimpleNamespace(
            properties=_Props(self), libcufile_version=lambda: (1, 15)
        )

    def CuFile(self, file: Any, flags: str = "r") -> FakeCuFile:  # kvikio's name
        return FakeCuFile(self, file, flags)

    def memory_register(self, buf: Any) -> None:
        if not hasattr(buf, "__cuda_array_interface__"):
            raise RuntimeError("cuMemGetAddressRange failed: not device memory")
        if self.defaults.is_compat_mode_preferred():
            return
        _, addr, n = _parse(buf, None)
        self.registered[addr] = n
        self.register_calls += 1

    def memory_deregister(self, buf: Any) -> None:
        if not hasattr(buf, "__cuda_array_interface__"):
            raise RuntimeError("cuMemGetAddressRange failed: not device memory")
        if self.defaults.is_compat_mode_preferred():
            return
        _, addr, _ = _parse(buf, None)
        self.registered.pop(addr, None)

    def routes(self, op: str = "pwrite") -> dict[str, int]:
        """Bytes per route over the calls of `op` so far."""
        out: dict[str, int] = {}
        for c in self.calls:
            if c.op == op:
                out[c.route] = out.get(c.route, 0) + c.size
        return out


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


@dataclass
class FakeCuda:
    """Fake device memory: host tensors allocated here count as CUDA tensors for the gds engine.

    `to_device(state)` copies a state's tensors into fake device memory (leaving the keys listed
    in `keep_on_host` where they are, as an optimizer's `step` scalars stay on the host).
    """

    allocations: list[torch.Tensor] = field(default_factory=list)

    def empty(self, nbytes: int, device: Any = None) -> torch.Tensor:
        t = torch.empty(max(nbytes, 1), dtype=torch.uint8)[:nbytes]
        self.allocations.append(t)
        return t

    def is_device(self, t: torch.Tensor) -> bool:
        if t.device.type != "cpu" or not t.numel():
            return False
        p = t.data_ptr()
        return any(a.data_ptr() <= p < a.data_ptr() + a.numel() for a in self.allocations)

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

    def buffer(self, mem: torch.Tensor) -> Any:
        """What kvikio is handed for a slice of device memory (a torch CUDA tensor has
        `__cuda_array_interface__`)."""
        return FakeDeviceArray(mem)


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
