"""`dcp` baseline: PyTorch Distributed Checkpoint's own CPU-staged asynchronous save.

`torch.distributed.checkpoint.async_save` with `FileSystemWriter(sync_files=True)` into a new
generation directory of `NAME/` in the first target (DCP writes `thread_count` data files and a
`.metadata`), committed atomically once DCP's future completes (see bench.engines.baseline). The stall
ends when async_save returns (DCP has staged the state in host memory); durable when its future
completes. Runs in a single process here: in a multi-rank run (bench.distributed) each rank
saves and loads its own shard alone (`no_dist`), not through DCP's collective save into one
shared directory.

DCP stores non-tensor values pickled and loads with string keys (an optimizer's integer keys come
back as strings); the benchmark compares tensors, not key types, for this baseline.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

from bench import manifest
from bench.engines.base import PendingSave, SaveResult
from bench.engines.baseline import BaselineEngine
from bench.engines.traits import Traits
from bench.tree import flatten

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
        summary="torch.distributed.checkpoint.async_save, FileSystemWriter(sync_files=True)",
    )

    def __init__(self, targets: list[str], **options: Any) -> None:
        super().__init__(targets, **options)
        self._pending: PendingSave | None = None

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
            self._pending._done.wait()
            wait_prev = (time.perf_counter_ns() - t0) / 1e9
        save_id = manifest.new_save_id()
        d = self._begin(name, save_id)
        writer = dcp.FileSystemWriter(d, sync_files=True, thread_count=self.options.thread_count)
        try:
            future = dcp.async_save(state, storage_writer=writer, **_no_dist())
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
        )
        result.stall_s = (time.perf_counter_ns() - t0) / 1e9
        pending = PendingSave(result, t0)

        def persist() -> None:
            try:
                future.result()
                self._commit(name, save_id)
            except BaseException:
                self._abort(name, save_id)
                raise

        pending.run_in_background(persist)
        self._pending = pending
        return pending

    def load(self, name: str, device: str = "cpu") -> Any:
        from torch.distributed.checkpoint.state_dict_loader import (
            _load_state_dict_from_keys,
        )

        d = self.current_dir(name)
        if _no_dist():
            state = _load_alone(d)
        else:
            state = _load_state_dict_from_keys(checkpoint_id=d)
        if device != "cpu":
            state = _to(state, device)
        return state

    def close(self) -> None:
        if self._pending is not None:
            self._pending._done.wait()


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
