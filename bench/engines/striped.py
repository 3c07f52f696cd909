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
import shutil
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
from bench.storage import checksums, generations, layout, manifest, odirect, pacing
from bench.storage.plan import SavePlan, walk
from bench.storage.staging import COPY_PIECE, Staging, copy_tasks, run_copies
from bench.storage.tree import flatten, unflatten


def _now() -> int:
    return time.perf_counter_ns()


@dataclass
class Job:
    """One save on its way through an engine: its result, its plan, this save's tensors and
    scalar values, and the checksums its persist records (one slot per tensor)."""

    result: SaveResult
    plan: SavePlan
    tensors: list[torch.Tensor]
    scalars: list[Any]
    xxh3: list[str | None]
    wsum64: list[str | None]
    # The manifest and its text, rendered while the data is written (`prepare_manifest`)
    manifest: manifest.Manifest | None = None
    text: str | None = None


class StripedEngine:
    """Base of the three data paths; subclasses set `name`, `traits` and `_save()`."""

    name: ClassVar[str]
    traits: ClassVar[Traits]
    restore_mode = "host"

    def __init__(self, targets: list[str], **options: Any) -> None:
        self.options = build_options(self.name, options)
        self.targets = check_targets(self.name, targets)
        self.o_direct = self.traits.o_direct
        if self.o_direct:
            for t in self.targets:
                reason = odirect.probe(t)
                if reason:
                    raise UserError(f"target {t}: {reason}; engine {self.name} needs O_DIRECT")
        try:
            self.device = detect(self.options.device)
        except UserError as e:
            raise UserError(f"engine {self.name}: {e}") from None
        self.staging = Staging(self.device)
        n_threads = self.options.threads_per_target * len(self.targets)
        self._pool = ThreadPoolExecutor(max_workers=n_threads, thread_name_prefix=f"{self.name}-io")
        # gds copies nothing: no copy threads (its options have none)
        copy_threads = getattr(self.options, "copy_threads", None)
        n_copy = 1 if copy_threads is None else copy_threads or min(os.cpu_count() or 1, 8)
        self._n_copy = n_copy
        self._copy_pool = (
            ThreadPoolExecutor(max_workers=n_copy, thread_name_prefix=f"{self.name}-copy")
            if n_copy > 1
            else None
        )
        self._pending: PendingSave | None = None
        self._plan: SavePlan | None = None  # of the last state saved (bench.storage.plan)
        self.overlap = self._resolve_overlap(n_copy)
        caps = self.options.max_write_bw
        if isinstance(caps, list | tuple) and len(caps) != len(self.targets):
            raise UserError(
                f"engine {self.name}: max_write_bw lists {len(caps)} caps for "
                f"{len(self.targets)} targets"
            )
        caps = list(caps) if isinstance(caps, list | tuple) else [caps] * len(self.targets)
        burst = self.options.chunk_bytes
        self._buckets = [pacing.TokenBucket(c, burst) if c else None for c in caps]

    @classmethod
    def unavailable(cls, options: dict[str, Any] | None = None) -> str | None:
        return None

    @classmethod
    def memory_plan(cls, size: StateSize, options: Any) -> MemoryPlan:
        """The direct path holds no staging (`Gds` adds its bounce buffers). A restore into new
        memory reads every tensor into host memory (then to the device on CUDA); in place,
        host tensors are read straight into their memory and device tensors one at a time
        through host memory."""
        return MemoryPlan(
            save=0,
            restore_host=size.nbytes,
            restore_device=size.nbytes if size.cuda else 0,
            in_place_host=size.largest if size.cuda else 0,
        )

    def _resolve_overlap(self, n_copy: int) -> bool:
        """`overlap: auto`: on when the snapshot is a DMA (CUDA) or the copy threads leave a
        CPU free for the writes; off when they hold every CPU (see SnapshotOptions.overlap)."""
        opt = getattr(self.options, "overlap", False)
        if opt != "auto":
            return bool(opt)
        return self.device.is_cuda or n_copy < (os.cpu_count() or 1)

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
        # `_prepare`, with this save's first file: after the stall on the snapshot engines,
        # inside it with bounded staging (its first chunk is written while it copies).
        generations.check_claim(self.targets, name)
        try:
            with torch.no_grad():
                self._save(pending, job)
        except BaseException:
            self._abort(name, result.save_id)
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

    def _prepare(self, result: SaveResult) -> None:
        """Claim the name for these targets (checked again: a list that claimed it since save()
        began is refused here, before any file of this save exists), remove what interrupted
        saves of the name left behind, then mark this save running. Called just before this
        save's first file is opened, so that claim and marker come before any data: on the
        snapshot engines that is in the background, after the stall (the claim creates the
        name's folders and writes a record, 0.3 ms here and 1-1.5 ms right after a cache drop;
        the leftover scan reads the committed manifest, ~1 ms for 256 tensors)."""
        generations.claim(self.targets, result.name)
        generations.remove_files(generations.leftovers(self.targets, result.name))
        generations.begin(self.targets, result.name, result.save_id)

    def _abort(self, name: str, save_id: str) -> None:
        """A failed save removes its own files; the committed generation stays as it was."""
        generations.remove_files(generations.generation_files(self.targets, name, save_id))
        generations.release(self.targets, name)

    def _in_background(self, pending: PendingSave, persist: Any) -> None:
        """Run the persist phase in the background; on failure remove this save's files."""
        name, save_id = pending.result.name, pending.result.save_id

        def run() -> None:
            try:
                persist()
            except BaseException:
                self._abort(name, save_id)
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
        fds = self._open(job.result, file_bytes)
        futures: list[Future] = []
        try:
            futures = [self._pool.submit(self._write_piece, fds[p.target], p) for p in pieces]
        except BaseException:
            self._close(fds, futures)
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
        """While the writes run: the checksums (`hash_s`); then wait, fsync and commit."""
        try:
            if self.options.checksums:
                h0 = _now()
                self._hash_all(job, views)
                job.result.hash_s = (_now() - h0) / 1e9
            self._prepare_manifest(job, file_bytes)
        except BaseException:
            self._close(fds, futures)
            raise
        self._drain(job, fds, futures, file_bytes)

    def _prepare_manifest(self, job: Job, file_bytes: dict[int, int]) -> None:
        """The manifest of this save and its text, once its checksums are known: rendered
        while its data is still being written, so that only writing it is left after the
        data is durable (3.3 MB and 12 ms of rendering for 20,000 tensors)."""
        result, plan = job.result, job.plan
        assert plan.table is not None
        job.manifest = manifest.Manifest(
            name=result.name,
            engine=self.name,
            targets=self.targets,
            files={
                t: {"file": manifest.data_file_name(t, result.save_id), "bytes": n}
                for t, n in file_bytes.items()
            },
            tensors=plan.entries,  # their text, with this save's checksums, is tensors_json
            tree=None,  # its text, with this save's scalars, is tree_json
            checksums=self.options.checksums,
            payload_bytes=result.bytes,
            save_id=result.save_id,
            extra={"chunk_bytes": self.options.chunk_bytes, "o_direct": self.o_direct},
            tree_json=plan.tree_json(job.scalars),
            tensors_json=plan.table.render(job.xxh3, job.wsum64),
        )
        job.text = job.manifest.to_json()

    def _hash_all(self, job: Job, views: list[Any]) -> None:
        """Record the checksum of every tensor's bytes (host memory: xxh3)."""
        job.xxh3[:] = [checksums.checksum(v) for v in views]

    def _open(self, result: SaveResult, file_bytes: dict[int, int]) -> dict[int, int]:
        """Mark this save running (`_prepare`), then open its data file on every target that
        gets data."""
        self._prepare(result)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_DIRECT if self.o_direct else 0)
        fds: dict[int, int] = {}
        try:
            for t, n in file_bytes.items():
                path = layout.data_file(self.targets, result.name, t, result.save_id)
                fds[t] = os.open(path, flags, 0o644)
                if self.options.fallocate and n:
                    odirect.preallocate(fds[t], n)
        except BaseException:
            self._close(fds, [])
            raise
        return fds

    @staticmethod
    def _close(fds: dict[int, int], futures: list[Future]) -> None:
        """Close the files once no write is in flight (a write on a reused descriptor could land
        in another file)."""
        for f in futures:
            if f is not None:
                try:
                    f.result()
                except BaseException:  # the first error is raised by the caller
                    pass
        for fd in fds.values():
            os.close(fd)

    def _drain(
        self,
        job: Job,
        fds: dict[int, int],
        futures: list[Future],
        file_bytes: dict[int, int],
    ) -> None:
        """Wait for the writes, trim the padding, fsync, close, then commit the manifest."""
        try:
            for f in futures:
                if f is not None:
                    f.result()
            for t, fd in fds.items():
                # O_DIRECT pads the last block; the file keeps exactly its data.
                if os.fstat(fd).st_size != file_bytes[t]:
                    os.ftruncate(fd, file_bytes[t])
            list(self._pool.map(os.fsync, fds.values()))
        finally:
            self._close(fds, futures)
        self._commit(job, file_bytes)

    def _write_piece(self, fd: int, piece: layout.Piece) -> None:
        """One piece, paced when its target carries a write-bandwidth cap."""
        bucket = self._buckets[piece.target]
        if bucket is not None:
            bucket.take(piece.length)
        layout.write_piece(fd, piece, self.o_direct)

    def _commit(self, job: Job, file_bytes: dict[int, int]) -> None:
        """Make the new files durable, switch the manifest to them, then drop the old generation."""
        result = job.result
        name, save_id = result.name, result.save_id
        for t in self.targets:
            manifest.fsync_dir(manifest.checkpoint_dir(t, name))
            manifest.fsync_dir(t)
        if job.manifest is None:
            self._prepare_manifest(job, file_bytes)
        assert job.manifest is not None
        previous = manifest.committed(self.targets, name)
        damaged = previous is None and os.path.exists(manifest.manifest_path(self.targets, name))
        manifest.commit(self.targets, job.manifest, job.text)
        done = generations.generation_files(self.targets, name, save_id)
        old = []
        if previous is not None and previous.save_id != save_id:
            # Its data files, and its marker if a kill cut short the cleanup of its own commit.
            old = layout.files_of(previous.targets, previous)
            old += generations.generation_files(self.targets, name, previous.save_id)
        elif damaged:
            # The manifest replaced could not be read: its generation is unknown, but every
            # file of a dead save other than this one is now a leftover (the old generation's
            # data among them; a save still in flight is spared by its live marker).
            old = generations.leftovers(self.targets, name, keep=save_id)
        generations.remove_files(
            old + [p for p in done if os.path.basename(p).startswith(".saving-")]
        )
        result.targets_used = len(file_bytes)

    # -- load and housekeeping --------------------------------------------------------------

    def load(self, name: str, device: str = "cpu", checksums: bool = True, into: Any = None) -> Any:
        check_name(name)
        m = generations.read(self.targets, name)
        if into is not None:
            return self._load_into(m, into, checksums)
        tensors = layout.read_tensors(self.targets, m, check=checksums)
        dev = torch.device(device)
        if dev.type != "cpu":
            tensors = [t.to(dev) for t in tensors]
        return unflatten(m.tree, tensors)

    def _load_into(self, m: manifest.Manifest, into: Any, checksums: bool) -> Any:
        """Read checkpoint `m` into the tensors of `into`, in place: contiguous host tensors
        straight into their memory, the others one at a time through host memory."""
        dst = [t for _, t in flatten(into)[1]]
        check_into(m, dst)
        direct = [i for i, t in enumerate(dst) if t.device.type == "cpu" and t.is_contiguous()]
        if direct:
            flat = [dst[i].detach().reshape(-1).view(torch.uint8) for i in direct]
            layout.read_tensors(self.targets, m, only=direct, check=checksums, into=flat)
        for i in sorted(set(range(len(dst))) - set(direct)):
            (src,) = layout.read_tensors(self.targets, m, only=[i], check=checksums)
            dst[i].copy_(src)
        return into

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
        """Grow and pre-fault the staging buffer for `state` (no-op for the direct path)."""

    def cached_files(self, name: str) -> list[str]:
        m = manifest.committed(self.targets, name)
        return layout.files_of(self.targets, m) if m is not None else []

    def status(self, name: str) -> str:
        """`complete`, `incomplete` (an interrupted save left files) or `absent`."""
        return generations.status(self.targets, check_name(name))

    def delete(self, name: str) -> None:
        check_name(name)
        if self._pending is not None:
            self._pending._done.wait()
        generations.check_claim(self.targets, name)  # never another target list's checkpoint
        manifest.uncommit(self.targets, name)
        for t in self.targets:
            shutil.rmtree(manifest.checkpoint_dir(t, name), ignore_errors=True)

    def wait_idle(self) -> None:
        """Wait until no save is persisting."""
        if self._pending is not None:
            self._pending._done.wait()

    def release(self) -> None:
        """Free the staging (the next `warm()` or save allocates it again): a sweep releases
        every engine's before it builds the next state, so that what is held is what the
        preflight counted for that state."""
        self.wait_idle()
        self.staging.release()

    def close(self) -> None:
        self.wait_idle()
        self._pool.shutdown(wait=True)
        if self._copy_pool is not None:
            self._copy_pool.shutdown(wait=True)
        self.staging.release()

    @property
    def pinned_bytes(self) -> int:
        return self.staging.pinned_bytes


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

    _packing: Packing | None = None

    @classmethod
    def memory_plan(cls, size: StateSize, options: Any) -> MemoryPlan:
        """Staging of the whole state, each tensor 4 KiB-aligned (or `staging_chunks` chunks),
        pinned on CUDA; cpu-double's writes fill the page cache with the state."""
        packed = size.nbytes + size.tensors * odirect.ALIGN
        k = options.staging_chunks
        base = super().memory_plan(size, options)
        return MemoryPlan(
            staging=min(packed, k * options.chunk_bytes) if k else packed,
            pinned=size.cuda,
            page_cache=size.nbytes if cls.traits.page_cache else 0,
            restore_host=base.restore_host,
            restore_device=base.restore_device,
            in_place_host=base.in_place_host,
        )

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
        batch, pieced = [], []
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
        self.wait_idle()
        if self._packing is not None:
            self._packing.unbind()
        super().release()

    def close(self) -> None:
        self.wait_idle()
        if self._packing is not None:
            self._packing.unbind()
        super().close()

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
        result.extra = {
            "overlap": False,
            "copy_s": (_now() - c0) / 1e9,
            **(self.staging.describe() if self.device.is_cuda else {}),
        }
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
        fds_f = self._pool.submit(self._open, result, file_bytes)
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
                self._write_piece(fds[pieces[j].target], pieces[j])
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
            writes[j] = self._pool.submit(write, j, event)

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
            self._close(fds_f.result(), [f for f in writes if f is not None])
            raise
        result.pinned_bytes = self.staging.pinned_bytes
        copying.clear()
        result.extra = {
            "overlap": True,
            "copy_s": (_now() - c0) / 1e9,
            **(self.staging.describe() if self.device.is_cuda else {}),
        }
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
        srcs = []
        for t in tensors:
            src = t.detach()
            if not src.is_contiguous():
                src = src.contiguous()
                result.copied_tensors += 1
            srcs.append(src.reshape(-1).view(torch.uint8) if src.numel() else None)
        hashers = [xxhash.xxh3_64() for _ in entries] if self.options.checksums else None
        ring, ring_arr = self.staging.tensor, self.staging.array
        slots: list[Future | None] = [None] * k
        fds = self._open(result, file_bytes)
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
                    if b > a:
                        src = srcs[i][a - offsets[i] : b - offsets[i]]
                        if src.device.type == "cpu":
                            np.copyto(ring_arr[base + a - lo : base + b - lo], src.numpy())
                        else:
                            ring[base + a - lo : base + b - lo].copy_(src, non_blocking=True)
                        spans.append((i, base + a - lo, base + b - lo))
                self.device.synchronize()
                if hashers is not None:
                    h0 = _now()
                    for i, a, b in spans:
                        hashers[i].update(ring_arr[a:b])
                    hash_ns += _now() - h0
                piece = layout.Piece(j % n, (j // n) * chunk, ring_arr, base, hi - lo)
                slots[j % k] = self._pool.submit(self._write_piece, fds[piece.target], piece)
        except BaseException:
            self._close(fds, [f for f in slots if f is not None])
            raise
        if hashers is not None:
            job.xxh3[:] = [h.hexdigest() for h in hashers]
        result.hash_s = hash_ns / 1e9
        result.pinned_bytes = self.staging.pinned_bytes
        result.extra = {
            "copy_s": (_now() - c0) / 1e9,  # with the writes of all but the last K chunks
            **(self.staging.describe() if self.device.is_cuda else {}),
        }
        futures = [f for f in slots if f is not None]
        self._in_background(pending, lambda: self._drain(job, fds, futures, file_bytes))
