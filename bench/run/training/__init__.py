"""`ckptbench train CONFIG`: stall in a real training loop (see bench.training.loop).

config (torch-free) -> model (the transformer and its optimizer) -> loop (every engine in turn on
the run core, rows into training_steps.csv and training_checkpoints.csv).
"""

from __future__ import annotations

from bench.training.config import (
    NONE,
    ModelConfig,
    TrainingConfig,
    from_dict,
    load,
    param_count,
    resolved,
    state_bytes,
)

__all__ = [
    "NONE",
    "ModelConfig",
    "TrainingConfig",
    "from_dict",
    "load",
    "param_count",
    "resolved",
    "state_bytes",
]
