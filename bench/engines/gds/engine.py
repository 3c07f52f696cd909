"""The gds engine: its options, kvikio's settings, warm, release and close, and one save's
course (coalesce, write the rest from its own memory, hash, commit). The rest is by job in the
package: `coalesce` (small tensors through one buffer), `registration` (cuFile buffer
registrations), `kvikio_io` (writes and the restore through kvikio), `emulated` (the host
emulation), `labels` (gds or compat, and why), `kvikio_lib` (loading and asking kvikio), `cuda`
(the device-memory seam tests put a fake in)."""

from __future__ import annotations

import threading
import time
from typing import Any

import torch

from bench.common.errors import UserError
from bench.common.traits import Traits
from bench.engines.base import MemoryPlan, PendingSave, StateSize
from bench.engines.gds import (
    coalesce,
    cuda,
    emulated,
    kvikio_io,
    kvikio_lib,
    labels,
    registration,
)
from bench.engines.striped import StripedEngine, batch_copy
from bench.engines.stripes import Job
from bench.measure.detail import GdsDetail
from bench.storage import checksums, layout, odirect
from bench.storage.plan import SavePlan
from bench.storage.staging import PinnedBuffer


class Gds(StripedEngine):
    name = "gds"
    traits = Traits(
        stall="durable",
        from_device=True,
        o_direct=True,
        page_cache=False,
        stripes=True,
        host_copies=0,
        baseline=False,
        restore_in_place=True,
        summary="kvikio CuFile.pwrite straight from device memory (GPUDirect Storage)",
    )

    # Its methods by job live in the package's modules, a newcomer finds each where it says.
    _place = coalesce.place
    _filesystem_reasons = labels.filesystem_reasons
    _label = labels.label
    _register = registration.register
    _deregister = registration.deregister
    _deregister_buffer = registration.deregister_buffer
    _open_cufile = kvikio_io.open_cufile
    _hash_kvikio = kvikio_io.hash_direct
    _persist_kvikio = kvikio_io.write
    load = kvikio_io.load
    _host_load = StripedEngine.load  # what kvikio_io.load falls back to
    _persist_emulated = emulated.write
    _write_piece = emulated.write_piece
    _bounce_buffer = emulated.bounce_buffer

    def __init__(self, targets: list[str], **options: Any) -> None:
        super().__init__(targets, **options)
        self.io = self.options.io
        if self.io == "auto":
            self.io = "kvikio" if self.device.is_cuda else "emulated"
        self._kvikio: Any = None
        # CUDA allocation base -> (a tensor inside it, the allocation's bytes), as registered
        self._registered: dict[int, tuple[torch.Tensor, int]] = {}
        self._registered_ptrs: dict[int, int] = {}  # registered tensor address -> its base
        self._register_failed: list[tuple[str, str]] = []  # (tensor path, why)
        self._register_note = ""
        self._kv_before: dict[str, Any] | None = None  # kvikio's settings before this engine's
        self._hash_stream: Any = None
        self._coalesce: coalesce.Coalescing | None = None  # of the plan (bench.storage.plan)
        self._cbuf: torch.Tensor | None = None  # the coalescing buffer
        self._cbuf_bytes = 0
        self._cbuf_host: odirect.HostBuffer | None = None  # its memory when on the host
        self._kvikio_pinned = 0  # kvikio's compat bounce buffers, derived (`_derived_pinned`)
        self._bounce = threading.local()
        self._bounces: list[PinnedBuffer] = []
        self._bounce_lock = threading.Lock()
        self.restore_mode = "none"
        self.restore_detail: dict[str, Any] = {}
        if self.io == "kvikio":
            why = kvikio_lib.kvikio_load_error()
            if why is not None:
                raise UserError(f"engine gds: io=kvikio but {why}")
            self._kvikio = kvikio_lib.import_kvikio()
            if not self.options.allow_compat and kvikio_lib.kvikio_mode(self._kvikio) != "gds":
                raise UserError(
                    "engine gds: kvikio would run in compat mode and allow_compat is false "
                    f"({kvikio_lib._global_reason(self._kvikio)})"
                )
            self._fs_reasons = self._filesystem_reasons()
            self._ensure_settings()

    @classmethod
    def unavailable(cls, options: dict[str, Any] | None = None) -> str | None:
        if kvikio_lib._io_choice(options or {}) != "kvikio":
            return None  # the emulation runs anywhere O_DIRECT works; the label says what it is
        why = kvikio_lib.kvikio_load_error()
        if why is not None:
            return (
                f"{why}: on CUDA gds writes device memory through kvikio "
                "(pip install -e '.[gds]'); engine_options.gds.io: emulated runs a host "
                "emulation instead (gds_mode=emulated, not GDS)"
            )
        return None

    def gds_mode(self) -> str:
        if self.io != "kvikio":
            return "emulated"
        return kvikio_lib.kvikio_mode(self._kvikio)

    @classmethod
    def memory_plan(cls, size: StateSize, options: Any) -> MemoryPlan:
        """No staging but the coalescing buffer (at most `coalesce_bytes`, or the state, in
        device memory on CUDA with the checksums' temporaries beside it: 4 words of 8 bytes
        for each of `checksums.SEGMENT_WORDS`). Through kvikio: its bounce buffers
        (`bounce_buffer_size`, 16 MiB by default, per thread, in compat mode) and restores
        straight into device memory; the emulation on CUDA: a pinned bounce buffer per writer
        thread; its restore a bounce buffer of a chunk per reading thread."""
        threads = options.threads_per_target * size.targets
        base = super().memory_plan(size, options)
        buffer = 0
        if options.coalesce_below and size.tensors and size.smallest < options.coalesce_below:
            both = 2 * coalesce.coalesce_window(options)
            buffer = min(both, size.nbytes + size.tensors * layout.TENSOR_ALIGN)
        device = buffer + (32 * checksums.SEGMENT_WORDS if buffer and options.checksums else 0)
        kvikio = size.cuda and options.io in ("auto", "kvikio")
        if kvikio:
            return MemoryPlan(
                staging=threads * (16 << 20),
                staging_device=device,
                restore_device=size.nbytes,
                in_place_host=0,
            )
        bounce = threads * (options.chunk_bytes + 2 * odirect.ALIGN) if size.cuda else 0
        # its restore reads with O_DIRECT through a bounce buffer of a chunk per reading thread
        # (bench.storage.readback.read_extents), no more threads than the files have chunks
        chunks = -(-size.nbytes // options.chunk_bytes) + size.targets
        readers = min(threads, chunks)
        reads = readers * options.chunk_bytes
        return MemoryPlan(
            staging=bounce + (0 if size.cuda else buffer),
            staging_device=device if size.cuda else 0,
            pinned=size.cuda,
            restore_host=base.restore_host + reads,
            restore_device=base.restore_device,
            in_place_host=base.in_place_host + reads,
        )

    # -- kvikio settings and files ----------------------------------------------------------

    def _settings(self) -> dict[str, Any]:
        """kvikio's runtime settings for this engine's I/O."""
        return {
            "num_threads": self.options.threads_per_target * len(self.targets),
            "task_size": self.options.chunk_bytes,
            "gds_threshold": self.options.gds_threshold,
        }

    def _ensure_settings(self) -> bool:
        """Put this engine's kvikio settings in force, setting only those that differ (a new
        `num_threads` rebuilds kvikio's thread pool); True if any had to change. The values
        found the first time are given back by `close()`."""
        defaults = self._kvikio.defaults
        want = self._settings()
        have = {k: defaults.get(k) for k in want}
        changed = {k: v for k, v in want.items() if have[k] != v}
        if not changed:
            return False
        if self._kv_before is None:
            self._kv_before = have
        defaults.set(changed)
        return True

    def _restore_settings(self) -> None:
        if self._kv_before is not None:
            before, self._kv_before = self._kv_before, None
            self._kvikio.defaults.set(before)

    def warm(self, state: Any) -> None:
        """Put kvikio's settings in force and register the state's device memory with cuFile
        (kvikio memory_register), as GDS users are told to for buffers used again and again;
        outside the timed region. kvikio registers the whole CUDA allocation holding a pointer
        and refuses a second registration inside it, so each allocation is registered once,
        for all the tensors in it; a failure is recorded with the tensors it left out, and the
        other allocations are still registered. First the state's plan and its coalescing
        buffer are made (registered with the rest)."""
        self.wait_idle()
        plan, _, _ = self._plan_for(state)
        self._bound_coalesce(plan)
        if self.io != "kvikio":
            return
        self._ensure_settings()
        if not self.options.register_buffers:
            return
        self._deregister()
        self._register(state)

    def release(self) -> None:
        """Free what the engine holds between saves: the coalescing buffer, and the cuFile
        registrations with the views of the state they keep (a state released here must not
        stay in device memory while the next one is built); `warm()` makes them again."""
        super().release()
        self._free_coalesce_buffer()
        if self._kvikio is not None:
            self._deregister()

    def close(self) -> None:
        super().close()
        self._free_coalesce_buffer()
        if self._kvikio is not None:
            self._deregister()
            self._restore_settings()
        with self._bounce_lock:
            for b in self._bounces:
                b.close()
            self._bounces.clear()

    @property
    def pinned_bytes(self) -> int:
        """The emulation's pinned bounce buffers; through kvikio, what its compat path pins,
        derived from its settings (`kvikio_pinned`), once a save went through it."""
        return sum(b.nbytes for b in self._bounces) + self._kvikio_pinned

    def _derived_pinned(self) -> int:
        """kvikio's compat path stages device bytes through pinned bounce buffers, one per task
        running at once and kept in a pool once made: num_threads x bounce_buffer_size (16 MiB
        unless KVIKIO_BOUNCE_BUFFER_SIZE says otherwise). Derived from its settings: kvikio
        does not report what it holds."""
        defaults = self._kvikio.defaults
        try:
            size = int(defaults.get("bounce_buffer_size"))
        except Exception:  # an older kvikio: its documented default
            size = 16 << 20
        return int(defaults.get("num_threads")) * size

    # -- save -------------------------------------------------------------------------------

    def _save(self, pending: PendingSave, job: Job) -> None:
        result, tensors, plan = job.result, job.tensors, job.plan
        co = self._bound_coalesce(plan)
        if any(plan.cuda) and not self.device.is_cuda:
            raise UserError("engine gds: io=emulated on device tensors needs device: cuda")
        dev = (
            [cuda.on_device(t) for t in tensors] if self.device.is_cuda else [False] * len(tensors)
        )
        if any(dev):
            # kvikio orders its writes after the legacy default stream only (its GDS path
            # synchronises it, its compat streams wait on it): a state produced on another
            # stream, as under torch.cuda.stream(s), must be done before the first pwrite, or
            # stale bytes reach the file while the checksums, which wait for that stream, sum
            # the new ones. The same for the emulation's bounce copies from writer threads.
            self.device.wait_current_stream()
        # The other tensors are written from their own memory; a strided one from a copy.
        mems: dict[int, torch.Tensor] = {}
        for i in co.direct:
            src = tensors[i].detach()
            if not src.is_contiguous():
                src = src.contiguous()
                result.copied_tensors += 1
            mems[i] = src.reshape(-1).view(torch.uint8)
        srcs = [mems[i] if dev[i] or self.io != "emulated" else mems[i].numpy() for i in co.direct]
        entries = plan.entries
        pieces, _ = layout.direct(
            srcs,
            [entries[i] for i in co.direct],
            len(self.targets),
            self.options.chunk_bytes,
            start=co.file_bytes,
        )
        assert plan.table is not None
        plan.table.update(co.direct)  # their extents follow their addresses
        file_bytes = dict(co.file_bytes)
        for p in pieces:
            file_bytes[p.target] = max(
                file_bytes.get(p.target, 0), odirect.align_up(p.file_offset + p.length)
            )
        if self.io == "emulated":
            self._persist_emulated(job, coalesce.Writes(co, pieces, file_bytes, mems, dev))
            result.detail = GdsDetail(
                io="emulated",
                device_bytes=sum(entries[i].nbytes for i, d in enumerate(dev) if d),
            )
        else:
            self._persist_kvikio(job, coalesce.Writes(co, pieces, file_bytes, mems, dev))
        assert isinstance(result.detail, GdsDetail)
        co.describe(result.detail)
        result.pinned_bytes = self.pinned_bytes
        # Training may touch the tensors only once save() returns: the stall is the whole
        # durable write.
        pending.finish_now()

    def _bound_coalesce(self, plan: SavePlan) -> coalesce.Coalescing:
        """The plan's Coalescing with its buffer made and its destinations bound: device memory
        on CUDA (registered with cuFile in `warm()`), else pre-faulted host memory."""
        co = self._coalesce
        assert co is not None, "a plan is placed before it is bound"
        if co.buffer is None and co.size:
            if self._cbuf is None or self._cbuf_bytes < co.size:
                self._free_coalesce_buffer()
                if self.device.is_cuda:
                    raw = cuda.device_empty(co.size + odirect.ALIGN, self.device.torch_device)
                    skip = (-raw.data_ptr()) % odirect.ALIGN
                    self._cbuf = raw[skip : skip + co.size]
                else:
                    host = odirect.HostBuffer(co.size, prefault=True)
                    self._cbuf_host = host
                    self._cbuf = torch.frombuffer(host.mapping, dtype=torch.uint8, count=co.size)
                self._cbuf_bytes = co.size
            on_gpu = self.device.is_cuda
            co.bind(self._cbuf, plan, on_gpu, self.io == "emulated" and not on_gpu)
        return co

    def _free_coalesce_buffer(self) -> None:
        if self._coalesce is not None:
            self._coalesce.unbind()
        if self._cbuf is not None:
            self._deregister_buffer(self._cbuf)
        self._cbuf, self._cbuf_bytes = None, 0
        if self._cbuf_host is not None:
            self._cbuf_host.close()
            self._cbuf_host = None

    def _coalesced_rounds(self, job: Job, co: coalesce.Coalescing, write_round: Any) -> None:
        """Each window in turn: its tensors copied into its half of the buffer (device to device
        on a GPU), its chunks handed to `write_round(pieces)`, which returns a wait for them,
        its checksums computed while they are written; the next window is copied into the other
        half meanwhile, and a half is reused once its writes are done."""
        tensors, cuda = job.tensors, self.device.is_cuda
        waits: list[Any] = []
        try:
            for k, r in enumerate(co.rounds):
                if k >= 2:
                    waits[k - 2]()  # this half's last writes are done
                for idx, dsts in r.batches:
                    batch_copy(dsts, [tensors[i] for i in idx], cuda)
                if cuda:
                    self._device_sync()
                waits.append(write_round(co.pieces_of(k)))
                if self.options.checksums:
                    h0 = time.perf_counter_ns()
                    co.hash_round(k, job)
                    job.result.hash_s += (time.perf_counter_ns() - h0) / 1e9
        finally:
            for w in waits[max(0, len(waits) - 2) :]:
                w()

    def _hash_one(self, job: Job, i: int, view: Any) -> None:
        """Device memory (a tensor here: io=emulated on CUDA) is hashed where it is, by torch
        kernels (wsum64); host memory (a numpy array) with xxh3."""
        if isinstance(view, torch.Tensor):
            job.wsum64[i] = checksums.device_checksum(view)
        else:
            job.xxh3[i] = checksums.checksum(view)

    def _side_stream(self) -> Any:
        """The stream the device checksums run on: a torch side stream (non-blocking with
        respect to the legacy default stream, as torch creates its streams), or None where the
        engine's device is not a CUDA device of torch's."""
        if self.device.torch_device.type != "cuda":
            return None
        if self._hash_stream is None:
            self._hash_stream = torch.cuda.Stream(device=self.device.torch_device)
        return self._hash_stream

    def _device_sync(self) -> None:
        self.device.synchronize()

    # -- emulation on CUDA: device pieces through a pinned bounce buffer ---------------------
