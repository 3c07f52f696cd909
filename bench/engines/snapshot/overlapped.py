"""The overlapped snapshot: each chunk of the packed stream written as soon as it is in staging."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from functools import partial
from typing import Any, ClassVar

import numpy as np
import torch

from bench.engines.snapshot.strategy import (
    Batch,
    Packing,
    Staged,
    Tools,
    hash_and_drain,
    now,
    sort_copies,
)
from bench.engines.striped import batch_copy
from bench.engines.stripes import Job
from bench.storage.plan import SavePlan

# (tensor, start, end): the bytes of a pieced tensor inside one chunk, in staging offsets
Span = tuple[int, int, int]


class Overlapped:
    """Copy the state into staging chunk by chunk and write each chunk as soon as it is there:
    persisting starts with the first chunk instead of after the last, so the time to
    durability approaches max(copy, write) rather than their sum, while the stall still ends
    when the last byte is in staging. Host chunks are copied by the copy threads, each
    submitting its chunk's write when done; device chunks are copied on a side CUDA stream with
    an event per chunk, and each write waits for its chunk's event (the copy of chunk k+1
    overlaps the write of chunk k). Its packing: the plan's `Packing`, which tensors are batched
    (small ones inside one chunk) and which pieced, and, bound, per chunk its host batch, its
    device batch and the spans of pieced tensors in it."""

    overlap: ClassVar[bool | None] = True

    def __init__(self, tools: Tools) -> None:
        self.tools = tools
        self.packing: Packing | None = None
        self.batched: list[int] = []
        self.pieced: list[int] = []
        self.chunk_host: list[Batch] = []
        self.chunk_device: list[Batch] = []
        self.chunk_spans: list[list[Span]] = []

    def place(self, plan: SavePlan, tensors: list[torch.Tensor]) -> None:
        self.unbind()
        chunk = self.tools.options.chunk_bytes
        self.packing = Packing.place(plan, self.tools.targets, chunk)
        self.batched, self.pieced = sort_copies(tensors, plan, self.packing, chunk)

    def bind(self, plan: SavePlan) -> bool:
        pk, staging = self._packing(), self.tools.staging
        if pk.bound_to(staging.array):
            return False
        self.unbind()  # no view of the old buffer may keep its memory
        grew = staging.ensure(pk.used)
        pk.bind(staging, plan)
        chunk, n_chunks = self.tools.options.chunk_bytes, len(pk.pieces)
        by_chunk: list[list[int]] = [[] for _ in range(n_chunks)]
        for i in self.batched:
            by_chunk[pk.offsets[i] // chunk].append(i)
        self.chunk_host = [
            pk.batch([i for i in b if not plan.cuda[i]], staging, plan) for b in by_chunk
        ]
        self.chunk_device = [
            pk.batch([i for i in b if plan.cuda[i]], staging, plan) for b in by_chunk
        ]
        self.chunk_spans = [[] for _ in range(n_chunks)]
        for i in self.pieced:
            pos, end = pk.offsets[i], pk.offsets[i] + plan.entries[i].nbytes
            while pos < end:
                j = pos // chunk
                stop = min(end, (j + 1) * chunk)
                self.chunk_spans[j].append((i, pos, stop))
                pos = stop
        return grew

    def unbind(self) -> None:
        if self.packing is not None:
            self.packing.unbind()
        self.chunk_host, self.chunk_device, self.chunk_spans = [], [], []

    def _packing(self) -> Packing:
        assert self.packing is not None, "a plan is placed before it is bound"
        return self.packing

    def snapshot(self, job: Job) -> Staged:
        return _Snapshot(self, self._packing(), job).run()


class _Snapshot:
    """One overlapped snapshot in flight: its sources, its files (opened by a writer thread
    while the copy starts), one write per chunk, and the gate that holds the writes in flight
    to `overlap_writes` while the copy runs."""

    def __init__(self, strategy: Overlapped, pk: Packing, job: Job) -> None:
        self.strategy, self.packing, self.job = strategy, pk, job
        self.tools = strategy.tools
        self.writes: list[Future | None] = [None] * len(pk.pieces)
        # Pieced tensors: contiguous ones are copied chunk by chunk (`srcs`: host ones as numpy
        # arrays); a strided one goes whole into its staging region up front, by a strided copy
        # (no extra contiguous copy).
        self.srcs: dict[int, Any] = {}
        self.strided: list[tuple[torch.Tensor, int]] = []
        # While the snapshot runs, at most `overlap_writes` writes are in flight: enough to keep
        # the disk busy, few enough not to take the cores the copy needs (bench/PERF.md); all
        # the writer threads join once the stall is over.
        self.gate = threading.Semaphore(self.tools.options.overlap_writes or 1 << 30)
        self.copying = threading.Event()
        self.copying.set()
        self.fds: Future[dict[int, int]]  # target -> fd, opened once the copy has begun

    def run(self) -> Staged:
        tools, pk, job = self.tools, self.packing, self.job
        writer, tensors = tools.writer, job.tensors
        staging = tools.staging.tensor
        offsets = pk.offsets
        c0 = now()
        for i in self.strategy.pieced:
            src = tensors[i].detach()
            if not src.is_contiguous():
                self.strided.append((src, offsets[i]))
                continue
            flat = src.reshape(-1).view(torch.uint8)
            self.srcs[i] = flat.numpy() if flat.device.type == "cpu" else flat
        self.fds = writer.pool.submit(writer.open, job.result, pk.file_bytes)
        side = None
        if any(job.plan.cuda):
            side = torch.cuda.Stream(device=tools.device.torch_device)
            side.wait_stream(torch.cuda.current_stream(tools.device.torch_device))
        # `last`: the newest event on the copy stream. Its copies run in order, so a chunk waits
        # for the newest event recorded when it is handed on: the strided copies' event, for a
        # chunk that holds only bytes of a strided device tensor. Blocking events: a writer
        # thread waiting on one sleeps (cudaEventBlockingSync) where it would otherwise spin a
        # CPU, which the row's CPU time would count (bench.common.devices.blocking_sync).
        last = None
        for src, off in self.strided:
            dst = staging[off : off + src.numel() * src.element_size()]
            dst = dst.view(src.dtype).view(src.shape)
            if src.device.type == "cpu":
                dst.copy_(src)
            else:
                with torch.cuda.stream(side):
                    dst.copy_(src, non_blocking=True)
                    last = torch.cuda.Event(blocking=True)
                    last.record(side)
        copies: list[Future] = []
        try:
            for j in range(len(pk.pieces)):
                event = last
                dev_idx, dev_dsts = self.strategy.chunk_device[j]
                device_spans = [
                    (i, a, b)
                    for i, a, b in self.strategy.chunk_spans[j]
                    if i in self.srcs and not isinstance(self.srcs[i], np.ndarray)
                ]
                if dev_idx or device_spans:
                    with torch.cuda.stream(side):
                        if dev_idx:
                            batch_copy(dev_dsts, [tensors[i] for i in dev_idx], True)
                        for i, a, b in device_spans:
                            staging[a:b].copy_(
                                self.srcs[i][a - offsets[i] : b - offsets[i]], non_blocking=True
                            )
                        event = last = torch.cuda.Event(blocking=True)
                        event.record(side)
                if tools.copy_pool is not None:
                    copies.append(tools.copy_pool.submit(self.copy_chunk, j, event))
                else:
                    self.copy_chunk(j, event)
            for f in copies:
                f.result()
            if side is not None:
                side.synchronize()
        except BaseException:
            for f in copies:
                try:
                    f.result()
                except BaseException:
                    pass
            writer.close(self.fds.result(), [f for f in self.writes if f is not None])
            raise
        self.copying.clear()
        copy_s = (now() - c0) / 1e9
        return Staged(copy_s, partial(self.persist, [f for f in self.writes if f is not None]))

    def persist(self, writes: list[Future]) -> None:
        """The persist phase: the writes are on their way; hash, wait, fsync and commit."""
        file_bytes, views = self.packing.file_bytes, self.packing.views
        hash_and_drain(self.tools, self.job, self.fds.result(), writes, file_bytes, views)

    def copy_chunk(self, j: int, event: Any) -> None:
        """Chunk j's host bytes into staging (its device bytes are queued on the side stream,
        `event` marks them), then its write handed to the writer threads."""
        idx, dsts = self.strategy.chunk_host[j]
        if idx:
            batch_copy(dsts, [self.job.tensors[i] for i in idx], False)
        arr, offsets = self.tools.staging.array, self.packing.offsets
        for i, a, b in self.strategy.chunk_spans[j]:
            src = self.srcs.get(i)
            if isinstance(src, np.ndarray):  # host; strided ones are in staging already
                np.copyto(arr[a:b], src[a - offsets[i] : b - offsets[i]])
        self.writes[j] = self.tools.writer.pool.submit(self.write, j, event)

    def write(self, j: int, event: Any) -> None:
        """Chunk j to its file, once its device copies (`event`) have landed; through the gate
        while the copy still runs."""
        fds = self.fds.result()
        if event is not None:
            event.synchronize()
        held = self.copying.is_set() and self.gate.acquire()
        try:
            piece = self.packing.pieces[j]
            self.tools.writer.write(fds[piece.target], piece)
        finally:
            if held:
                self.gate.release()
