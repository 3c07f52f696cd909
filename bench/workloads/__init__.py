"""States to checkpoint: synthetic tensors of a given size, and model-shaped presets.

Both are built directly on the target device, filled with random bits (never zeros: storage
that compresses or skips zero pages must not flatter an engine).
"""

from __future__ import annotations

from bench.workloads.models import PRESETS, model_state
from bench.workloads.synthetic import fill_random, synthetic_state

__all__ = ["PRESETS", "fill_random", "model_state", "synthetic_state"]
