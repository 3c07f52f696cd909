"""States to checkpoint: synthetic tensors of a given size, and model-shaped presets.

Both are built directly on the target device, filled with random bits (never zeros: storage
that compresses or skips zero pages must not flatter an engine). `PRESETS` (names and shapes)
loads without torch; the builders import it when first used.

Imports: bench.common, bench.storage.
"""

from __future__ import annotations

from typing import Any

from bench.workloads.presets import PRESETS

__all__ = ["PRESETS", "fill_random", "model_state", "synthetic_state"]


def __getattr__(name: str) -> Any:
    if name == "model_state":
        from bench.workloads.models import model_state

        return model_state
    if name in ("fill_random", "synthetic_state"):
        from bench.workloads import synthetic

        return getattr(synthetic, name)
    raise AttributeError(f"module 'bench.workloads' has no attribute {name!r}")
