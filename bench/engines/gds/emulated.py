"""gds's emulation (`io: emulated`): O_DIRECT from the tensors' own memory and from the coalescing
buffer, as the kvikio path writes; on CUDA, device pieces through a pinned bounce buffer per
writer thread, as kvikio's POSIX path does. `gds_mode=emulated`: never GDS numbers. Functions
taking `self` are methods of the engine (bench.engines.gds.engine.Gds), kept here by their job, typed by what they use of it
(bench.engines.gds.parts)."""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any

import torch

from bench.engines.gds import coalesce
from bench.engines.gds.parts import GdsEngine
from bench.engines.stripes import Job
from bench.storage import layout, odirect
from bench.storage.staging import PinnedBuffer


def write(self: GdsEngine, job: Job, w: coalesce.Writes) -> None:
    """O_DIRECT from the tensors' own memory and from the coalescing buffer, as the kvikio
    path writes (the emulation of gds: never GDS numbers)."""
    co, pieces, file_bytes, mems, dev = w.co, w.pieces, w.file_bytes, w.mems, w.dev
    fds = self.writer.open(job.result, file_bytes)
    futures: list[Future] = []

    def write_round(round_pieces: list[layout.Piece]) -> Any:
        fs = self.writer.submit(fds, round_pieces, self._write_piece)
        futures.extend(fs)
        return lambda: [f.result() for f in fs]

    try:
        futures += self.writer.submit(fds, pieces, self._write_piece)
        self._coalesced_rounds(job, co, write_round)
        if self.options.checksums:
            h0 = time.perf_counter_ns()
            for i in co.direct:
                self._hash_one(job, i, mems[i] if dev[i] else mems[i].numpy())
            job.result.hash_s += (time.perf_counter_ns() - h0) / 1e9
        self.writer.prepare_manifest(job, file_bytes)  # while the last writes run
    except BaseException:
        self.writer.close(fds, futures)
        raise
    self.writer.drain(job, fds, futures, file_bytes)


def write_piece(self: GdsEngine, fd: int, piece: layout.Piece) -> None:
    if not isinstance(piece.mem, torch.Tensor):
        self.writer.write(fd, piece)
        return
    # Device memory (io=emulated on CUDA): copy the piece into this thread's pinned bounce
    # buffer at the file offset's misalignment and write whole blocks (the layout gives
    # every piece blocks of its own), as kvikio's POSIX path does.
    a = odirect.ALIGN
    mis = piece.file_offset % a
    span = odirect.align_up(mis + piece.length)
    buf = self._bounce_buffer(span)
    arr = buf.array
    arr[:mis] = 0
    arr[mis + piece.length : span] = 0
    dst = torch.from_numpy(arr[mis : mis + piece.length])
    dst.copy_(piece.mem[piece.start : piece.start + piece.length])
    self.writer.pace(piece.target, piece.length)
    odirect.pwrite_all(fd, arr[:span].data, piece.file_offset - mis)


def bounce_buffer(self: GdsEngine, span: int) -> PinnedBuffer:
    buf = getattr(self._bounce, "buf", None)
    if buf is None or buf.nbytes < span:
        buf = PinnedBuffer(max(span, self.options.chunk_bytes + 2 * odirect.ALIGN))
        with self._bounce_lock:
            self._bounces.append(buf)
        self._bounce.buf = buf
    return buf


# -- restore ----------------------------------------------------------------------------
