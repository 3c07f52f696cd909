"""`SnapshotEngine`: the striped engine of cpu-single and cpu-double, which holds a staging
buffer, copy threads and one snapshot strategy (see the package)."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from bench.engines.base import MemoryPlan, PendingSave, StateSize
from bench.engines.snapshot.overlapped import Overlapped
from bench.engines.snapshot.plain import Plain
from bench.engines.snapshot.ring import Ring
from bench.engines.snapshot.strategy import Strategy, Tools
from bench.engines.striped import StripedEngine
from bench.engines.stripes import Job
from bench.measure.detail import SnapshotDetail
from bench.storage import layout, manifest, odirect, readback
from bench.storage.plan import SavePlan
from bench.storage.staging import Staging


class SnapshotEngine(StripedEngine):
    """cpu-double and cpu-single: snapshot into staging (the stall), persist in the background.

    The snapshot of a state of many small tensors costs little per tensor: the plan of its
    layout (bench.storage.plan) and the strategy's packing of it are made once (in `warm()`, or
    by the first save of the layout), and each save walks the state, copies it into staging the
    strategy's way and starts its persist. The strategy is chosen once: `Ring` with
    `staging_chunks`, else `Overlapped` where `overlap` resolves true, else `Plain`."""

    def __init__(self, targets: list[str], **options: Any) -> None:
        super().__init__(targets, **options)
        self.staging = Staging(self.device)
        n_copy = self.options.copy_threads or min(os.cpu_count() or 1, 8)
        self._copy_pool = (
            ThreadPoolExecutor(max_workers=n_copy, thread_name_prefix=f"{self.name}-copy")
            if n_copy > 1
            else None
        )
        self.overlap = self._resolve_overlap(n_copy)
        tools = Tools(
            options=self.options,
            device=self.device,
            staging=self.staging,
            writer=self.writer,
            targets=len(self.targets),
            copy_threads=n_copy,
            copy_pool=self._copy_pool,
        )
        self.strategy: Strategy
        if self.options.staging_chunks:
            self.strategy = Ring(tools)
        elif self.overlap:
            self.strategy = Overlapped(tools)
        else:
            self.strategy = Plain(tools)

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

    # -- save -------------------------------------------------------------------------------

    def _place(self, plan: SavePlan, tensors: list[torch.Tensor]) -> None:
        self.strategy.place(plan, tensors)

    def _save(self, pending: PendingSave, job: Job) -> None:
        result = job.result
        result.staging_grew = self.strategy.bind(job.plan)
        staged = self.strategy.snapshot(job)
        # What every strategy's row says of its snapshot: the staging held, and how it went.
        result.pinned_bytes = self.staging.pinned_bytes
        result.detail = SnapshotDetail(
            copy_s=staged.copy_s,
            overlap=self.strategy.overlap,
            **(self.staging.describe() if self.device.is_cuda else {}),
        )
        self._in_background(pending, staged.persist)

    def _in_background(self, pending: PendingSave, persist: Callable[[], None]) -> None:
        """Run the persist phase in the background; on failure remove this save's files."""
        name, save_id = pending.result.name, pending.result.save_id

        def run() -> None:
            try:
                persist()
            except BaseException:
                self.writer.abort(name, save_id)
                raise

        pending.run_in_background(run)

    def warm(self, state: Any) -> None:
        """The state's plan and the strategy's packing of it, and staging for it: made,
        pre-faulted and bound here, outside any timed region."""
        self.wait_idle()
        plan, _, _ = self._plan_for(state)
        self.strategy.bind(plan)

    # -- restore and housekeeping -----------------------------------------------------------

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
        if need > self.staging.capacity:
            self.strategy.unbind()  # no view may keep the old buffer's memory
        self.staging.ensure(need)
        return self.staging.array[:need]

    def release(self) -> None:
        super().release()
        self.strategy.unbind()
        self.staging.release()

    def close(self) -> None:
        super().close()
        self.strategy.unbind()
        if self._copy_pool is not None:
            self._copy_pool.shutdown(wait=True)
        self.staging.release()


def ring_bytes(used: int, chunk: int, slots: int) -> int:
    """Bytes of a restore's ring of `slots` chunks for a packed stream of `used` bytes: no more
    chunks than the stream has, and one short chunk rounded up to a block."""
    chunks = -(-used // chunk)
    if chunks <= 1:
        return odirect.align_up(max(used, 1))
    return min(slots, chunks) * chunk
