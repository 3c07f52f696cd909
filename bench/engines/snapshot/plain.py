"""The plain snapshot: the whole state into staging, then every chunk written from there."""

from __future__ import annotations

from functools import partial
from typing import ClassVar

import numpy as np
import torch

from bench.engines.snapshot.strategy import (
    Batch,
    Packing,
    Staged,
    Tools,
    now,
    sort_copies,
    write_all,
)
from bench.engines.striped import batch_copy
from bench.engines.stripes import Job
from bench.storage.plan import SavePlan
from bench.storage.staging import COPY_PIECE, copy_tasks, run_copies


class Plain:
    """Copy every byte into staging, then persist: small tensors by torch's batched copy (one
    batch per copy thread on the host, one queued on the current stream for the device), the
    others by 8 MiB pieces in the copy threads (host) or one asynchronous copy each (device).
    Its packing: the plan's `Packing`, which tensors are batched and which pieced, and, bound, the
    batches' destinations."""

    overlap: ClassVar[bool | None] = False

    def __init__(self, tools: Tools) -> None:
        self.tools = tools
        self.packing: Packing | None = None
        self.batched: list[int] = []
        self.pieced: list[int] = []
        self.host_batches: list[Batch] = []  # one per copy thread
        self.device_batch: Batch = ([], [])

    def place(self, plan: SavePlan, tensors: list[torch.Tensor]) -> None:
        self.unbind()
        self.packing = Packing.place(plan, self.tools.targets, self.tools.options.chunk_bytes)
        self.batched, self.pieced = sort_copies(tensors, plan, self.packing)

    def bind(self, plan: SavePlan) -> bool:
        pk, staging = self._packing(), self.tools.staging
        if pk.bound_to(staging.array):
            return False
        self.unbind()  # no view of the old buffer may keep its memory
        grew = staging.ensure(pk.used)
        pk.bind(staging, plan)
        nbytes = [e.nbytes for e in plan.entries]
        host = [i for i in self.batched if not plan.cuda[i]]
        runs = _split(host, nbytes, self.tools.copy_threads)
        self.host_batches = [pk.batch(run, staging, plan) for run in runs]
        self.device_batch = pk.batch([i for i in self.batched if plan.cuda[i]], staging, plan)
        return grew

    def unbind(self) -> None:
        if self.packing is not None:
            self.packing.unbind()
        self.host_batches, self.device_batch = [], ([], [])

    def _packing(self) -> Packing:
        assert self.packing is not None, "a plan is placed before it is bound"
        return self.packing

    def snapshot(self, job: Job) -> Staged:
        pk, tools = self._packing(), self.tools
        tensors, entries = job.tensors, job.plan.entries
        staging, arr = tools.staging.tensor, tools.staging.array
        c0 = now()
        work = [
            partial(batch_copy, dsts, [tensors[i] for i in idx], False)
            for idx, dsts in self.host_batches
        ]
        idx, dsts = self.device_batch
        if idx:  # device-to-host copies are queued from this thread, on its current stream
            batch_copy(dsts, [tensors[i] for i in idx], True)
        host = []
        for i in self.pieced:
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
        if tools.copy_pool is not None and len(work) > 1:
            list(tools.copy_pool.map(lambda f: f(), work))
        else:
            for f in work:
                f()
        tools.device.synchronize()
        copy_s = (now() - c0) / 1e9
        return Staged(copy_s, partial(write_all, tools, job, pk.pieces, pk.file_bytes, pk.views))


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
