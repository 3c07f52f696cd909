"""`nixl` baseline: NVIDIA's NIXL moving the checkpoint between memory and files, as nixlbench
drives its storage backends.

One data file `state.bin` in a new generation directory of the first target (committed
atomically, bench.engines.baseline), opened with O_DIRECT, preallocated, and registered with a
NIXL agent as a FILE segment by its descriptor; beside it `index.json` (the state's tree, each
tensor's dtype, shape and offset). Each tensor starts at a 4 KiB-aligned offset, so that a
device tensor can be written or read in place by GDS.

- On the host (POSIX backend, io_uring or Linux AIO): the bytes pass through one registered,
  page-aligned host buffer in two halves. A half is filled with the next window of the file
  while the other half's transfer requests are in flight (a save), or emptied into the tensors
  while the next window is read (a restore). Each window is cut into descriptors of
  `request_bytes`, `batch` of them per transfer request, all posted, then polled.
- On a GPU with GDS_MT or GDS: the state's device tensors are registered (VRAM) and transferred
  from and into directly, no host copy.

Durable: the transfers done, the data file and the index are fsync'd inside save(), then the
commit fsyncs the directories; the harness's clock times all of it. Synchronous: the stall is the
whole durable write. The restore reads through NIXL into the destination's own tensors (a restart)
or into new ones.

Settings taken from nixlbench (benchmark/nixlbench in ai-dynamo/nixl): files opened O_RDWR |
O_CREAT with O_DIRECT (`--storage_enable_direct`), registered by descriptor (fd mode); POSIX with
`use_uring` or `use_aio`, `kernel_queue_size` 256 and `ios_pool_size` 65536 (its defaults);
GDS_MT's `thread_count`; transfer requests made from prepared descriptor lists and busy-polled
with getXferStatus until done, as its worker does. Added here, as a user who wants a checkpoint
would: preallocation of the file, fsync, the double-buffered host window.

Needs a NIXL wheel (`pip install nixl-cu12`, the `nixl` extra); GDS and GDS_MT need CUDA.
"""

from __future__ import annotations

import bisect
import json
import os
import time
from functools import cache
from types import ModuleType
from typing import Any

import numpy as np
import torch

from bench.common.errors import UserError
from bench.common.traits import Traits
from bench.engines.base import MemoryPlan, PendingSave, StateSize
from bench.engines.baseline import BaselineEngine
from bench.measure.detail import NixlDetail
from bench.storage import odirect
from bench.storage.tree import dtype_from_name, dtype_name, flatten, unflatten

FILE = "state.bin"
INDEX = "index.json"
HOW_TO = "pip install nixl-cu12 (or nixl-cu13), the `nixl` extra"
# How the data file is opened (nixlbench's flags with --storage_enable_direct); a test plants a
# read-only descriptor here to see a failed transfer refused.
OPEN_FLAGS = os.O_RDWR | os.O_CREAT | os.O_DIRECT
# nixlbench's defaults for the POSIX io queue's descriptor pool
IOS_POOL_SIZE = 65536
# A transfer request that completes nothing for this long is an error, not a hung save
STUCK_S = 300.0
PLUGIN = {"posix-uring": "POSIX", "posix-aio": "POSIX", "gds-mt": "GDS_MT", "gds": "GDS"}


class NixlError(RuntimeError):
    """A NIXL call failed: one line naming the backend and the call."""


@cache
def library() -> ModuleType | str:
    """NIXL's Python module (the wheel for CUDA 12 or 13, or a build from source), or why none
    imports."""
    import importlib
    import logging

    errors = []
    for name in ("nixl_cu12", "nixl_cu13", "nixl._api"):
        try:
            module = importlib.import_module(name)
        except Exception as e:  # ImportError, or a shared library that does not load
            errors.append(f"{name}: {type(e).__name__}: {e}")
            continue
        # Its Python logger says INFO for every agent and backend made, and logs an error that it
        # also raises (on stdout): the engine turns the exception into its own one-line reason
        # instead, so only critical ones are let through. Its C++ core logs to stderr apart.
        logging.getLogger("nixl").setLevel(logging.CRITICAL)
        return module
    return f"NIXL does not import ({'; '.join(errors)}); {HOW_TO}"


def version() -> str | None:
    from importlib import metadata

    for dist in ("nixl-cu12", "nixl-cu13", "nixl"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def nixl_info() -> dict[str, Any]:
    """What the environment block (env.json) records of NIXL: its version and plugins."""
    lib = library()
    if isinstance(lib, str):
        return {"available": False, "reason": lib}
    return {"available": True, "version": version(), "plugins": _plugins()}


@cache
def _plugins() -> list[str]:
    lib = library()
    assert not isinstance(lib, str)
    return list(_agent(lib, "ckptbench-probe").get_plugin_list())


def _agent(lib: ModuleType, name: str) -> Any:
    """A NIXL agent with no backend yet, no listener; its progress thread is off (the storage
    backends progress when polled)."""
    conf = lib.nixl_agent_config(enable_prog_thread=False, backends=[])
    return lib.nixl_agent(name, conf)


def backend_params(options: Any) -> dict[str, str]:
    """The init parameters of `options.backend`'s plugin (all strings, as NIXL takes them)."""
    b = options.backend
    if b in ("posix-uring", "posix-aio"):
        uring = b == "posix-uring"
        return {
            "use_uring": "true" if uring else "false",
            "use_aio": "false" if uring else "true",
            "kernel_queue_size": str(options.kernel_queue_size),
            "ios_pool_size": str(IOS_POOL_SIZE),
        }
    if b == "gds-mt":
        return {"thread_count": str(options.threads)}
    return {}


def _label(backend: str) -> str:
    return {"posix-uring": "POSIX/URING", "posix-aio": "POSIX/AIO"}.get(backend, PLUGIN[backend])


@cache
def _probe(backend: str, params: tuple[tuple[str, str], ...]) -> str | None:
    """None if NIXL instantiates `backend` with `params` here, else the library's reason."""
    lib = library()
    if isinstance(lib, str):
        return lib
    try:
        agent = _agent(lib, f"ckptbench-probe-{backend}")
        agent.create_backend(PLUGIN[backend], dict(params))
    except Exception as e:
        return (
            f"NIXL cannot instantiate its {_label(backend)} backend here ({type(e).__name__}: {e})"
        )
    return None


class Nixl(BaselineEngine):
    name = "nixl"
    traits = Traits(
        stall="durable",
        from_device=False,  # on the host; on a GPU with gds or gds-mt, from device memory
        o_direct=True,
        page_cache=False,
        stripes=False,
        host_copies=0,  # a window of `buffer_bytes`, not a copy of the state
        baseline=True,
        host_passes=1,  # the copy into the registered buffer
        restore_in_place=True,
        summary="NIXL file transfers (POSIX io_uring/AIO; GDS_MT/GDS on a GPU), O_DIRECT, fsync",
    )

    def __init__(self, targets: list[str], **options: Any) -> None:
        super().__init__(targets, **options)
        lib = library()
        if isinstance(lib, str):
            raise UserError(f"engine nixl: {lib}")
        self._lib = lib
        self._agent: Any = None
        self._buffer: odirect.HostBuffer | None = None
        self._local: Any = None  # the buffer's registration
        self._halves: list[Any] = []  # prepared descriptor lists of the two halves
        # warm()'s registration of the state's device tensors (gds, gds-mt on CUDA), and the
        # memory it covers: a save of the same tensors transfers from it without registering
        self._device_reg: Any = None
        self._device_key: tuple[tuple[int, int], ...] = ()

    @classmethod
    def unavailable(cls, options: dict[str, Any] | None = None) -> str | None:
        from bench.engines.registry import validate_options

        o = validate_options(cls.name, options or {})
        lib = library()
        if isinstance(lib, str):
            return lib
        if o.backend in ("gds", "gds-mt") and not torch.cuda.is_available():
            return f"backend {o.backend} needs CUDA (no CUDA device here); use posix-uring or posix-aio"
        return _probe(o.backend, tuple(sorted(backend_params(o).items())))

    @classmethod
    def variants(cls) -> dict[str, str | None]:
        """Each backend and whether it runs here (None) or why not: `ckptbench engines`."""
        return {b: cls.unavailable({"backend": b}) for b in PLUGIN}

    @classmethod
    def memory_plan(cls, size: StateSize, options: Any) -> MemoryPlan:
        """The registered host buffer (`buffer_bytes`, none for gds/gds-mt from a GPU); reads
        into the destination's tensors through it, or into new ones as large as the state."""
        device = size.cuda and options.backend in ("gds", "gds-mt")
        return MemoryPlan(
            staging=0 if device else options.buffer_bytes,
            pinned=size.cuda and not device,
            restore_host=0 if device else size.nbytes,
            restore_device=size.nbytes if size.cuda else 0,
            in_place_host=0,
        )

    @property
    def pinned_bytes(self) -> int:
        """The registered buffer where it is page-locked (a GPU's copies); POSIX registration
        itself locks nothing."""
        from bench.storage.staging import PinnedBuffer

        return self._buffer.nbytes if isinstance(self._buffer, PinnedBuffer) else 0

    # -- setup (outside the timed region) ---------------------------------------------------

    def _setup(self) -> None:
        if self._agent is not None:
            return
        o = self.options
        reason = self.unavailable(o.model_dump())
        if reason:
            raise UserError(f"engine nixl cannot run here: {reason}")
        self._agent = _agent(self._lib, f"ckptbench-{os.getpid()}-{id(self):x}")
        self._call(
            "create the backend", self._agent.create_backend, PLUGIN[o.backend], backend_params(o)
        )

    def _call(self, what: str, fn: Any, *args: Any) -> Any:
        """`fn(*args)`, a NIXL call; the library's exception (nixlBackendError and its kin)
        becomes one line naming the backend and what failed."""
        try:
            return fn(*args)
        except NixlError:
            raise
        except Exception as e:
            raise NixlError(
                f"nixl {_label(self.options.backend)}: {what} failed ({type(e).__name__}: {e})"
            ) from e

    def _host_buffer(self) -> None:
        """The registered host buffer and its two halves' prepared descriptor lists."""
        if self._buffer is not None:
            return
        o = self.options
        self._buffer = _host_memory(o.buffer_bytes)
        region = [(self._buffer.address, self._buffer.nbytes, 0, "")]
        self._local = self._call("register its buffer", self._agent.register_memory, region, "DRAM")
        half = o.buffer_bytes // 2
        for h in range(2):
            base = self._buffer.address + h * half
            pieces = [(base + p, o.request_bytes, 0) for p in range(0, half, o.request_bytes)]
            self._halves.append(
                self._call(
                    "prepare its buffer's descriptors",
                    self._agent.prep_xfer_dlist,
                    "NIXL_INIT_AGENT",
                    pieces,
                    "DRAM",
                )
            )

    def _device(self, tensors: list[torch.Tensor]) -> bool:
        return bool(tensors) and tensors[0].is_cuda and self.options.backend in ("gds", "gds-mt")

    def warm(self, state: Any) -> None:
        """The agent and its backend; the registered host buffer, or on a GPU with gds/gds-mt
        the state's device tensors registered (cuFile's buffer registration, as a user
        registers once and saves many times)."""
        self._setup()
        tensors = [t.detach() for _, t in flatten(state)[1]]
        if not self._device(tensors):
            self._host_buffer()
            return
        live = [t for t in tensors if t.numel() and t.is_contiguous()]
        key = _memory_key(live)
        if key != self._device_key:
            self._drop_device_reg()
            self._device_reg = self._call(
                "register the device tensors", self._agent.register_memory, live
            )
            self._device_key = key

    def _drop_device_reg(self) -> None:
        if self._device_reg is not None and self._agent is not None:
            self._agent.deregister_memory(self._device_reg)
        self._device_reg, self._device_key = None, ()

    # -- the transfers -------------------------------------------------------------------------

    def _wait(self, handles: list[Any], what: str, detail: NixlDetail) -> None:
        t0 = time.perf_counter()
        try:
            for h in handles:
                # Busy-polled, as nixlbench does: the POSIX backend reaps its completions here
                # (no progress thread), so a sleep would only add to the time.
                last = time.monotonic()
                while True:
                    s = self._call(f"a {what} transfer", self._agent.check_xfer_state, h)
                    if s == "DONE":
                        break
                    if s == "ERR":
                        raise NixlError(
                            f"nixl {_label(self.options.backend)}: a {what} transfer ended in "
                            "error (the library's log says why)"
                        )
                    if time.monotonic() - last > STUCK_S:
                        raise NixlError(
                            f"nixl {_label(self.options.backend)}: a {what} transfer made no "
                            f"progress in {STUCK_S:.0f} s"
                        )
        finally:
            self._release(handles)
        detail.poll_s += time.perf_counter() - t0

    def _release(self, handles: list[Any]) -> None:
        for h in handles:
            try:
                self._agent.release_xfer_handle(h)
            except Exception:  # released already, or still cancelling: the agent's to free
                pass
        handles.clear()

    def _post(
        self,
        op: str,
        local: Any,
        local_idx: list[int],
        remote: Any,
        remote_idx: list[int],
        detail: NixlDetail,
    ) -> list[Any]:
        """Post `op` of local descriptors `local_idx` against file descriptors `remote_idx`,
        `batch` per transfer request; the handles, in flight."""
        t0 = time.perf_counter()
        b = self.options.batch
        handles = []
        for i in range(0, len(local_idx), b):
            h = self._call(
                f"make a {op.lower()} request",
                self._agent.make_prepped_xfer,
                op,
                local,
                local_idx[i : i + b],
                remote,
                remote_idx[i : i + b],
            )
            handles.append(h)
            self._start(h, op, handles, detail, len(local_idx[i : i + b]))
        detail.post_s += time.perf_counter() - t0
        return handles

    def _start(self, h: Any, op: str, handles: list[Any], detail: NixlDetail, n: int) -> None:
        """Post transfer request `h` (of `n` descriptors); an error releases `handles`."""
        try:
            state = self._call(f"post a {op.lower()} request", self._agent.transfer, h)
        except NixlError:
            self._release(handles)
            raise
        if state == "ERR":
            self._release(handles)
            raise NixlError(
                f"nixl {_label(self.options.backend)}: posting a {op.lower()} transfer failed "
                "(the library's log above says why)"
            )
        detail.requests += 1
        detail.descriptors += n

    def _file_dlist(self, fd: int, length: int, piece: int) -> tuple[Any, Any]:
        """Register file `fd` of `length` bytes; its registration and a prepared list of its
        pieces of `piece` bytes, in order."""
        reg = self._call(
            "register the file", self._agent.register_memory, [(0, length, fd, "")], "FILE"
        )
        pieces = [(off, min(piece, length - off), fd) for off in range(0, length, piece)]
        try:
            return reg, self._call(
                "prepare the file's descriptors",
                self._agent.prep_xfer_dlist,
                self._agent.name,
                pieces,
                "FILE",
            )
        except NixlError:
            self._agent.deregister_memory(reg)
            raise

    def _host_io(
        self,
        op: str,
        fd: int,
        layout: list[tuple[int, int]],
        tensors: list[torch.Tensor],
        length: int,
        detail: NixlDetail,
    ) -> None:
        """Move the file's `length` bytes through the buffer's halves, a window at a time:
        on WRITE each window is filled from `tensors` (at `layout`'s offsets) while the other
        is written; on READ each window is read while the previous one is copied out."""
        o = self.options
        half = o.buffer_bytes // 2
        reg, remote = self._file_dlist(fd, length, o.request_bytes)
        assert self._buffer is not None
        windows = list(range(0, length, half))
        inflight: list[list[Any]] = [[], []]
        ends = [off + n for off, n in layout]  # where each window's first tensor is found

        def post(w: int) -> None:
            """The window's whole descriptors from the prepared lists; a last piece shorter
            than `request_bytes` (the file's tail) as a request of its own."""
            size = min(half, length - windows[w])
            n, tail = divmod(size, o.request_bytes)
            first = windows[w] // o.request_bytes
            handles = self._post(
                op,
                self._halves[w % 2],
                list(range(n)),
                remote,
                list(range(first, first + n)),
                detail,
            )
            if tail:
                assert self._buffer is not None
                addr = self._buffer.address + w % 2 * half + n * o.request_bytes
                local = self._agent.get_xfer_descs([(addr, tail, 0)], "DRAM")
                far = self._agent.get_xfer_descs(
                    [(windows[w] + n * o.request_bytes, tail, fd)], "FILE"
                )
                h = self._call(
                    f"make a {op.lower()} request",
                    self._agent.initialize_xfer,
                    op,
                    local,
                    far,
                    self._agent.name,
                )
                handles.append(h)
                self._start(h, op, handles, detail, 1)
            inflight[w % 2] = handles

        try:
            if op == "WRITE":
                for w, start in enumerate(windows):
                    if inflight[w % 2]:
                        self._wait(inflight[w % 2], "write", detail)
                    t0 = time.perf_counter()
                    _copy_window(
                        self._buffer.array, w % 2 * half, start, half, layout, tensors, True, ends
                    )
                    detail.copy_s += time.perf_counter() - t0
                    post(w)
                for side in inflight:
                    if side:
                        self._wait(side, "write", detail)
            else:
                post(0)
                for w, start in enumerate(windows):
                    self._wait(inflight[w % 2], "read", detail)
                    if w + 1 < len(windows):
                        post(w + 1)
                    t0 = time.perf_counter()
                    _copy_window(
                        self._buffer.array, w % 2 * half, start, half, layout, tensors, False, ends
                    )
                    detail.copy_s += time.perf_counter() - t0
        finally:
            for side in inflight:
                self._release(side)
            self._agent.release_dlist_handle(remote)
            self._agent.deregister_memory(reg)

    def _device_io(
        self,
        op: str,
        fd: int,
        layout: list[tuple[int, int]],
        tensors: list[torch.Tensor],
        length: int,
        detail: NixlDetail,
        mem: str = "VRAM",
    ) -> None:
        """Transfer the device tensors to or from the file in place (GDS, GDS_MT): each tensor
        registered as `mem` (VRAM; a test passes aligned host tensors as DRAM through POSIX),
        cut into descriptors of `request_bytes` at its file offset."""
        o = self.options
        if mem == "VRAM":
            torch.cuda.synchronize()
        live = [(t, place) for t, place in zip(tensors, layout, strict=True) if t.numel()]
        # warm()'s registration where these are the tensors it registered, else one for now
        regs = None
        if _memory_key([t for t, _ in live]) != self._device_key:
            regs = self._call(
                "register the device tensors", self._agent.register_memory, [t for t, _ in live]
            )
        file_reg = self._call(
            "register the file", self._agent.register_memory, [(0, length, fd, "")], "FILE"
        )
        try:
            local, remote = [], []
            for t, (off, n) in live:
                dev = max(t.get_device(), 0)  # host memory: device 0, as NIXL numbers it
                for p in range(0, n, o.request_bytes):
                    k = min(o.request_bytes, n - p)
                    local.append((t.data_ptr() + p, k, dev))
                    remote.append((off + p, k, fd))
            lp = self._call(
                "prepare the tensors' descriptors",
                self._agent.prep_xfer_dlist,
                "NIXL_INIT_AGENT",
                local,
                mem,
            )
            rp = self._call(
                "prepare the file's descriptors",
                self._agent.prep_xfer_dlist,
                self._agent.name,
                remote,
                "FILE",
            )
            idx = list(range(len(local)))
            try:
                self._wait(self._post(op, lp, idx, rp, idx, detail), op.lower(), detail)
            finally:
                self._agent.release_dlist_handle(lp)
                self._agent.release_dlist_handle(rp)
        finally:
            self._agent.deregister_memory(file_reg)
            if regs is not None:
                self._agent.deregister_memory(regs)

    # -- save and load -------------------------------------------------------------------------

    def _detail(self, device: bool) -> NixlDetail:
        o = self.options
        return NixlDetail(
            backend=_label(o.backend),
            nixl=version(),
            request_bytes=o.request_bytes,
            batch=o.batch,
            buffer_bytes=0 if device else o.buffer_bytes,
        )

    def save(self, state: Any, name: str) -> PendingSave:
        self._setup()
        tree, named = flatten(state)
        tensors = [t.detach().contiguous() for _, t in named]
        device = self._device(tensors)
        if not device:
            self._host_buffer()
        layout, length = _layout(tensors)
        detail = self._detail(device)

        def write(gen: str) -> None:
            path = os.path.join(gen, FILE)
            fd = os.open(path, OPEN_FLAGS, 0o644)
            try:
                odirect.preallocate(fd, length)
                if length:
                    io = self._device_io if device else self._host_io
                    io("WRITE", fd, layout, tensors, length, detail)
                t0 = time.perf_counter()
                os.fsync(fd)
            finally:
                os.close(fd)
            index = {
                "tree": tree,
                "length": length,
                "tensors": [
                    {"dtype": dtype_name(t.dtype), "shape": list(t.shape), "offset": off}
                    for t, (off, _) in zip(tensors, layout, strict=True)
                ],
            }
            with open(os.path.join(gen, INDEX), "w") as f:
                json.dump(index, f)
                f.flush()
                os.fsync(f.fileno())
            detail.fsync_s += time.perf_counter() - t0

        return self._sync_save(state, name, write, detail)

    def load(self, name: str, device: str = "cpu", checksums: bool = True, into: Any = None) -> Any:
        """Read the checkpoint through NIXL: into `into`'s own tensors (a restart), else into
        new tensors on `device`."""
        self._setup()
        gen = self.current_dir(name)
        with open(os.path.join(gen, INDEX)) as f:
            index = json.load(f)
        specs = index["tensors"]
        if into is not None:
            dst = [t for _, t in flatten(into)[1]]
            if len(dst) != len(specs):
                raise UserError(
                    f"the checkpoint holds {len(specs)} tensors; the state to restore into has "
                    f"{len(dst)}"
                )
            for d, s in zip(dst, specs, strict=True):
                if list(d.shape) != s["shape"] or dtype_name(d.dtype) != s["dtype"]:
                    raise UserError(
                        f"the checkpoint's tensor of {tuple(s['shape'])} {s['dtype']} cannot be "
                        f"restored into one of {tuple(d.shape)} {d.dtype}"
                    )
            target = [
                d if d.is_contiguous() else torch.empty(d.shape, dtype=d.dtype, device=d.device)
                for d in dst
            ]
        else:
            target = [
                torch.empty(s["shape"], dtype=dtype_from_name(s["dtype"]), device=device)
                for s in specs
            ]
        layout = [
            (s["offset"], t.numel() * t.element_size()) for s, t in zip(specs, target, strict=True)
        ]
        on_device = self._device(target)
        if not on_device:
            self._host_buffer()
        fd = os.open(os.path.join(gen, FILE), os.O_RDONLY | os.O_DIRECT)
        try:
            if index["length"]:
                io = self._device_io if on_device else self._host_io
                io("READ", fd, layout, target, index["length"], self._detail(on_device))
        finally:
            os.close(fd)
        if into is not None:
            for d, t in zip(dst, target, strict=True):
                if d is not t:
                    d.copy_(t)
            return into
        return unflatten(index["tree"], target)

    def _free(self) -> None:
        self._drop_device_reg()
        if self._agent is not None:
            for h in self._halves:
                self._agent.release_dlist_handle(h)
            if self._local is not None:
                self._agent.deregister_memory(self._local)
        self._halves, self._local = [], None
        if self._buffer is not None:
            self._buffer.close()
            self._buffer = None

    def release(self) -> None:
        """Free the registered buffer (`warm()` registers it again)."""
        self._free()

    def close(self) -> None:
        self._free()
        self._agent = None


def _host_memory(nbytes: int) -> odirect.HostBuffer:
    """The registered buffer: page-locked where a GPU copies into it, else pre-faulted pages."""
    if torch.cuda.is_available():
        from bench.storage.staging import PinnedBuffer

        return PinnedBuffer(nbytes)
    return odirect.HostBuffer(nbytes)


def _memory_key(tensors: list[torch.Tensor]) -> tuple[tuple[int, int], ...]:
    """The memory `tensors` cover, (address, bytes) each: what a registration is good for."""
    return tuple((t.data_ptr(), t.numel() * t.element_size()) for t in tensors)


def _layout(tensors: list[torch.Tensor]) -> tuple[list[tuple[int, int]], int]:
    """Each tensor's (offset, bytes) in the file, every offset 4 KiB-aligned; the file's length
    (a multiple of 4 KiB)."""
    out, off = [], 0
    for t in tensors:
        n = t.numel() * t.element_size()
        out.append((off, n))
        off = odirect.align_up(off + n)
    return out, off


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes as a flat uint8 tensor over the same memory."""
    return t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)


def _copy_window(
    buf: np.ndarray,
    at: int,
    start: int,
    size: int,
    layout: list[tuple[int, int]],
    tensors: list[torch.Tensor],
    into_buffer: bool,
    ends: list[int],
) -> None:
    """Copy between the buffer's half at `at` and the file window [start, start + size): every
    tensor's bytes that fall in it (into the buffer on a save, out of it on a restore). On a
    save the gaps (alignment padding, the file's tail) are zeroed, so the file's bytes are the
    same whatever the buffer held. `ends`: each tensor's end in the file (ascending), to find
    the window's first tensor without walking the ones before it."""
    end = start + size
    window = torch.from_numpy(buf[at : at + size])
    cursor = start
    first = bisect.bisect_right(ends, start)
    for i in range(first, len(layout)):  # no slice: a copy of the lists for every window
        t, (off, n) = tensors[i], layout[i]
        if off + n <= start:
            continue
        if off >= end:
            break
        lo, hi = max(off, start), min(off + n, end)
        if into_buffer and lo > cursor:
            window[cursor - start : lo - start].zero_()
        src = _bytes_of(t)[lo - off : hi - off]
        part = window[lo - start : hi - start]
        if into_buffer:
            part.copy_(src)
        else:
            src.copy_(part)
        cursor = hi
    if into_buffer and cursor < end:
        window[cursor - start :].zero_()
