"""Machinery shared by the three data paths (gds, cpu-double, cpu-single).

All three stripe the checkpoint over N targets (one data file per target, fixed-size chunks dealt
round-robin, see bench.storage.layout), write with a pool of `threads_per_target x N` threads (os.pwrite
releases the GIL), fsync every file and directory, and then commit the manifest. They differ in
where the bytes come from and how they are written:
- snapshot engines (cpu-double, cpu-single) copy the state into a reusable staging buffer; the
  stall ends there and a background thread persists from the buffer;
- the direct engine (gds) writes from the tensors' own memory and the stall lasts until durable.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
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
from bench.storage.staging import COPY_PIECE, Staging, copy_tasks, run_copies
from bench.storage.tree import flatten, unflatten


def _now() -> int:
    return time.perf_counter_ns()


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
        self._copy_pool = (
            ThreadPoolExecutor(max_workers=n_copy, thread_name_prefix=f"{self.name}-copy")
            if n_copy > 1
            else None
        )
        self._pending: PendingSave | None = None
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
        t0 = _now()
        check_name(name)
        wait_prev = 0.0
        if self._pending is not None and not self._pending.done():
            self._pending._done.wait()  # its error, if any, is reported by its own wait()
            wait_prev = (_now() - t0) / 1e9
        tree, tensors = flatten(state)
        entries = [manifest.tensor_entry(p, t) for p, t in tensors]
        result = SaveResult(
            name=name,
            bytes=sum(e.nbytes for e in entries),
            wait_prev_s=wait_prev,
            checksums=self.options.checksums,
            gds_mode=self.gds_mode(),
        )
        result.save_id = manifest.new_save_id()
        pending = PendingSave(result, t0)
        # A refusal raises here, before anything is written; the claim itself is written by
        # `_prepare`, with this save's first file: after the stall on the snapshot engines,
        # inside it with bounded staging (its first chunk is written while it copies).
        generations.check_claim(self.targets, name)
        try:
            with torch.no_grad():
                self._save(pending, tree, tensors, entries)
        except BaseException:
            self._abort(name, result.save_id)
            raise
        self._pending = pending
        return pending

    def _save(self, pending: PendingSave, tree: Any, tensors: list, entries: list) -> None:
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
        result: SaveResult,
        name: str,
        tree: Any,
        entries: list[manifest.TensorEntry],
        pieces: list[layout.Piece],
        file_bytes: dict[int, int],
        hash_views: list[np.ndarray],
    ) -> None:
        """Write every piece, hash, fsync files and directories, then commit the manifest."""
        fds = self._open(result, file_bytes)
        futures: list[Future] = []
        try:
            futures = [self._pool.submit(self._write_piece, fds[p.target], p) for p in pieces]
        except BaseException:
            self._close(fds, futures)
            raise
        self._hash_and_drain(result, tree, entries, fds, futures, file_bytes, hash_views)

    def _hash_and_drain(
        self,
        result: SaveResult,
        tree: Any,
        entries: list[manifest.TensorEntry],
        fds: dict[int, int],
        futures: list[Future],
        file_bytes: dict[int, int],
        views: list[Any],
    ) -> None:
        """While the writes run: the checksums (`hash_s`); then wait, fsync and commit."""
        try:
            if self.options.checksums:
                h0 = _now()
                for e, view in zip(entries, views, strict=True):
                    self._hash(e, view)
                result.hash_s = (_now() - h0) / 1e9
        except BaseException:
            self._close(fds, futures)
            raise
        self._drain(result, tree, entries, fds, futures, file_bytes)

    def _hash(self, entry: manifest.TensorEntry, view: Any) -> None:
        """Record the checksum of one tensor's bytes (host memory: xxh3)."""
        entry.xxh3 = checksums.checksum(view)

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
        result: SaveResult,
        tree: Any,
        entries: list[manifest.TensorEntry],
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
        self._commit(result, tree, entries, file_bytes)

    def _write_piece(self, fd: int, piece: layout.Piece) -> None:
        """One piece, paced when its target carries a write-bandwidth cap."""
        bucket = self._buckets[piece.target]
        if bucket is not None:
            bucket.take(piece.length)
        layout.write_piece(fd, piece, self.o_direct)

    def _commit(
        self,
        result: SaveResult,
        tree: Any,
        entries: list[manifest.TensorEntry],
        file_bytes: dict[int, int],
    ) -> None:
        """Make the new files durable, switch the manifest to them, then drop the old generation."""
        name, save_id = result.name, result.save_id
        for t in self.targets:
            manifest.fsync_dir(manifest.checkpoint_dir(t, name))
            manifest.fsync_dir(t)
        m = manifest.Manifest(
            name=name,
            engine=self.name,
            targets=self.targets,
            files={
                t: {"file": manifest.data_file_name(t, save_id), "bytes": n}
                for t, n in file_bytes.items()
            },
            tensors=entries,
            tree=tree,
            checksums=self.options.checksums,
            payload_bytes=result.bytes,
            save_id=save_id,
            extra={"chunk_bytes": self.options.chunk_bytes, "o_direct": self.o_direct},
        )
        previous = manifest.committed(self.targets, name)
        damaged = previous is None and os.path.exists(manifest.manifest_path(self.targets, name))
        manifest.commit(self.targets, m)
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


class SnapshotEngine(StripedEngine):
    """cpu-double and cpu-single: snapshot into staging (the stall), persist in the background."""

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

    def warm(self, state: Any) -> None:
        _, tensors = flatten(state)
        entries = [manifest.tensor_entry(p, t) for p, t in tensors]
        self.wait_idle()
        self.staging.ensure(self._staging_need(layout.pack_offsets(entries)[1]))

    def _save(self, pending: PendingSave, tree: Any, tensors: list, entries: list) -> None:
        if self.options.staging_chunks:
            self._save_ring(pending, tree, tensors, entries)
            return
        if self.overlap:
            self._save_overlapped(pending, tree, tensors, entries)
            return
        result = pending.result
        offsets, used = layout.pack_offsets(entries)
        result.staging_grew = self.staging.ensure(used)
        staging, arr = self.staging.tensor, self.staging.array
        host = []
        for (_, t), e, off in zip(tensors, entries, offsets, strict=True):
            if not e.nbytes:
                continue
            if t.device.type == "cpu" and t.is_contiguous():
                host.append((arr[off : off + e.nbytes], _host_bytes(t)))
            else:
                dst = staging[off : off + e.nbytes].view(t.dtype).view(t.shape)
                dst.copy_(t, non_blocking=True)
        # Host tensors: plain memcpys (np.copyto releases the GIL) in pieces that the copy threads
        # take from one queue. Not torch's copy_: its parallel copy ends every tensor with a
        # thread barrier, which stretched the stall badly when another process held a core
        # (64 x 4 MiB: 155 ms instead of 33 ms on a busy 2-core host); a queue of pieces loses at
        # most one piece's time to a descheduled thread (bench/PERF.md).
        tasks = copy_tasks(host, COPY_PIECE)
        if self._copy_pool is not None and len(tasks) > 1:
            list(self._copy_pool.map(run_copies, tasks))
        else:
            for task in tasks:
                run_copies(task)
        self.device.synchronize()
        result.pinned_bytes = self.staging.pinned_bytes
        result.stall_s = (_now() - pending.t0_ns) / 1e9
        result.extra = {
            "overlap": False,
            **(self.staging.describe() if self.device.is_cuda else {}),
        }
        arr = self.staging.array
        pieces, file_bytes = layout.packed(
            arr, used, entries, offsets, len(self.targets), self.options.chunk_bytes
        )
        views = [arr[off : off + e.nbytes] for e, off in zip(entries, offsets, strict=True)]
        name = result.name
        self._in_background(
            pending, lambda: self._persist(result, name, tree, entries, pieces, file_bytes, views)
        )

    def _chunk_spans(self, entries: list, offsets: list[int], used: int) -> list[list[tuple]]:
        """For every chunk of the packed staging buffer, the tensor spans in it:
        (tensor index, start, end) in staging offsets."""
        chunk = self.options.chunk_bytes
        spans: list[list[tuple]] = [[] for _ in range(-(-used // chunk))]
        for i, (e, off) in enumerate(zip(entries, offsets, strict=True)):
            pos, end = off, off + e.nbytes
            while pos < end:
                j = pos // chunk
                stop = min(end, (j + 1) * chunk)
                spans[j].append((i, pos, stop))
                pos = stop
        return spans

    def _save_overlapped(
        self, pending: PendingSave, tree: Any, tensors: list, entries: list
    ) -> None:
        """The whole state into staging chunk by chunk, each chunk written as soon as it is in
        staging: persisting starts with the first chunk instead of after the last, so the time
        to durability approaches max(copy, write) rather than their sum, while the stall still
        ends when the last byte is in staging. Host chunks are copied by the copy threads, each
        submitting its chunk's write when done; device chunks are copied on a side CUDA stream
        with an event per chunk, and each write waits for its chunk's event (the copy of chunk
        k+1 overlaps the write of chunk k)."""
        result = pending.result
        n = len(self.targets)
        offsets, used = layout.pack_offsets(entries)
        result.staging_grew = self.staging.ensure(used)
        staging, arr = self.staging.tensor, self.staging.array
        pieces, file_bytes = layout.packed(arr, used, entries, offsets, n, self.options.chunk_bytes)
        # Contiguous tensors are copied chunk by chunk; a strided one goes whole into its
        # staging region up front, by a strided copy (no extra contiguous copy).
        srcs: list[Any] = []
        strided: list[tuple[torch.Tensor, int]] = []
        for (_, t), e, off in zip(tensors, entries, offsets, strict=True):
            src = t.detach()
            if not e.nbytes or not src.is_contiguous():
                srcs.append(None)
                if e.nbytes:
                    strided.append((src, off))
                continue
            flat = src.reshape(-1).view(torch.uint8)
            srcs.append(flat.numpy() if flat.device.type == "cpu" else flat)
        spans = self._chunk_spans(entries, offsets, used)
        fds_f = self._pool.submit(self._open, result, file_bytes)
        writes: list[Future | None] = [None] * len(pieces)
        stream = None
        if any(t.device.type != "cpu" for _, t in tensors):
            stream = torch.cuda.Stream(device=self.device.torch_device)
            stream.wait_stream(torch.cuda.current_stream(self.device.torch_device))
        # `last`: the newest event on the copy stream. Its copies run in order, so a chunk waits
        # for the newest event recorded when it is handed on: the strided copies' event, for a
        # chunk that holds only bytes of a strided device tensor.
        last = None
        for src, off in strided:
            dst = staging[off : off + src.numel() * src.element_size()]
            dst = dst.view(src.dtype).view(src.shape)
            if src.device.type == "cpu":
                dst.copy_(src)
            else:
                with torch.cuda.stream(stream):
                    dst.copy_(src, non_blocking=True)
                    last = torch.cuda.Event()
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
            for i, a, b in spans[j]:
                src = srcs[i]
                if isinstance(src, np.ndarray):  # host; strided ones are in staging already
                    np.copyto(arr[a:b], src[a - offsets[i] : b - offsets[i]])
            writes[j] = self._pool.submit(write, j, event)

        copies: list[Future] = []
        try:
            for j in range(len(pieces)):
                event = last
                device_spans = [
                    (i, a, b)
                    for i, a, b in spans[j]
                    if srcs[i] is not None and not isinstance(srcs[i], np.ndarray)
                ]
                if device_spans:
                    with torch.cuda.stream(stream):
                        for i, a, b in device_spans:
                            staging[a:b].copy_(
                                srcs[i][a - offsets[i] : b - offsets[i]], non_blocking=True
                            )
                        event = last = torch.cuda.Event()
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
        result.stall_s = (_now() - pending.t0_ns) / 1e9
        copying.clear()
        result.extra = {"overlap": True, **(self.staging.describe() if self.device.is_cuda else {})}
        views = [arr[off : off + e.nbytes] for e, off in zip(entries, offsets, strict=True)]

        futures = [f for f in writes if f is not None]
        self._in_background(
            pending,
            lambda: self._hash_and_drain(
                result, tree, entries, fds_f.result(), futures, file_bytes, views
            ),
        )

    def _save_ring(self, pending: PendingSave, tree: Any, tensors: list, entries: list) -> None:
        """Bounded staging: a ring of K chunk buffers. Each chunk of the packed stream is copied
        into a free slot and written at once; save() returns when the last chunk is copied, so
        host memory is K x chunk and the stall grows toward the write time as K shrinks.
        Checksums are updated chunk by chunk in the copying thread (inside the stall)."""
        result = pending.result
        k, chunk, n = self.options.staging_chunks, self.options.chunk_bytes, len(self.targets)
        offsets, used = layout.pack_offsets(entries)
        result.staging_grew = self.staging.ensure(self._staging_need(used))
        _, file_bytes = layout.packed(self.staging.array, used, entries, offsets, n, chunk)
        srcs = []
        for _, t in tensors:
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
            for e, h in zip(entries, hashers, strict=True):
                e.xxh3 = h.hexdigest()
        result.hash_s = hash_ns / 1e9
        result.pinned_bytes = self.staging.pinned_bytes
        result.stall_s = (_now() - pending.t0_ns) / 1e9
        if self.device.is_cuda:
            result.extra = self.staging.describe()
        futures = [f for f in slots if f is not None]
        self._in_background(
            pending, lambda: self._drain(result, tree, entries, fds, futures, file_bytes)
        )
