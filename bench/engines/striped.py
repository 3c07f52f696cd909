"""Machinery shared by the three data paths (gds, cpu-double, cpu-single).

All three stripe the checkpoint over N targets (one data file per target, fixed-size chunks dealt
round-robin, see bench.storage.layout), write with a pool of `threads_per_target x N` threads (os.pwrite
releases the GIL), fsync every file and directory, and then commit the manifest. They differ in
where the bytes come from and how they are written:
- snapshot engines (cpu-double, cpu-single, bench.engines.snapshot) copy the state into a
  reusable staging buffer; the stall ends there and a background thread persists from it;
- the direct engine (gds) writes from the tensors' own memory (its small ones through a
  coalescing buffer) and the stall lasts until durable.
Each save runs on the plan of its state's layout (bench.storage.plan), made once and kept while
the layout stays; the engine places the plan's tensors (`_place`) and keeps that placement
beside it. The stall and the time to durability are the harness's clock's
(bench.measure.clock), never the engine's.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any, ClassVar

import numpy as np
import torch

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
from bench.storage import generations, layout, manifest, odirect, readback
from bench.storage.plan import SavePlan, walk
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
            self._pending.join()  # its error, if any, is reported by its own wait()
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
            self._pending.join()

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


def batch_copy(dsts: list[torch.Tensor], srcs: list[torch.Tensor], non_blocking: bool) -> None:
    """dsts[i].copy_(srcs[i]) for every i, in one call: torch's batched copy (in torch since
    2.1; pyproject.toml asks for 2.4 or later)."""
    torch._foreach_copy_(dsts, srcs, non_blocking=non_blocking)
