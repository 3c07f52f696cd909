"""What the snapshot strategies share: the engine's tools they work with (`Tools`), the packed
stream of a plan (`Packing`), what a snapshot hands back (`Staged`), the persist steps
(`write_all`, `hash_and_drain`) and the protocol each strategy implements (`Strategy`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np
import torch

from bench.common.devices import Device
from bench.engines.options import SnapshotOptions
from bench.engines.stripes import Job, StripeWriter
from bench.storage import checksums, layout
from bench.storage.plan import SavePlan
from bench.storage.staging import Staging

# Tensors of fewer elements than this are copied into staging by torch's batched copy
# (torch._foreach_copy_): one call for thousands of tensors, about 1.3 us a tensor where a Python
# loop of copies costs 3-5 us (issue 32). Below it torch copies a tensor in the calling thread
# alone (at::internal::GRAIN_SIZE), so no copy ends in a barrier of its thread pool, which a
# descheduled thread stretches (bench/PERF.md); larger tensors go by pieces.
BATCH_BELOW = 1 << 15

# Tensors copied by one batched copy, and their typed destinations in staging.
Batch = tuple[list[int], list[torch.Tensor]]


def now() -> int:
    return time.perf_counter_ns()


@dataclass(frozen=True)
class Tools:
    """What the engine lends its strategy: its options, device, staging buffer, file writer and
    copy threads (`copy_pool`, None where there is one thread: the caller's)."""

    options: SnapshotOptions
    device: Device
    staging: Staging
    writer: StripeWriter
    targets: int  # how many
    copy_threads: int
    copy_pool: ThreadPoolExecutor | None


@dataclass(frozen=True)
class Staged:
    """What a snapshot hands the engine once every byte is in staging: how long its copy took
    (the row's `copy_s`, the engine's own timer) and the persist phase to run in the
    background."""

    copy_s: float
    persist: Callable[[], None]


class Strategy(Protocol):
    """One way to copy a state into staging and persist it from there (see the package). The
    engine places each new plan (`place`), binds staging before every save (`bind`), and
    unbinds it before staging is released or grown for a restore (`unbind`)."""

    overlap: ClassVar[bool | None]  # the row's SnapshotDetail.overlap (None: the ring)

    def place(self, plan: SavePlan, tensors: list[torch.Tensor]) -> None:
        """A new plan: fill its entries' extents and make this strategy's packing of it."""
        ...

    def bind(self, plan: SavePlan) -> bool:
        """Make staging ready for a save of `plan` (the plan placed last); True if the buffer
        had to grow (be made anew)."""
        ...

    def unbind(self) -> None:
        """Drop every view of the staging buffer, so that releasing it frees its memory."""
        ...

    def snapshot(self, job: Job) -> Staged:
        """Copy the job's tensors into staging (the stall) and say what persists them."""
        ...


@dataclass
class Packing:
    """One plan's packed stream: every tensor at a 64-byte aligned offset (`offsets`), `used`
    bytes in all, cut into chunks dealt round-robin to the targets (`pieces`, into files of
    `file_bytes`). Bound to a staging buffer (`bind`), its pieces are that buffer's bytes and
    `views` holds each tensor's bytes in it (hashed on the persist path): made once for the
    layout, not at every save."""

    offsets: list[int]
    used: int
    file_bytes: dict[int, int]
    pieces: list[layout.Piece]
    array: np.ndarray | None = None  # the buffer bound, if any
    views: list[np.ndarray] = field(default_factory=list)

    @classmethod
    def place(cls, plan: SavePlan, targets: int, chunk: int) -> Packing:
        """The stream of `plan` over `targets` targets, unbound; fills the entries' extents."""
        offsets, used = layout.pack_offsets(plan.entries)
        pieces, file_bytes = layout.packed(
            np.empty(0, dtype=np.uint8), used, plan.entries, offsets, targets, chunk
        )
        return cls(offsets, used, file_bytes, pieces)

    def bound_to(self, array: np.ndarray) -> bool:
        return self.array is not None and self.array is array

    def bind(self, staging: Staging, plan: SavePlan) -> None:
        """Make the pieces and views for `staging`'s buffer."""
        arr = staging.array
        self.pieces = [
            layout.Piece(p.target, p.file_offset, arr, p.start, p.length) for p in self.pieces
        ]
        entries = plan.entries
        self.views = [arr[o : o + e.nbytes] for e, o in zip(entries, self.offsets, strict=True)]
        self.array = arr

    def unbind(self) -> None:
        """Drop every view of the staging buffer."""
        self.array = None
        self.pieces = [
            layout.Piece(p.target, p.file_offset, None, p.start, p.length) for p in self.pieces
        ]
        self.views = []

    def batch(self, idx: list[int], staging: Staging, plan: SavePlan) -> Batch:
        """Tensors `idx` with their places in staging, typed and shaped as the tensors."""
        dsts = []
        for i in idx:
            o = self.offsets[i]
            dst = staging.tensor[o : o + plan.entries[i].nbytes]
            dsts.append(dst.view(plan.dtypes[i]).view(plan.shapes[i]))
        return idx, dsts


def sort_copies(
    tensors: list[torch.Tensor], plan: SavePlan, pk: Packing, chunk: int | None = None
) -> tuple[list[int], list[int]]:
    """The tensors with bytes, as (batched, pieced): the small ones, copied by torch's batched
    copy (only those inside one chunk of `chunk` bytes, where given), and the others, copied
    by pieces."""
    batched: list[int] = []
    pieced: list[int] = []
    for i, (t, e, off) in enumerate(zip(tensors, plan.entries, pk.offsets, strict=True)):
        if not e.nbytes:
            continue
        whole = chunk is None or off // chunk == (off + e.nbytes - 1) // chunk
        (batched if t.numel() < BATCH_BELOW and whole else pieced).append(i)
    return batched, pieced


def write_all(
    tools: Tools,
    job: Job,
    pieces: list[layout.Piece],
    file_bytes: dict[int, int],
    views: list[np.ndarray],
) -> None:
    """Write every piece, hash, fsync files and directories, then commit the manifest."""
    fds = tools.writer.open(job.result, file_bytes)
    try:
        futures = tools.writer.submit(fds, pieces)
    except BaseException:
        tools.writer.close(fds, [])  # nothing was handed on, or the pool is shut: no write
        raise
    hash_and_drain(tools, job, fds, futures, file_bytes, views)


def hash_and_drain(
    tools: Tools,
    job: Job,
    fds: dict[int, int],
    futures: list[Future],
    file_bytes: dict[int, int],
    views: list[Any],
) -> None:
    """While the writes run: the checksums (`hash_s`) and the manifest's text; then wait,
    fsync and commit."""
    try:
        if tools.options.checksums:
            h0 = now()
            job.xxh3[:] = [checksums.checksum(v) for v in views]
            job.result.hash_s = (now() - h0) / 1e9
        tools.writer.prepare_manifest(job, file_bytes)
    except BaseException:
        tools.writer.close(fds, futures)
        raise
    tools.writer.drain(job, fds, futures, file_bytes)
