"""`dcp` baseline: PyTorch Distributed Checkpoint's own CPU-staged asynchronous save.

`torch.distributed.checkpoint.async_save` with `FileSystemWriter(sync_files=True)` into a new
generation directory of `NAME/` in the first target (DCP writes `thread_count` data files and a
`.metadata`), committed atomically once DCP's future completes (see bench.engines.baseline). The stall
ends when async_save returns (DCP has staged the state in host memory); durable when its future
completes. Runs in a single process here: in a multi-rank run (bench.run.distributed) each rank
saves and loads its own shard alone (`no_dist`), not through DCP's collective save into one
shared directory.

DCP stores non-tensor values pickled and loads with string keys (an optimizer's integer keys come
back as strings); the benchmark compares tensors, not key types, for this baseline.
"""

from __future__ import annotations

import time
import warnings
from concurrent.futures import Future
from typing import Any

from bench.common.traits import Traits
from bench.engines.base import MemoryPlan, PendingSave, SaveResult, StateSize
from bench.engines.baseline import BaselineEngine, fsync_files
from bench.measure.detail import DcpDetail
from bench.storage import manifest
from bench.storage.tree import flatten

# Single-process use is intended here; DCP warns about it on every call, from its own threads.
warnings.filterwarnings("ignore", message="torch.distributed is (disabled|unavailable)")


class Dcp(BaselineEngine):
    name = "dcp"
    traits = Traits(
        stall="snapshot",
        from_device=False,
        o_direct=False,
        page_cache=True,
        stripes=False,
        host_copies=2,
        baseline=True,
        loose_keys=True,
        serializes=True,
        restore_in_place=True,
        summary="torch.distributed.checkpoint.async_save, FileSystemWriter(sync_files=True)",
    )

    def __init__(self, targets: list[str], **options: Any) -> None:
        super().__init__(targets, **options)
        self._pending: PendingSave | None = None
        self._stager: Any = None
        self._own_group = False
        self._staged_bytes = 0
        if self.options.checkpointer == "process":
            self._own_group = _ensure_group()
        self._stager = self._new_stager()

    def _new_stager(self) -> Any:
        """DCP's DefaultStager for cached staging (None for plain staging): it allocates its
        copy of the state on the first `stage()`."""
        if self.options.staging != "cached":
            return None
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        cuda = _cuda()
        return DefaultStager(
            StagingOptions(
                use_pinned_memory=cuda,
                use_shared_memory=self.options.checkpointer == "process",
                use_async_staging=True,
                use_non_blocking_copy=cuda,
            )
        )

    def release(self) -> None:
        """Drop the staged copy (a new stager stages the next state afresh in `warm()`)."""
        self.wait_idle()
        if self._stager is not None:
            self._stager.close()
            self._stager = self._new_stager()

    def warm(self, state: Any) -> None:
        """Fill DCP's staging cache for `state` (cached staging), outside the timed region."""
        if self._stager is None:
            return
        self.wait_idle()
        staged = self._stager.stage(state)
        if hasattr(staged, "result"):
            staged.result()
        self._stager.synchronize_staging()
        _, tensors = flatten(state)
        self._staged_bytes = sum(t.numel() * t.element_size() for _, t in tensors)

    def wait_idle(self) -> None:
        if self._pending is not None:
            self._pending.join()

    @property
    def pinned_bytes(self) -> int:
        """The host copy DCP's cached staging keeps (pinned on CUDA)."""
        return self._staged_bytes

    @classmethod
    def unavailable(cls, options: dict[str, Any] | None = None) -> str | None:
        try:
            import torch.distributed.checkpoint as dcp
        except ImportError as e:
            return f"torch.distributed.checkpoint does not import: {e}"
        if not hasattr(dcp, "async_save"):
            return "this torch has no torch.distributed.checkpoint.async_save"
        return None

    def save(self, state: Any, name: str) -> PendingSave:
        import torch.distributed.checkpoint as dcp

        t0 = time.perf_counter_ns()
        wait_prev = 0.0
        if self._pending is not None and not self._pending.done():
            self._pending.join()
            wait_prev = (time.perf_counter_ns() - t0) / 1e9
        save_id = manifest.new_save_id()
        d = self._begin(name, save_id)
        writer = dcp.FileSystemWriter(d, sync_files=True, thread_count=self.options.thread_count)
        kw: dict[str, Any] = {}
        if self._stager is not None:
            kw["async_stager"] = self._stager
        if self.options.checkpointer == "process":
            from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

            kw["async_checkpointer_type"] = AsyncCheckpointerType.PROCESS
        try:
            response = dcp.async_save(state, storage_writer=writer, **kw, **_no_dist())
            # Training may change the tensors once DCP has staged them.
            if isinstance(response, Future):
                future = response
            else:  # AsyncSaveResponse: staging and upload as two futures
                response.staging_completion.result()
                future = response.upload_completion
        except BaseException:
            self._abort(name, save_id)
            raise
        _, tensors = flatten(state)
        result = SaveResult(
            name=name,
            bytes=sum(t.numel() * t.element_size() for _, t in tensors),
            wait_prev_s=wait_prev,
            targets_used=1,
            save_id=save_id,
            detail=DcpDetail(staging=self.options.staging, checkpointer=self.options.checkpointer),
        )
        result.pinned_bytes = self._staged_bytes
        pending = PendingSave(result)

        def persist() -> None:
            try:
                future.result()
                # DCP's FileSystemWriter(sync_files=True) fsyncs each file before its
                # buffered writer is flushed (torch 2.13: pickle.dump of `.metadata`, then
                # os.fsync, then close): what was still in the buffer is not durable, and a
                # power cut after the commit left an empty `.metadata` (tests/test_powercut.py).
                # The files are fsync'd again once closed; durable only then.
                fsync_files(d)
                self._commit(name, save_id)
            except BaseException:
                self._abort(name, save_id)
                raise

        pending.run_in_background(persist)
        self._pending = pending
        return pending

    @classmethod
    def memory_plan(cls, size: StateSize, options: Any) -> MemoryPlan:
        """Cached staging keeps a host copy of the state (pinned on CUDA); plain staging makes
        one inside every save. A restore builds the state anew; in place, DCP reads each item
        into the state's own tensor (dcp.load), one item's bytes at a time."""
        base = super().memory_plan(size, options)
        cached = options.staging == "cached"
        return MemoryPlan(
            staging=size.nbytes if cached else 0,
            pinned=cached and size.cuda,
            save=0 if cached else size.nbytes,
            page_cache=base.page_cache,
            restore_host=base.restore_host,
            restore_device=base.restore_device,
            in_place_host=size.largest,
        )

    def load(self, name: str, device: str = "cpu", checksums: bool = True, into: Any = None) -> Any:
        """DCP's own load: fresh, into tensors it allocates from the checkpoint's metadata (as
        fast as dcp.load into a state of those shapes made beforehand: scripts/peer_loaders.py),
        then to the device; in place, dcp.load into the state's own tensors."""
        from torch.distributed.checkpoint.state_dict_loader import (
            _load_state_dict_from_keys,
        )

        d = self.current_dir(name)
        if into is not None:
            import torch.distributed.checkpoint as dcp

            # this engine saves its own state alone (no_dist), and loads it so
            dcp.load(into, storage_reader=dcp.FileSystemReader(d), no_dist=True)
            return into
        if _no_dist():
            state = _load_alone(d)
        else:
            state = _load_state_dict_from_keys(checkpoint_id=d)
        if device != "cpu":
            state = _to(state, device)
        return state

    def close(self) -> None:
        self.wait_idle()
        if self._stager is not None:
            self._stager.close()
            self._stager = None
        if self._own_group:
            import torch.distributed as dist

            dist.destroy_process_group()
            self._own_group = False


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _ensure_group() -> bool:
    """A process group of this one process (DCP's process checkpointer needs one); True if made
    here."""
    import socket

    import torch.distributed as dist

    if dist.is_initialized():
        return False
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    return True


def _to(obj: Any, device: str) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: _to(v, device) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_to(v, device) for v in obj)
    return obj


def _no_dist() -> dict[str, Any]:
    """`{"no_dist": True}` when a process group is up (a multi-rank run), else `{}`: DCP would
    otherwise plan the save across every rank of the group, and every rank would have to call it
    together."""
    import torch.distributed as dist

    return {"no_dist": True} if dist.is_available() and dist.is_initialized() else {}


def _load_alone(d: str) -> dict[str, Any]:
    """Load a whole DCP checkpoint into this process without the process group's collectives."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import (
        _EmptyStateDictLoadPlanner,
    )
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    sd: dict[str, Any] = {}
    _load_state_dict(
        sd,
        storage_reader=dcp.FileSystemReader(d),
        no_dist=True,
        planner=_EmptyStateDictLoadPlanner(),
    )
    return sd
