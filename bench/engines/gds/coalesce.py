"""How gds coalesces small tensors: where each goes in the coalescing buffer's windows (`place`),
the buffer's views (`Coalescing.bind`), its checksums, and what one save writes. Functions
taking `self` are methods of the engine (bench.engines.gds.engine.Gds), kept here by their job."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from bench.engines.stripes import Job
from bench.measure.detail import GdsDetail
from bench.storage import checksums, layout
from bench.storage.plan import SavePlan


def coalesce_window(options: Any) -> int:
    """One half of the coalescing buffer: `coalesce_bytes` / 2 in whole chunks, at least one."""
    chunk = options.chunk_bytes
    return max(chunk, options.coalesce_bytes // 2 // chunk * chunk)


@dataclass
class Round:
    """One window of the coalesced stream: the tensors copied into the buffer for it, where,
    and the chunks then written from the buffer."""

    tensors: list[int]  # the plan's tensor indices
    starts: list[int]  # their offsets in the buffer
    pieces: list[tuple[int, int, int, int]]  # (target, file offset, buffer offset, length)
    # bound: (tensor indices, typed views of the buffer), one batch of device tensors and one
    # of host tensors (a batched copy takes its tensors from one device)
    batches: list[tuple[list[int], list[torch.Tensor]]] = field(default_factory=list)


class Coalescing:
    """Where gds puts one plan's tensors (`Gds._place`): the small ones in windows of the
    coalescing buffer (`rounds`), the others written from their own memory (`direct`), and the
    files' lengths of the coalesced part. Bound to a buffer (`bind`), once for the layout: the
    copies' destinations, the pieces and the host views hashed."""

    def __init__(
        self,
        rounds: list[Round],
        direct: list[int],
        file_bytes: dict[int, int],
        nbytes: int,
        size: int,
    ) -> None:
        self.rounds = rounds
        self.direct = direct
        self.file_bytes = file_bytes
        self.nbytes = nbytes  # tensor bytes coalesced
        self.size = size  # bytes of buffer it needs (one window, or less)
        self.buffer: torch.Tensor | None = None
        self._pieces: list[list[layout.Piece]] = []
        self._views: list[list[np.ndarray]] = []  # host buffer: each tensor's bytes, by round

    def bind(self, buffer: torch.Tensor, plan: SavePlan, device: bool, as_numpy: bool) -> None:
        """`device`: the buffer is device memory (hashed there); `as_numpy`: its pieces are
        written from a numpy view (the emulation's O_DIRECT writes take the buffer protocol)."""
        entries = plan.entries
        host = None if device else buffer.numpy()
        mem: Any = host if as_numpy and host is not None else buffer
        self._pieces, self._views = [], []
        for r in self.rounds:
            at = dict(zip(r.tensors, r.starts, strict=True))

            def batch(idx: list[int], at: dict[int, int] = at) -> tuple[list[int], list[Any]]:
                return idx, [
                    buffer[at[i] : at[i] + entries[i].nbytes]
                    .view(plan.dtypes[i])
                    .view(plan.shapes[i])
                    for i in idx
                ]

            r.batches = [
                batch(idx)
                for idx in (
                    [i for i in r.tensors if plan.cuda[i]],
                    [i for i in r.tensors if not plan.cuda[i]],
                )
                if idx
            ]
            self._pieces.append([layout.Piece(t, f, mem, at, n) for t, f, at, n in r.pieces])
            if host is not None:
                self._views.append(
                    [
                        host[s : s + entries[i].nbytes]
                        for i, s in zip(r.tensors, r.starts, strict=True)
                    ]
                )
        self.buffer = buffer

    def unbind(self) -> None:
        for r in self.rounds:
            r.batches = []
        self._pieces, self._views, self.buffer = [], [], None

    def pieces_of(self, k: int) -> list[layout.Piece]:
        return self._pieces[k]

    def hash_round(self, k: int, job: Job) -> None:
        """The checksums of window k's tensors, from the buffer: xxh3 on the host, wsum64 of
        all of them at once on the device (`checksums.segment_sums`)."""
        r = self.rounds[k]
        if self._views:
            for i, v in zip(r.tensors, self._views[k], strict=True):
                job.xxh3[i] = checksums.checksum(v)
            return
        assert self.buffer is not None
        entries = job.plan.entries
        sizes = [entries[i].nbytes for i in r.tensors]
        sums = checksums.segment_sums(self.buffer, r.starts, sizes).tolist()
        for i, (s1, s2), n in zip(r.tensors, sums, sizes, strict=True):
            job.wsum64[i] = checksums.wsum64_digest(s1, s2, n)

    def describe(self, detail: GdsDetail) -> None:
        """Into the save's detail (the row's io_detail): what was coalesced."""
        detail.coalesced_tensors = sum(len(r.tensors) for r in self.rounds)
        detail.coalesced_bytes = self.nbytes
        detail.coalesce_rounds = len(self.rounds)


@dataclass
class Writes:
    """What one gds save writes: its coalesced tensors, the pieces of the others (from their own
    memory, `mems`, by tensor index), each file's length, and which tensors are on the device."""

    co: Coalescing
    pieces: list[layout.Piece]
    file_bytes: dict[int, int]
    mems: dict[int, torch.Tensor]
    dev: list[bool]


class _Placing(Protocol):
    """What `place` uses of the engine."""

    options: Any  # bench.engines.options.GdsOptions
    targets: list[str]
    _coalesce: Coalescing | None


def place(self: _Placing, plan: SavePlan, tensors: list[torch.Tensor]) -> None:
    """Coalesce the small tensors, as a GDS user with many of them would: every tensor
    under `coalesce_below` is copied (device to device, at HBM speed on a GPU) into one
    buffer of `coalesce_bytes` and written from there in chunks, where thousands of small
    writes would each pay a cuFile call and a file system round trip (on the emulation, an
    O_DIRECT write each: 170 us a 4 KiB tensor here). They are packed as the snapshot
    engines pack staging (64-byte aligned, chunks dealt round-robin), in windows of the
    buffer's halves that no tensor straddles: one half is filled while the other is
    written. The file of each target holds its coalesced chunks first, then the other
    tensors, written from their own memory (`layout.direct`, placed at every save: their
    addresses decide it)."""
    entries, chunk, n = plan.entries, self.options.chunk_bytes, len(self.targets)
    below = self.options.coalesce_below
    window = coalesce_window(self.options)
    # (a tensor larger than a half of the buffer is written from its own memory)
    small = [i for i, e in enumerate(entries) if 0 < e.nbytes < below and e.nbytes <= window]
    offsets, pos = [], 0
    for i in small:
        nb = entries[i].nbytes
        pos = -(-pos // layout.TENSOR_ALIGN) * layout.TENSOR_ALIGN
        if pos // window != (pos + nb - 1) // window:
            pos = (pos // window + 1) * window  # start the next window: none straddles
        offsets.append(pos)
        pos += nb
    pieces, file_bytes = layout.packed(
        np.empty(0, dtype=np.uint8), pos, [entries[i] for i in small], offsets, n, chunk
    )
    rounds = [Round([], [], []) for _ in range(-(-pos // window))]
    for i, off in zip(small, offsets, strict=True):
        k = off // window
        rounds[k].tensors.append(i)
        rounds[k].starts.append(off - k * window + (k % 2) * window)
    for p in pieces:
        k = p.start // window
        rounds[k].pieces.append(
            (p.target, p.file_offset, p.start - k * window + (k % 2) * window, p.length)
        )
    chosen = set(small)
    direct = [i for i in range(len(entries)) if i not in chosen]
    if self._coalesce is not None:
        self._coalesce.unbind()
    size = pos if len(rounds) < 2 else 2 * window
    self._coalesce = Coalescing(
        rounds, direct, file_bytes, sum(entries[i].nbytes for i in small), size
    )
