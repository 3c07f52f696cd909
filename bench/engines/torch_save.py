"""`torch-save` baseline: what most users do today.

`torch.save(state_dict)` into a temporary file in the first target, fsync, rename to
`NAME/state.pt`, fsync the directory. Synchronous: the stall is the whole durable write.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import torch

from bench import manifest
from bench.engines.base import PendingSave, SaveResult, register
from bench.engines.baseline import BaselineEngine
from bench.errors import UserError

FILE = "state.pt"


@dataclass(frozen=True, kw_only=True)
class TorchSaveOptions:
    """torch.save has no knobs that matter here."""


@register
class TorchSave(BaselineEngine):
    name = "torch-save"
    Options = TorchSaveOptions

    def save(self, state: Any, name: str) -> PendingSave:
        t0 = time.perf_counter_ns()
        d = self.ckpt_dir(name)
        os.makedirs(d, exist_ok=True)
        final = os.path.join(d, FILE)
        tmp = final + ".tmp"
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        manifest.fsync_dir(d)
        manifest.fsync_dir(self.targets[0])
        result = SaveResult(name=name, bytes=_tensor_bytes(state), targets_used=1)
        result.stall_s = (time.perf_counter_ns() - t0) / 1e9
        pending = PendingSave(result, t0)
        pending.finish_now()
        return pending

    def load(self, name: str, device: str = "cpu") -> Any:
        path = os.path.join(self.ckpt_dir(name), FILE)
        if not os.path.exists(path):
            raise UserError(f"no complete checkpoint {name!r}: {path} does not exist")
        return torch.load(path, map_location=device, weights_only=True)


def _tensor_bytes(state: Any) -> int:
    _, tensors = manifest.flatten(state)
    return sum(t.numel() * t.element_size() for _, t in tensors)
