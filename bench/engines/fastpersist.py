"""`fastpersist` baseline: DeepSpeed FastPersist, the published single-copy writer closest to the
paper's idea.

`torch.save(state)` into a `deepspeed.io.FastFileWriter`: torch's zip serialisation streams into
a page-locked buffer (double-buffered) that DeepSpeed's async_io op writes with libaio and
O_DIRECT; `close()` drains it and fsyncs the file (its unaligned tail is appended through a
buffered descriptor, which that fsync covers). One file `state.pt` in the first target, in a new
generation directory committed atomically (bench.engines.baseline). Synchronous: the stall is
the whole durable write, as DeepSpeed's FastCheckpointEngine runs it.

Needs the `deepspeed` package and libaio (`apt-get install libaio-dev`); DeepSpeed builds its
async_io op the first time it is used (minutes; cached under ~/.cache/torch_extensions). On a
machine without a GPU DeepSpeed runs with DS_ACCELERATOR=cpu, whose accelerator has no build of
the small `UtilsBuilder` op FastFileWriter loads: the engine then takes DeepSpeed's own
accelerator-independent UtilsBuilder (deepspeed.ops.op_builder.utils), and every row says so in
`io_detail.workaround`.
"""

from __future__ import annotations

import os
from typing import Any

from bench.common.traits import Traits
from bench.engines.base import MemoryPlan, PendingSave, StateSize
from bench.engines.baseline import BaselineEngine, load_into
from bench.measure.detail import FastPersistDetail
from bench.storage.tree import flatten

FILE = "state.pt"
HOW_TO = (
    "pip install deepspeed (DS_BUILD_OPS=0 pip install --no-build-isolation deepspeed builds "
    "against the installed torch) and apt-get install libaio-dev; its async_io op builds on "
    "first use"
)


def _cpu() -> bool:
    import torch

    return not torch.cuda.is_available()


class FastPersist(BaselineEngine):
    name = "fastpersist"
    traits = Traits(
        stall="durable",
        from_device=False,
        o_direct=True,
        page_cache=False,
        stripes=False,
        host_copies=0,
        baseline=True,
        serializes=True,
        summary="torch.save into DeepSpeed's FastFileWriter (pinned buffer, libaio O_DIRECT), fsync",
        host_passes=1,  # torch.save's records copied into the page-locked buffer
    )

    def __init__(self, targets: list[str], **options: Any) -> None:
        super().__init__(targets, **options)
        self._handle: Any = None
        self._buffer: Any = None
        self._workaround = ""

    @classmethod
    def unavailable(cls, options: dict[str, Any] | None = None) -> str | None:
        if _cpu():
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        try:
            import deepspeed.io  # noqa: F401
            from deepspeed.ops.op_builder import AsyncIOBuilder
        except Exception as e:  # ImportError, or DeepSpeed failing to find an accelerator
            return f"DeepSpeed does not import ({type(e).__name__}: {e}); {HOW_TO}"
        if not AsyncIOBuilder().is_compatible(verbose=False):
            return f"DeepSpeed's async_io op cannot build here (libaio missing?); {HOW_TO}"
        return None

    def _setup(self) -> None:
        """DeepSpeed's aio handle and its page-locked buffer (outside the timed region)."""
        if self._handle is not None:
            return
        import deepspeed.io.fast_file_writer as ffw
        import torch
        from deepspeed.ops.op_builder import AsyncIOBuilder

        if _cpu():
            from deepspeed.ops.op_builder.utils import UtilsBuilder

            ffw.UtilsBuilder = UtilsBuilder
            self._workaround = (
                "DS_ACCELERATOR=cpu has no UtilsBuilder op: deepspeed.ops.op_builder.utils."
                "UtilsBuilder (DeepSpeed's accelerator-independent build) is used instead"
            )
        o = self.options
        self._handle = (
            AsyncIOBuilder()
            .load(verbose=False)
            .aio_handle(
                block_size=o.block_bytes,
                queue_depth=o.queue_depth,
                single_submit=False,
                overlap_events=True,
                intra_op_parallelism=o.threads,
            )
        )
        self._buffer = self._handle.new_cpu_locked_tensor(
            o.buffer_bytes, torch.empty(0, dtype=torch.uint8)
        )

    @classmethod
    def memory_plan(cls, size: StateSize, options: Any) -> MemoryPlan:
        """DeepSpeed's page-locked double buffer (`buffer_bytes`); O_DIRECT writes, no page cache;
        torch.load builds the state anew; a restart holds that whole copy (in host memory) while
        it is copied into the state's tensors."""
        base = super().memory_plan(size, options)
        return MemoryPlan(
            staging=options.buffer_bytes,
            pinned=True,
            save=base.save,
            restore_host=base.restore_host,
            restore_device=base.restore_device,
            in_place_host=size.nbytes,
        )

    def warm(self, state: Any) -> None:
        self._setup()

    @property
    def pinned_bytes(self) -> int:
        return 0 if self._buffer is None else self._buffer.numel()

    def save(self, state: Any, name: str) -> PendingSave:
        import torch
        from deepspeed.io import FastFileWriter, FastFileWriterConfig

        self._setup()  # done by warm() in a sweep

        def write(gen: str) -> None:
            cfg = FastFileWriterConfig(
                dnvme_handle=self._handle,
                pinned_tensor=self._buffer,
                double_buffer=True,
                num_parallel_writers=1,
                writer_rank=0,
                global_rank=0,
            )
            writer = FastFileWriter(os.path.join(gen, FILE), cfg)  # a fresh file: no O_TRUNC
            torch.save(state, writer)
            writer.close()  # drains the buffer and fsyncs the file

        o = self.options
        detail = FastPersistDetail(
            block_bytes=o.block_bytes,
            queue_depth=o.queue_depth,
            threads=o.threads,
            buffer_bytes=o.buffer_bytes,
            workaround=self._workaround or None,
        )
        return self._sync_save(state, name, write, detail)

    def load(self, name: str, device: str = "cpu", checksums: bool = True, into: Any = None) -> Any:
        import torch

        path = os.path.join(self.current_dir(name), FILE)
        if into is not None:  # a restart: its loader, then the copy into the state's tensors
            loaded = torch.load(path, map_location="cpu", weights_only=True)
            tensors = [t for _, t in flatten(loaded)[1]]
            return load_into(into, tensors, len(tensors))
        return torch.load(path, map_location=device, weights_only=True)

    def close(self) -> None:
        if self._buffer is not None and self._handle is not None:
            self._handle.free_cpu_locked_tensor(self._buffer)
        self._buffer = self._handle = None

    def release(self) -> None:
        """Free the page-locked buffer (`warm()` makes it again)."""
        self.close()
