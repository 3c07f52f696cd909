"""`torch-save` baseline: what most users do today.

`torch.save(state_dict)` into one file `state.pt` in the first target (in a new generation
directory that is committed atomically, see bench.engines.baseline), fsync. Synchronous: the
stall is the whole durable write.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from bench.common.traits import Traits
from bench.engines.base import MemoryPlan, PendingSave, StateSize
from bench.engines.baseline import BaselineEngine, load_into
from bench.storage.tree import flatten

FILE = "state.pt"


class TorchSave(BaselineEngine):
    name = "torch-save"
    traits = Traits(
        stall="durable",
        from_device=False,
        o_direct=False,
        page_cache=True,
        stripes=False,
        host_copies=1,
        baseline=True,
        serializes=True,
        single_writer=True,
        summary="torch.save to one file in the first target, fsync",
    )

    def save(self, state: Any, name: str) -> PendingSave:
        def write(gen: str) -> None:
            with open(os.path.join(gen, FILE), "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())

        return self._sync_save(state, name, write)

    @classmethod
    def memory_plan(cls, size: StateSize, options: Any) -> MemoryPlan:
        """torch.save writes each storage from the tensor's memory (a device one through a host
        copy); torch.load builds the whole state anew; in place, the file is mapped
        (torch.load(mmap=True): its pages are page cache, which the kernel reclaims) and each
        tensor copied into the state's."""
        base = super().memory_plan(size, options)
        return MemoryPlan(
            save=base.save,
            page_cache=base.page_cache,
            restore_host=base.restore_host,
            restore_device=base.restore_device,
            in_place_host=size.largest if size.cuda else 0,
        )

    def load(self, name: str, device: str = "cpu", checksums: bool = True, into: Any = None) -> Any:
        """torch.load(weights_only=True), every byte read before it returns. Fresh: without
        mmap (mmap would leave the reading to the tensors' first touch, after the timed restore,
        and copying the mapping out took 1.8-2.4x as long: scripts/peer_loaders.py); to a GPU
        through map_location. In place: mmap, each tensor copied from the mapping into the
        state's (1.2-3.7x faster than reading it all first)."""
        path = os.path.join(self.current_dir(name), FILE)
        if into is not None:
            loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            tensors = [t for _, t in flatten(loaded)[1]]
            return load_into(into, tensors, len(tensors))
        return torch.load(path, map_location=device, weights_only=True)


def _tensor_bytes(state: Any) -> int:
    _, tensors = flatten(state)
    return sum(t.numel() * t.element_size() for _, t in tensors)
