"""`torch-save` baseline: what most users do today.

`torch.save(state_dict)` into one file `state.pt` in the first target (in a new generation
directory that is committed atomically, see bench.engines.baseline), fsync. Synchronous: the
stall is the whole durable write.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from bench.engines.base import PendingSave
from bench.engines.baseline import BaselineEngine
from bench.engines.traits import Traits
from bench.tree import flatten

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

    def load(self, name: str, device: str = "cpu", checksums: bool = True) -> Any:
        return torch.load(
            os.path.join(self.current_dir(name), FILE), map_location=device, weights_only=True
        )


def _tensor_bytes(state: Any) -> int:
    _, tensors = flatten(state)
    return sum(t.numel() * t.element_size() for _, t in tensors)
