"""Machinery shared by the three data paths (gds, cpu-double, cpu-single).

All three stripe the checkpoint over N targets (one data file per target, fixed-size chunks dealt
round-robin, see bench.storage.layout), write with a pool of `threads_per_target x N` threads (os.pwrite
releases the GIL), fsync every file and directory, and then commit the manifest. They differ in
where the bytes come from and how they are written:
- snapshot engines (cpu-double, cpu-single) copy the state into a reusable staging buffer; the
  stall ends there and a background thread persists from the buffer;
- the direct engine (gds) writes from the tensors' own memory (its small ones through a
  coalescing buffer) and the stall lasts until durable.
Each save runs on the plan of its state's layout (bench.storage.plan), made once and kept while
the layout stays; the engine places the plan's tensors (`_place`) and keeps that placement
beside it. The stall and the time to durability are the harness's clock's
(bench.measure.clock), never the engine's.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar

import numpy as np
import torch
import xxhash

from bench.common.devices import detect
from bench.common.errors import UserError
from bench.common.traits import Traits
from bench.engines.base import (
    MemoryPlan,
    PendingSave,
    SaveResult,
    StateSize,
    build_options,
    check_name,
    check_targets,
)
from bench.engines.stripes import Job, StripeWriter
from bench.measure.detail import SnapshotDetail
from bench.storage import checksums, generations, layout, manifest, odirect, readback
from bench.storage.plan import SavePlan, walk
from bench.storage.staging import COPY_PIECE, Staging, copy_tasks, run_copies
from bench.storage.tree import flatten, unflatten


def _now() -> int:
    return time.perf_counter_ns()


class StripedEngine:
    """What the three data paths share: options, targets, device, the plan of the last state
    (bench.storage.plan), the StripeWriter that writes their files, and save() around the
    engine's own part (`_place` a new plan, `_save` one save)."""

    name: ClassVar[str]
    traits: ClassVar[Traits]
    restore_mode = "host"

    def __init__(self, targets: list[str], **options: Any) -> None:
        self.options = build_options(self.name, options)
        self.targets = check_targets(self.name, targets)
        o_direct = self.traits.o_direct
        if o_direct:
            for t in self.targets:
                reason = odirect.probe(t)
                if reason:
                    raise UserError(f"target {t}: {reason}; engine {self.name} needs O_DIRECT")
        try:
            self.device = detect(self.options.device)
        except UserError as e:
            raise UserError(f"engine {self.name}: {e}") from None
        caps = self.options.max_write_bw
        if isinstance(caps, list | tuple) and len(caps) != len(self.targets):
            raise UserError(
                f"engine {self.name}: max_write_bw lists {len(caps)} caps for "
                f"{len(self.targets)} targets"
            )
        caps = list(caps) if isinstance(caps, list | tuple) else [caps] * len(self.targets)
        self.writer = StripeWriter(
            self.name,
            self.targets,
            o_direct=o_direct,
            fallocate=self.options.fallocate,
            chunk_bytes=self.options.chunk_bytes,
            checksums=self.options.checksums,
            caps=caps,
            threads=self.options.threads_per_target * len(self.targets),
        )
        self._pending: PendingSave | None = None
        self._plan: SavePlan | None = None  # of the last state saved (bench.storage.plan)

    @classmethod
    def unavailable(cls, options: dict[str, Any] | None = None) -> str | None:
        return None

    @classmethod
    def memory_plan(cls, size: StateSize, options: Any) -> MemoryPlan:
        """The direct path holds no staging (`Gds` adds its buffers). A restore into new memory
        reads every tensor into host memory (then to the device on CUDA); in place, host
        tensors are read straight into their memory and device tensors one at a time through
        host memory."""
        return MemoryPlan(
            save=0,
            restore_host=size.nbytes,
            restore_device=size.nbytes if size.cuda else 0,
            in_place_host=size.largest if size.cuda else 0,
        )

    # -- save -------------------------------------------------------------------------------

    def save(self, state: Any, name: str) -> PendingSave:
        t0 = _now()  # for the wait on the previous save only: the stall is the clock's
        check_name(name)
        wait_prev = 0.0
        if self._pending is not None and not self._pending.done():
            self._pending._done.wait()  # its error, if any, is reported by its own wait()
            wait_prev = (_now() - t0) / 1e9
        job = self._job(state, name)
        result = job.result
        result.wait_prev_s = wait_prev
        pending = PendingSave(result)
        # A refusal raises here, before anything is written; the claim itself is written by
        # the writer's `prepare`, with this save's first file: after the stall on the snapshot
        # engines, inside it with bounded staging (its first chunk is written while it copies).
        generations.check_claim(self.targets, name)
        try:
            with torch.no_grad():
                self._save(pending, job)
        except BaseException:
            self.writer.abort(name, result.save_id)
            raise
        self._pending = pending
        return pending

    def _plan_for(self, state: Any) -> tuple[SavePlan, list[torch.Tensor], list[Any]]:
        """The save plan for `state` with its tensors and scalar values: the last plan while the
        state's layout is the same (a walk, ~0.6 us a tensor), else a new one, placed by the
        engine (`_place`)."""
        w = walk(state)
        p = self._plan
        if w is not None and p is not None and p.fits(w):
            return p, w.tensors, w.scalars
        self._plan = None
        p, tensors, scalars = SavePlan.build(state, w)
        self._place(p, tensors)
        p.placed()
        if w is not None:
            self._plan = p
        return p, tensors, scalars

    def _job(self, state: Any, name: str) -> Job:
        p, tensors, scalars = self._plan_for(state)
        n = len(p.entries)
        result = SaveResult(
            name=name,
            bytes=p.nbytes,
            save_id=manifest.new_save_id(),
            checksums=self.options.checksums,
            gds_mode=self.gds_mode(),
        )
        return Job(result, p, tensors, scalars, [None] * n, [None] * n)

    def _place(self, plan: SavePlan, tensors: list[torch.Tensor]) -> None:
        """Fill the plan's entries' extents and keep what the engine's saves of it need."""
        raise NotImplementedError

    def _save(self, pending: PendingSave, job: Job) -> None:
        raise NotImplementedError

    def gds_mode(self) -> str:
        return "none"

    def _in_background(self, pending: PendingSave, persist: Any) -> None:
        """Run the persist phase in the background; on failure remove this save's files."""
        name, save_id = pending.result.name, pending.result.save_id

        def run() -> None:
            try:
                persist()
            except BaseException:
                self.writer.abort(name, save_id)
                raise

        pending.run_in_background(run)

    def _persist(
        self,
        job: Job,
        pieces: list[layout.Piece],
        file_bytes: dict[int, int],
        hash_views: list[Any],
    ) -> None:
        """Write every piece, hash, fsync files and directories, then commit the manifest."""
        fds = self.writer.open(job.result, file_bytes)
        try:
            futures = self.writer.submit(fds, pieces)
        except BaseException:
            self.writer.close(fds, [])  # nothing was handed on, or the pool is shut: no write
            raise
        self._hash_and_drain(job, fds, futures, file_bytes, hash_views)

    def _hash_and_drain(
        self,
        job: Job,
        fds: dict[int, int],
        futures: list[Future],
        file_bytes: dict[int, int],
        views: list[Any],
    ) -> None:
        """While the writes run: the checksums (`hash_s`) and the manifest's text; then wait,
        fsync and commit."""
        try:
            if self.options.checksums:
                h0 = _now()
                job.xxh3[:] = [checksums.checksum(v) for v in views]
                job.result.hash_s = (_now() - h0) / 1e9
            self.writer.prepare_manifest(job, file_bytes)
        except BaseException:
            self.writer.close(fds, futures)
            raise
        self.writer.drain(job, fds, futures, file_bytes)

    # -- load and housekeeping --------------------------------------------------------------

    def load(self, name: str, device: str = "cpu", checksums: bool = True, into: Any = None) -> Any:
        check_name(name)
        m = generations.read(self.targets, name)
        if into is not None:
            return self._load_into(m, into, checksums)
        dev = torch.device(device)
        packed = self._readback(m)
        if packed is not None:
            ring = self._read_ring(packed) if dev.type != "cpu" else None
            tensors = readback.read_packed(
                self.targets,
                m,
                packed,
                threads=self._read_threads(),
                check=checksums,
                device=dev,
                ring=ring,
            )
            return unflatten(m.tree, tensors)
        tensors = self._read_host(m, check=checksums)
        if dev.type != "cpu":
            tensors = [t.to(dev) for t in tensors]
        return unflatten(m.tree, tensors)

    def _load_into(self, m: manifest.Manifest, into: Any, checksums: bool) -> Any:
        """Read checkpoint `m` into the tensors of `into`, in place: contiguous host tensors
        straight into their memory, the others one at a time through host memory."""
        dst = [t for _, t in flatten(into)[1]]
        check_into(m, dst)
        packed = self._readback(m)
        if packed is not None:
            readback.read_packed(
                self.targets,
                m,
                packed,
                threads=self._read_threads(),
                check=checksums,
                ring=partial(self._read_ring, packed),
                into=dst,
                direct=bool(getattr(self.options, "restore_direct", False)),
            )
            return into
        direct = [i for i, t in enumerate(dst) if t.device.type == "cpu" and t.is_contiguous()]
        if direct:
            flat = [dst[i].detach().reshape(-1).view(torch.uint8) for i in direct]
            self._read_host(m, only=direct, check=checksums, into=flat)
        for i in sorted(set(range(len(dst))) - set(direct)):
            (src,) = self._read_host(m, only=[i], check=checksums)
            dst[i].copy_(src)
        return into

    def _read_host(
        self,
        m: manifest.Manifest,
        only: list[int] | None = None,
        check: bool = True,
        into: list[torch.Tensor] | None = None,
    ) -> list[torch.Tensor]:
        """Tensors of `m` read into host memory, a layout that is not the packed stream: with
        O_DIRECT through bounce buffers where the engine writes with O_DIRECT (gds's emulation;
        bench.storage.readback.read_extents), else through the page cache."""
        if self.traits.o_direct:
            return readback.read_extents(
                self.targets,
                m,
                threads=self._read_threads(),
                chunk=self.options.chunk_bytes,
                only=only,
                check=check,
                into=into,
            )
        return layout.read_tensors(self.targets, m, only=only, check=check, into=into)

    def _readback(self, m: manifest.Manifest) -> readback.Packed | None:
        """The packed layout of `m` where this engine restores it with O_DIRECT
        (bench.storage.readback); None: through the page cache (`layout.read_tensors`)."""
        return None

    def _read_threads(self) -> int:
        """O_DIRECT reads in flight on a restore through host memory: the writers' threads
        (gds, as kvikio's thread pool reads with the threads it writes with)."""
        return int(self.options.threads_per_target) * len(self.targets)

    def _read_ring(self, packed: readback.Packed) -> np.ndarray:
        """Aligned host memory (pinned on CUDA) for a restore through a ring of chunks."""
        raise NotImplementedError

    def check(self, name: str, state: Any) -> None:
        """Check a restored state's tensors against the checksums of `name`'s manifest."""
        m = generations.read(self.targets, check_name(name))
        if not m.checksums:
            return
        _, tensors = flatten(state)
        for e, (_, t) in zip(m.tensors, tensors, strict=True):
            if e.nbytes:
                flat = t.detach().contiguous().reshape(-1).view(torch.uint8)
                # wsum64 is computed where the bytes are (no copy off the device); xxh3 on the host
                layout.check_entry(self.targets, m, e, flat if e.wsum64 else flat.cpu())

    def warm(self, state: Any) -> None:
        """Plan `state`'s layout and make what its saves need, outside any timed region."""
        self.wait_idle()
        self._plan_for(state)

    def cached_files(self, name: str) -> list[str]:
        m = manifest.committed(self.targets, name)
        return layout.files_of(self.targets, m) if m is not None else []

    def status(self, name: str) -> str:
        """`complete`, `incomplete` (an interrupted save left files) or `absent`."""
        return generations.status(self.targets, check_name(name))

    def delete(self, name: str) -> None:
        check_name(name)
        self.wait_idle()
        self.writer.delete(name)

    def wait_idle(self) -> None:
        """Wait until no save is persisting."""
        if self._pending is not None:
            self._pending._done.wait()

    def release(self) -> None:
        """Free what is held between saves (the next `warm()` or save makes it again): a sweep
        releases every engine's before it builds the next state, so that what is held is what
        the preflight counted for that state."""
        self.wait_idle()

    def close(self) -> None:
        self.wait_idle()
        self.writer.shutdown()

    @property
    def pinned_bytes(self) -> int:
        return 0


def _host_bytes(t: torch.Tensor) -> np.ndarray:
    """The bytes of a contiguous host tensor as a flat uint8 array (no copy). Through numpy
    where it has the dtype (about half the cost of torch's reshape and view: ~2.5 vs ~4 us a
    tensor, inside the stall), through torch for the dtypes numpy lacks (bfloat16, float8)."""
    t = t.detach()
    try:
        a = t.numpy()
    except (TypeError, RuntimeError):  # a dtype numpy lacks; a conjugate or negative view
        return t.reshape(-1).view(torch.uint8).numpy()
    return a.reshape(-1).view(np.uint8)


def check_into(m: manifest.Manifest, dst: list[torch.Tensor]) -> None:
    """`dst` can take checkpoint `m` in place: as many tensors, each of its entry's bytes."""
    if len(dst) != len(m.tensors):
        raise UserError(
            f"checkpoint {m.name!r} holds {len(m.tensors)} tensors; the state to restore into "
            f"has {len(dst)}"
        )
    for e, t in zip(m.tensors, dst, strict=True):
        if t.numel() * t.element_size() != e.nbytes:
            raise UserError(
                f"checkpoint {m.name!r}: tensor {e.path} has {e.nbytes} bytes, the one to "
                f"restore it into {t.numel() * t.element_size()}"
            )


# Tensors of fewer elements than this are copied into staging by torch's batched copy
# (torch._foreach_copy_): one call for thousands of tensors, about 1.3 us a tensor where a Python
# loop of copies costs 3-5 us (issue 32). Below it torch copies a tensor in the calling thread
# alone (at::internal::GRAIN_SIZE), so no copy ends in a barrier of its thread pool, which a
# descheduled thread stretches (bench/PERF.md); larger tensors go by pieces as before.
BATCH_BELOW = 1 << 15


def batch_copy(dsts: list[torch.Tensor], srcs: list[torch.Tensor], non_blocking: bool) -> None:
    """dsts[i].copy_(srcs[i]) for every i, in one call where torch has the batched copy."""
    foreach = getattr(torch, "_foreach_copy_", None)
    if foreach is not None:
        foreach(dsts, srcs, non_blocking=non_blocking)
        return
    for d, t in zip(dsts, srcs, strict=True):  # a torch without it
        d.copy_(t, non_blocking=non_blocking)


def _split(idx: list[int], nbytes: list[int], parts: int) -> list[list[int]]:
    """`idx` cut into at most `parts` runs of about equal bytes, in order."""
    total = sum(nbytes[i] for i in idx)
    if parts <= 1 or len(idx) < 2 or not total:
        return [idx] if idx else []
    out: list[list[int]] = [[]]
    share, acc = total / parts, 0
    for i in idx:
        if acc >= share * len(out) and len(out) < parts:
            out.append([])
        out[-1].append(i)
        acc += nbytes[i]
    return [run for run in out if run]


def ring_bytes(used: int, chunk: int, slots: int) -> int:
    """Bytes of a restore's ring of `slots` chunks for a packed stream of `used` bytes: no more
    chunks than the stream has, and one short chunk rounded up to a block."""
    chunks = -(-used // chunk)
    if chunks <= 1:
        return odirect.align_up(max(used, 1))
    return min(slots, chunks) * chunk


@dataclass
class Packing:
    """Where a snapshot engine puts one plan's tensors: their offsets in the packed staging
    stream (64-byte aligned), its length, the files' lengths, and which tensors are copied by
    torch's batched copy (`batch`: small ones, whole; with overlap, only those inside one
    chunk) and which by pieces (`pieced`). Bound to one staging buffer (`bind`): its pieces,
    each tensor's bytes in it (hashed on the persist path) and the batches' typed
    destinations, made once for the layout, not at every save."""

    offsets: list[int]
    used: int
    file_bytes: dict[int, int]
    batch: list[int]
    pieced: list[int]
    array: np.ndarray | None = None
    pieces: list[layout.Piece] = field(default_factory=list)
    views: list[np.ndarray] = field(default_factory=list)
    # without overlap: host batches (one per copy thread) and the device batch
    host_groups: list[tuple[list[int], list[torch.Tensor]]] = field(default_factory=list)
    dev_group: tuple[list[int], list[torch.Tensor]] = ([], [])
    # with overlap, per chunk: its host batch, its device batch, the spans of pieced tensors in
    # it as (tensor, start, end) in staging offsets
    chunk_host: list[tuple[list[int], list[torch.Tensor]]] = field(default_factory=list)
    chunk_dev: list[tuple[list[int], list[torch.Tensor]]] = field(default_factory=list)
    chunk_spans: list[list[tuple[int, int, int]]] = field(default_factory=list)

    def bind(
        self, staging: Staging, plan: SavePlan, chunk: int, groups: int, overlap: bool
    ) -> None:
        """Make the pieces, views and destinations for `staging`'s buffer."""
        self.unbind()
        arr, tensor = staging.array, staging.tensor
        entries = plan.entries
        self.pieces = [
            layout.Piece(p.target, p.file_offset, arr, p.start, p.length) for p in self.pieces
        ]
        self.views = [arr[o : o + e.nbytes] for e, o in zip(entries, self.offsets, strict=True)]

        def dst(i: int) -> torch.Tensor:
            o = self.offsets[i]
            return tensor[o : o + entries[i].nbytes].view(plan.dtypes[i]).view(plan.shapes[i])

        def group(idx: list[int]) -> tuple[list[int], list[torch.Tensor]]:
            return idx, [dst(i) for i in idx]

        nbytes = [e.nbytes for e in entries]
        host = [i for i in self.batch if not plan.cuda[i]]
        dev = [i for i in self.batch if plan.cuda[i]]
        if not overlap:
            self.host_groups = [group(run) for run in _split(host, nbytes, groups)]
            self.dev_group = group(dev)
        else:
            n_chunks = len(self.pieces)
            by_chunk: list[list[int]] = [[] for _ in range(n_chunks)]
            for i in self.batch:
                by_chunk[self.offsets[i] // chunk].append(i)
            self.chunk_host = [group([i for i in b if not plan.cuda[i]]) for b in by_chunk]
            self.chunk_dev = [group([i for i in b if plan.cuda[i]]) for b in by_chunk]
            self.chunk_spans = [[] for _ in range(n_chunks)]
            for i in self.pieced:
                pos, end = self.offsets[i], self.offsets[i] + nbytes[i]
                while pos < end:
                    j = pos // chunk
                    stop = min(end, (j + 1) * chunk)
                    self.chunk_spans[j].append((i, pos, stop))
                    pos = stop
        self.array = arr

    def unbind(self) -> None:
        """Drop every view of the staging buffer, so that releasing it frees its memory."""
        self.array = None
        self.pieces = [
            layout.Piece(p.target, p.file_offset, None, p.start, p.length) for p in self.pieces
        ]
        self.views = []
        self.host_groups, self.dev_group = [], ([], [])
        self.chunk_host, self.chunk_dev, self.chunk_spans = [], [], []


class SnapshotEngine(StripedEngine):
    """cpu-double and cpu-single: snapshot into staging (the stall), persist in the background.

    The snapshot of a state of many small tensors costs little per tensor: the plan of its
    layout (bench.storage.plan) and its Packing are made once (in `warm()`, or by the first
    save of the layout), and each save walks the state, copies the small tensors with torch's
    batched copy and the large ones by pieces in the copy threads, and starts its persist."""

    def __init__(self, targets: list[str], **options: Any) -> None:
        super().__init__(targets, **options)
        self.staging = Staging(self.device)
        n_copy = self.options.copy_threads or min(os.cpu_count() or 1, 8)
        self._n_copy = n_copy
        self._copy_pool = (
            ThreadPoolExecutor(max_workers=n_copy, thread_name_prefix=f"{self.name}-copy")
            if n_copy > 1
            else None
        )
        self.overlap = self._resolve_overlap(n_copy)
        self._packing: Packing | None = None

    def _resolve_overlap(self, n_copy: int) -> bool:
        """`overlap: auto`: on when the snapshot is a DMA (CUDA) or the copy threads leave a
        CPU free for the writes; off when they hold every CPU (see SnapshotOptions.overlap)."""
        opt = self.options.overlap
        if opt != "auto":
            return bool(opt)
        return self.device.is_cuda or n_copy < (os.cpu_count() or 1)

    @property
    def pinned_bytes(self) -> int:
        return self.staging.pinned_bytes

    @classmethod
    def memory_plan(cls, size: StateSize, options: Any) -> MemoryPlan:
        """Staging of the whole state, each tensor 4 KiB-aligned (or `staging_chunks` chunks),
        pinned on CUDA; cpu-double's writes fill the page cache with the state."""
        packed = size.nbytes + size.tensors * odirect.ALIGN
        k = options.staging_chunks
        staging = min(packed, k * options.chunk_bytes) if k else packed
        base = super().memory_plan(size, options)
        if not cls.traits.o_direct:
            return MemoryPlan(
                staging=staging,
                pinned=size.cuda,
                page_cache=size.nbytes if cls.traits.page_cache else 0,
                restore_host=base.restore_host,
                restore_device=base.restore_device,
                in_place_host=base.in_place_host,
            )
        # The O_DIRECT restore (bench.storage.readback): into new memory, one buffer laid out as
        # the packed stream (host, or device on CUDA, through a ring of chunks); in place,
        # through that ring. The ring is the staging, grown where it is smaller.
        stream = size.nbytes + size.tensors * layout.TENSOR_ALIGN
        slots = options.read_threads_per_target * size.targets + 1
        ring = max(0, ring_bytes(stream, options.chunk_bytes, slots) - staging)
        return MemoryPlan(
            staging=staging,
            pinned=size.cuda,
            page_cache=size.nbytes if cls.traits.page_cache else 0,
            restore_host=ring if size.cuda else stream,
            restore_device=stream if size.cuda else 0,
            in_place_host=ring,
        )

    def forget(self) -> None:
        """Complement the staging, untimed, before a restart's load: it holds the snapshot of
        the last save (the checkpoint's bytes), which a restarted process would not hold, and
        a restore through it as a ring that skipped a read would copy them out unnoticed."""
        self.wait_idle()
        a = self.staging.array
        if a.size:
            np.bitwise_not(a, out=a)

    def _read_threads(self) -> int:
        """O_DIRECT reads in flight on a restore (`read_threads_per_target` per target)."""
        return int(self.options.read_threads_per_target) * len(self.targets)

    def _readback(self, m: manifest.Manifest) -> readback.Packed | None:
        """cpu-single (O_DIRECT) reads its packed stream back with O_DIRECT; cpu-double reads
        through the page cache, as it writes."""
        return readback.packing(m) if self.traits.o_direct else None

    def _read_ring(self, packed: readback.Packed) -> np.ndarray:
        """The staging buffer as the ring of a restore to a device or in place: one slot per
        read in flight and one being copied out (one slot for a single-chunk checkpoint); it
        grows to that if smaller. Only once no save persists from it."""
        self.wait_idle()
        need = ring_bytes(packed.used, packed.chunk, self._read_threads() + 1)
        if need > self.staging.capacity and self._packing is not None:
            self._packing.unbind()  # no view may keep the old buffer's memory
        self.staging.ensure(need)
        return self.staging.array[:need]

    def _staging_need(self, used: int) -> int:
        k = self.options.staging_chunks
        return min(used, k * self.options.chunk_bytes) if k else used

    def _place(self, plan: SavePlan, tensors: list[torch.Tensor]) -> None:
        """The packed layout: every tensor at a 64-byte aligned offset of one stream, cut into
        chunks dealt round-robin to the targets; extents into the plan's entries."""
        if self._packing is not None:
            self._packing.unbind()
        entries, chunk = plan.entries, self.options.chunk_bytes
        offsets, used = layout.pack_offsets(entries)
        pieces, file_bytes = layout.packed(
            np.empty(0, dtype=np.uint8), used, entries, offsets, len(self.targets), chunk
        )
        batch: list[int] = []
        pieced: list[int] = []
        for i, (t, e, off) in enumerate(zip(tensors, entries, offsets, strict=True)):
            if not e.nbytes:
                continue
            whole = not self.overlap or off // chunk == (off + e.nbytes - 1) // chunk
            (batch if t.numel() < BATCH_BELOW and whole else pieced).append(i)
        self._packing = Packing(offsets, used, file_bytes, batch, pieced, pieces=pieces)

    def _bound(self, plan: SavePlan) -> tuple[Packing, bool]:
        """The plan's Packing, bound to a staging buffer large enough for it; True if the
        buffer had to grow (be made anew)."""
        pk = self._packing
        assert pk is not None, "a plan is placed before it is bound"
        need = self._staging_need(pk.used)
        if pk.array is not None and pk.array is self.staging.array:
            return pk, False
        pk.unbind()  # no view of the old buffer may keep its memory
        grew = self.staging.ensure(need)
        if not self.options.staging_chunks:
            pk.bind(self.staging, plan, self.options.chunk_bytes, self._n_copy, self.overlap)
        return pk, grew

    def warm(self, state: Any) -> None:
        """The state's plan and its Packing, and staging for it: made, pre-faulted and bound
        here, outside any timed region."""
        self.wait_idle()
        plan, _, _ = self._plan_for(state)
        self._bound(plan)

    def release(self) -> None:
        super().release()
        if self._packing is not None:
            self._packing.unbind()
        self.staging.release()

    def close(self) -> None:
        super().close()
        if self._packing is not None:
            self._packing.unbind()
        if self._copy_pool is not None:
            self._copy_pool.shutdown(wait=True)
        self.staging.release()

    def _save(self, pending: PendingSave, job: Job) -> None:
        if self.options.staging_chunks:
            self._save_ring(pending, job)
            return
        pk, grew = self._bound(job.plan)
        job.result.staging_grew = grew
        if self.overlap:
            self._save_overlapped(pending, job, pk)
            return
        result, tensors, entries = job.result, job.tensors, job.plan.entries
        staging, arr = self.staging.tensor, self.staging.array
        c0 = _now()
        work = [
            partial(batch_copy, dsts, [tensors[i] for i in idx], False)
            for idx, dsts in pk.host_groups
        ]
        idx, dsts = pk.dev_group
        if idx:  # device-to-host copies are queued from this thread, on its current stream
            batch_copy(dsts, [tensors[i] for i in idx], True)
        host = []
        for i in pk.pieced:
            t, off, n = tensors[i], pk.offsets[i], entries[i].nbytes
            if t.device.type == "cpu" and t.is_contiguous():
                host.append((arr[off : off + n], _host_bytes(t)))
            else:
                staging[off : off + n].view(t.dtype).view(t.shape).copy_(t, non_blocking=True)
        # Host bytes: the batches and plain memcpys (np.copyto releases the GIL) in pieces that
        # the copy threads take from one queue. Not torch's copy_ for large tensors: its
        # parallel copy ends every tensor with a thread barrier, which stretched the stall badly
        # when another process held a core (64 x 4 MiB: 155 ms instead of 33 ms on a busy
        # 2-core host); a queue of pieces loses at most one piece's time to a descheduled
        # thread (bench/PERF.md).
        work += [partial(run_copies, task) for task in copy_tasks(host, COPY_PIECE)]
        if self._copy_pool is not None and len(work) > 1:
            list(self._copy_pool.map(lambda f: f(), work))
        else:
            for f in work:
                f()
        self.device.synchronize()
        result.pinned_bytes = self.staging.pinned_bytes
        result.detail = SnapshotDetail(
            copy_s=(_now() - c0) / 1e9,
            overlap=False,
            **(self.staging.describe() if self.device.is_cuda else {}),
        )
        self._in_background(pending, lambda: self._persist(job, pk.pieces, pk.file_bytes, pk.views))

    def _save_overlapped(self, pending: PendingSave, job: Job, pk: Packing) -> None:
        """The whole state into staging chunk by chunk, each chunk written as soon as it is in
        staging: persisting starts with the first chunk instead of after the last, so the time
        to durability approaches max(copy, write) rather than their sum, while the stall still
        ends when the last byte is in staging. Host chunks are copied by the copy threads, each
        submitting its chunk's write when done; device chunks are copied on a side CUDA stream
        with an event per chunk, and each write waits for its chunk's event (the copy of chunk
        k+1 overlaps the write of chunk k)."""
        result, tensors = job.result, job.tensors
        staging, arr = self.staging.tensor, self.staging.array
        pieces, file_bytes, offsets = pk.pieces, pk.file_bytes, pk.offsets
        c0 = _now()
        # Pieced tensors: contiguous ones are copied chunk by chunk; a strided one goes whole
        # into its staging region up front, by a strided copy (no extra contiguous copy).
        srcs: dict[int, Any] = {}
        strided: list[tuple[torch.Tensor, int]] = []
        for i in pk.pieced:
            src = tensors[i].detach()
            if not src.is_contiguous():
                strided.append((src, offsets[i]))
                continue
            flat = src.reshape(-1).view(torch.uint8)
            srcs[i] = flat.numpy() if flat.device.type == "cpu" else flat
        fds_f = self.writer.pool.submit(self.writer.open, result, file_bytes)
        writes: list[Future | None] = [None] * len(pieces)
        stream = None
        if any(job.plan.cuda):
            stream = torch.cuda.Stream(device=self.device.torch_device)
            stream.wait_stream(torch.cuda.current_stream(self.device.torch_device))
        # `last`: the newest event on the copy stream. Its copies run in order, so a chunk waits
        # for the newest event recorded when it is handed on: the strided copies' event, for a
        # chunk that holds only bytes of a strided device tensor. Blocking events: a writer
        # thread waiting on one sleeps (cudaEventBlockingSync) where it would otherwise spin a
        # CPU, which the row's CPU time would count (bench.common.devices.blocking_sync).
        last = None
        for src, off in strided:
            dst = staging[off : off + src.numel() * src.element_size()]
            dst = dst.view(src.dtype).view(src.shape)
            if src.device.type == "cpu":
                dst.copy_(src)
            else:
                with torch.cuda.stream(stream):
                    dst.copy_(src, non_blocking=True)
                    last = torch.cuda.Event(blocking=True)
                    last.record(stream)

        # While the snapshot runs, at most `during` writes are in flight: enough to keep the
        # disk busy, few enough not to take the cores the copy needs (bench/PERF.md); all the
        # writer threads join once the stall is over.
        gate = threading.Semaphore(self.options.overlap_writes or 1 << 30)
        copying = threading.Event()
        copying.set()

        def write(j: int, event: Any) -> None:
            fds = fds_f.result()
            if event is not None:
                event.synchronize()
            held = copying.is_set() and gate.acquire()
            try:
                self.writer.write(fds[pieces[j].target], pieces[j])
            finally:
                if held:
                    gate.release()

        def copy_chunk(j: int, event: Any) -> None:
            idx, dsts = pk.chunk_host[j]
            if idx:
                batch_copy(dsts, [tensors[i] for i in idx], False)
            for i, a, b in pk.chunk_spans[j]:
                src = srcs.get(i)
                if isinstance(src, np.ndarray):  # host; strided ones are in staging already
                    np.copyto(arr[a:b], src[a - offsets[i] : b - offsets[i]])
            writes[j] = self.writer.pool.submit(write, j, event)

        copies: list[Future] = []
        try:
            for j in range(len(pieces)):
                event = last
                dev_idx, dev_dsts = pk.chunk_dev[j]
                device_spans = [
                    (i, a, b)
                    for i, a, b in pk.chunk_spans[j]
                    if i in srcs and not isinstance(srcs[i], np.ndarray)
                ]
                if dev_idx or device_spans:
                    with torch.cuda.stream(stream):
                        if dev_idx:
                            batch_copy(dev_dsts, [tensors[i] for i in dev_idx], True)
                        for i, a, b in device_spans:
                            staging[a:b].copy_(
                                srcs[i][a - offsets[i] : b - offsets[i]], non_blocking=True
                            )
                        event = last = torch.cuda.Event(blocking=True)
                        event.record(stream)
                if self._copy_pool is not None:
                    copies.append(self._copy_pool.submit(copy_chunk, j, event))
                else:
                    copy_chunk(j, event)
            for f in copies:
                f.result()
            if stream is not None:
                stream.synchronize()
        except BaseException:
            for f in copies:
                try:
                    f.result()
                except BaseException:
                    pass
            self.writer.close(fds_f.result(), [f for f in writes if f is not None])
            raise
        result.pinned_bytes = self.staging.pinned_bytes
        copying.clear()
        result.detail = SnapshotDetail(
            copy_s=(_now() - c0) / 1e9,
            overlap=True,
            **(self.staging.describe() if self.device.is_cuda else {}),
        )
        futures = [f for f in writes if f is not None]
        self._in_background(
            pending,
            lambda: self._hash_and_drain(job, fds_f.result(), futures, file_bytes, pk.views),
        )

    def _save_ring(self, pending: PendingSave, job: Job) -> None:
        """Bounded staging: a ring of K chunk buffers. Each chunk of the packed stream is copied
        into a free slot and written at once; save() returns when the last chunk is copied, so
        host memory is K x chunk and the stall grows toward the write time as K shrinks.
        Checksums are updated chunk by chunk in the copying thread (inside the stall). Made for
        states larger than host memory can stage, of large tensors: it copies tensor by
        tensor, a few microseconds each."""
        result, tensors, entries = job.result, job.tensors, job.plan.entries
        pk, grew = self._bound(job.plan)
        result.staging_grew = grew
        k, chunk, n = self.options.staging_chunks, self.options.chunk_bytes, len(self.targets)
        offsets, used, file_bytes = pk.offsets, pk.used, pk.file_bytes
        srcs: list[torch.Tensor | None] = []
        for t in tensors:
            src = t.detach()
            if not src.is_contiguous():
                src = src.contiguous()
                result.copied_tensors += 1
            srcs.append(src.reshape(-1).view(torch.uint8) if src.numel() else None)
        hashers = [xxhash.xxh3_64() for _ in entries] if self.options.checksums else None
        ring, ring_arr = self.staging.tensor, self.staging.array
        slots: list[Future | None] = [None] * k
        fds = self.writer.open(result, file_bytes)
        hash_ns, first = 0, 0
        c0 = _now()
        try:
            for j in range(-(-used // chunk)):
                lo, hi = j * chunk, min((j + 1) * chunk, used)
                base = (j % k) * chunk
                if slots[j % k] is not None:
                    slots[j % k].result()  # the slot's previous chunk is on its way to disk
                while first < len(entries) and offsets[first] + entries[first].nbytes <= lo:
                    first += 1
                spans = []
                for i in range(first, len(entries)):
                    if offsets[i] >= hi:
                        break
                    a, b = max(lo, offsets[i]), min(hi, offsets[i] + entries[i].nbytes)
                    whole_src = srcs[i]
                    if b > a and whole_src is not None:  # an entry with bytes has a source
                        src = whole_src[a - offsets[i] : b - offsets[i]]
                        if src.device.type == "cpu":
                            np.copyto(ring_arr[base + a - lo : base + b - lo], src.numpy())
                        else:
                            ring[base + a - lo : base + b - lo].copy_(src, non_blocking=True)
                        spans.append((i, base + a - lo, base + b - lo))
                self.device.synchronize()
                if hashers is not None:
                    h0 = _now()
                    for i, a, b in spans:
                        hashers[i].update(ring_arr[a:b].data)
                    hash_ns += _now() - h0
                piece = layout.Piece(j % n, (j // n) * chunk, ring_arr, base, hi - lo)
                slots[j % k] = self.writer.pool.submit(self.writer.write, fds[piece.target], piece)
        except BaseException:
            self.writer.close(fds, [f for f in slots if f is not None])
            raise
        if hashers is not None:
            job.xxh3[:] = [h.hexdigest() for h in hashers]
        result.hash_s = hash_ns / 1e9
        result.pinned_bytes = self.staging.pinned_bytes
        result.detail = SnapshotDetail(
            copy_s=(_now() - c0) / 1e9,  # with the writes of all but the last K chunks
            **(self.staging.describe() if self.device.is_cuda else {}),
        )
        futures = [f for f in slots if f is not None]
        self._in_background(pending, lambda: self.writer.drain(job, fds, futures, file_bytes))
