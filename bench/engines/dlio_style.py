"""`dlio-style` baseline: a rank's checkpoint written as MLPerf Storage's reference tool (DLIO,
branch mlperf_storage_v2.0) writes it: one `torch.save` file of its model states and one of its
optimizer states (dlio_benchmark/checkpointing/base_checkpointing.py save_checkpoint, lines
385-418; pytorch_checkpointing.py save_state, lines 131-137: `open`, `torch.save`, then
`os.fsync` when asked), then fsync of each file.

save() returns once both files are written through the page cache and closed: that is the
interval DLIO v2.0 times, because its `fsync: True` never reaches save_state (its config loader
stores the key as `checkpoint_sync`, dlio_benchmark/utils/config.py line 879, while the save path
reads `checkpoint_fsync`, line 110, default False). The fsyncs and the atomic commit (see
bench.engines.baseline) run after, in the persist phase, so that the row's stall_s is the time
DLIO reports and total_s the durable one, both read by the harness's clock.

A state whose top-level values are all mappings (the MLPerf workload's `model` and `optim`)
is one file per key, `KEY_states.pt`; any other state is one file, `states.pt`.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from bench.common.traits import Traits
from bench.engines.base import MemoryPlan, PendingSave, SaveResult, StateSize
from bench.engines.baseline import BaselineEngine, load_into
from bench.storage import manifest
from bench.storage.tree import flatten

SUFFIX = "_states.pt"
KEYS = "keys"  # the files' stems in the state's key order, one a line


def _parts(state: Any) -> list[tuple[str, Any]]:
    """(file stem, the part it holds) for each file of a state."""
    if isinstance(state, dict) and state and all(isinstance(v, dict) for v in state.values()):
        return [(str(k), v) for k, v in state.items()]
    return [("", state)]


def _file(stem: str) -> str:
    return f"{stem}{SUFFIX}" if stem else SUFFIX.lstrip("_")


class DlioStyle(BaselineEngine):
    name = "dlio-style"
    traits = Traits(
        stall="snapshot",
        from_device=False,
        o_direct=False,
        page_cache=True,
        stripes=False,
        host_copies=1,
        baseline=True,
        serializes=True,
        single_writer=True,
        summary="torch.save of model and optimizer states per rank (DLIO), then fsync",
    )

    def save(self, state: Any, name: str) -> PendingSave:
        _, tensors = flatten(state)
        result = SaveResult(
            name=name,
            bytes=sum(t.numel() * t.element_size() for _, t in tensors),
            targets_used=1,
        )
        result.save_id = manifest.new_save_id()
        gen = self._begin(name, result.save_id)
        paths = []
        try:
            for stem, part in _parts(state):
                path = os.path.join(gen, _file(stem))
                with open(path, "wb") as f:
                    torch.save(part, f)
                paths.append(path)
            keys = os.path.join(gen, KEYS)
            with open(keys, "w") as k:
                k.write("".join(f"{stem}\n" for stem, _ in _parts(state)))
            paths.append(keys)
        except BaseException:
            self._abort(name, result.save_id)
            raise

        def persist() -> None:
            try:
                for p in paths:
                    fd = os.open(p, os.O_RDONLY)
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                self._commit(name, result.save_id)
            except BaseException:
                self._abort(name, result.save_id)
                raise

        pending = PendingSave(result)
        pending.run_in_background(persist)
        return pending

    @classmethod
    def memory_plan(cls, size: StateSize, options: Any) -> MemoryPlan:
        """As torch-save: written from the tensors' memory through the page cache, read back
        into new memory; in place, each file mapped and copied into the state's tensors."""
        base = super().memory_plan(size, options)
        return MemoryPlan(
            save=base.save,
            page_cache=base.page_cache,
            restore_host=base.restore_host,
            restore_device=base.restore_device,
            in_place_host=size.largest if size.cuda else 0,
        )

    def load(self, name: str, device: str = "cpu", checksums: bool = True, into: Any = None) -> Any:
        """torch.load of each file (weights_only=True), as DLIO's load_state reads them; in
        place, each file mapped and its tensors copied into the state's."""
        gen = self.current_dir(name)
        with open(os.path.join(gen, KEYS)) as f:
            stems = f.read().splitlines()

        def read(stem: str, where: str, mmap: bool = False) -> Any:
            path = os.path.join(gen, _file(stem))
            return torch.load(path, map_location=where, weights_only=True, mmap=mmap)

        if into is not None:
            loaded = {s: read(s, "cpu", mmap=True) for s in stems}
            tree = loaded[""] if stems == [""] else loaded
            tensors = [t for _, t in flatten(tree)[1]]
            return load_into(into, tensors, len(tensors))
        if stems == [""]:
            return read("", device)
        return {s: read(s, device) for s in stems}
