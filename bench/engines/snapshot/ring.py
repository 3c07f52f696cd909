"""The bounded snapshot: the packed stream through a ring of `staging_chunks` chunk buffers."""

from __future__ import annotations

from concurrent.futures import Future
from functools import partial
from typing import ClassVar

import numpy as np
import torch
import xxhash

from bench.engines.snapshot.strategy import Packing, Staged, Tools, now
from bench.engines.stripes import Job
from bench.storage import layout
from bench.storage.plan import SavePlan


class Ring:
    """Bounded staging: a ring of K chunk buffers. Each chunk of the packed stream is copied
    into a free slot and written at once; the snapshot ends when the last chunk is copied, so
    host memory is K x chunk and the stall grows toward the write time as K shrinks. Checksums
    are updated chunk by chunk in the copying thread (inside the stall). Made for states larger
    than host memory can stage, of large tensors: it copies tensor by tensor, a few
    microseconds each. Its packing is the plan's `Packing` alone: its pieces are made chunk by
    chunk, in the slot each chunk takes, so nothing is bound to the buffer between saves."""

    overlap: ClassVar[bool | None] = None

    def __init__(self, tools: Tools) -> None:
        self.tools = tools
        self.packing: Packing | None = None

    def place(self, plan: SavePlan, tensors: list[torch.Tensor]) -> None:
        self.packing = Packing.place(plan, self.tools.targets, self.tools.options.chunk_bytes)

    def bind(self, plan: SavePlan) -> bool:
        o = self.tools.options
        return self.tools.staging.ensure(
            min(self._packing().used, o.staging_chunks * o.chunk_bytes)
        )

    def unbind(self) -> None:
        """Nothing to drop: no view of the ring outlives a save."""

    def _packing(self) -> Packing:
        assert self.packing is not None, "a plan is placed before it is bound"
        return self.packing

    def snapshot(self, job: Job) -> Staged:
        tools, pk, writer = self.tools, self._packing(), self.tools.writer
        result, tensors, entries = job.result, job.tensors, job.plan.entries
        k, chunk, n = tools.options.staging_chunks, tools.options.chunk_bytes, tools.targets
        offsets, used, file_bytes = pk.offsets, pk.used, pk.file_bytes
        srcs: list[torch.Tensor | None] = []
        for t in tensors:
            src = t.detach()
            if not src.is_contiguous():
                src = src.contiguous()
                result.copied_tensors += 1
            srcs.append(src.reshape(-1).view(torch.uint8) if src.numel() else None)
        hashers = [xxhash.xxh3_64() for _ in entries] if tools.options.checksums else None
        ring, ring_arr = tools.staging.tensor, tools.staging.array
        slots: list[Future | None] = [None] * k
        fds = writer.open(result, file_bytes)
        hash_ns, first = 0, 0
        c0 = now()
        try:
            for j in range(-(-used // chunk)):
                lo, hi = j * chunk, min((j + 1) * chunk, used)
                base = (j % k) * chunk
                prev = slots[j % k]
                if prev is not None:
                    prev.result()  # the slot's previous chunk is on its way to disk
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
                tools.device.synchronize()
                if hashers is not None:
                    h0 = now()
                    for i, a, b in spans:
                        hashers[i].update(ring_arr[a:b].data)
                    hash_ns += now() - h0
                piece = layout.Piece(j % n, (j // n) * chunk, ring_arr, base, hi - lo)
                slots[j % k] = writer.pool.submit(writer.write, fds[piece.target], piece)
        except BaseException:
            writer.close(fds, [f for f in slots if f is not None])
            raise
        if hashers is not None:
            job.xxh3[:] = [h.hexdigest() for h in hashers]
        result.hash_s = hash_ns / 1e9
        copy_s = (now() - c0) / 1e9  # with the writes of all but the last K chunks
        futures = [f for f in slots if f is not None]
        return Staged(copy_s, partial(writer.drain, job, fds, futures, file_bytes))
