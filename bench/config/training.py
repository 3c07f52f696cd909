"""Training-loop configs (`ckptbench train CONFIG`): the model, the loop and the engines, validated
like sweep configs (bench.common.schema); nothing here imports torch."""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal

from pydantic import Field

from bench.common.errors import UserError
from bench.common.schema import Float, NonNeg, PosInt, Strict, read_yaml, validated
from bench.config.sweep import check_engines, resolved_options

NONE = "none"  # the baseline: the same loop without checkpoints


class ModelConfig(Strict):
    """A GPT-like stack of pre-norm transformer encoder layers with a causal mask."""

    d_model: PosInt = 512
    n_layers: PosInt = 4
    n_heads: PosInt = 8
    d_ff: PosInt = 2048
    vocab: PosInt = 8192
    seq_len: PosInt = 64
    batch_size: PosInt = 4


class TrainingConfig(Strict):
    """One training-loop run. `engines` may include `none` (no checkpoints: the baseline)."""

    name: str = "training"
    engines: Annotated[list[str], Field(min_length=1)] = [
        NONE,
        "gds",
        "cpu-double",
        "cpu-single",
        "torch-save",
        "dcp",
    ]
    steps: PosInt = 60
    checkpoint_every: PosInt = 10
    warmup_steps: PosInt = 3
    warmup_checkpoints: NonNeg = 1
    model: ModelConfig = ModelConfig()
    lr: Annotated[Float, Field(gt=0)] = 3e-4
    weight_decay: Annotated[Float, Field(ge=0)] = 0.01
    threads: PosInt | None = None  # torch.set_num_threads; None leaves torch's default
    device: Literal["auto", "cuda", "host-emulated"] = "auto"
    seed: int = 0
    n_targets: PosInt = 1
    targets: list[str] = []
    scratch: str = "scratch/training"
    verify: bool = True  # restore the last checkpoint and compare it with the state it saved
    # The timed restart's load (bench.run.restart): `restart` into the fresh model and
    # optimizer (built, AdamW's state made, untimed); `fresh` into new memory, then
    # load_state_dict.
    restore: Literal["restart", "fresh"] = "restart"
    keep_last: bool = False  # leave each engine's last checkpoint on the targets
    engine_options: dict[str, dict[str, Any]] = {}

    def resolved_targets(self) -> list[str]:
        """The first `n_targets` of `targets`, or `scratch/target-i`."""
        if self.targets:
            return [os.path.abspath(t) for t in self.targets[: self.n_targets]]
        return [
            os.path.abspath(os.path.join(self.scratch, f"target-{i}"))
            for i in range(self.n_targets)
        ]

    def checkpoint_steps(self) -> list[int]:
        return list(range(0, self.steps, self.checkpoint_every))


def _check(cfg: TrainingConfig) -> None:
    if not cfg.name or cfg.name in (".", "..") or "/" in cfg.name or "\0" in cfg.name:
        raise UserError(f"name: {cfg.name!r} must be a non-empty name without '/'")
    check_engines(cfg.engines, cfg.engine_options, extra=(NONE,))
    m = cfg.model
    if m.d_model % m.n_heads:
        raise UserError(f"model.n_heads: {m.n_heads} does not divide d_model {m.d_model}")
    if cfg.targets and cfg.n_targets > len(cfg.targets):
        raise UserError(
            f"n_targets: {cfg.n_targets} targets asked for, but targets lists only "
            f"{len(cfg.targets)}"
        )
    targets = cfg.resolved_targets()
    for i, t in enumerate(targets):
        if t in targets[:i]:
            raise UserError(f"targets.{i}: {t} is already listed as targets.{targets.index(t)}")


def from_dict(raw: Any, where: str = "config") -> TrainingConfig:
    """Validate a raw mapping; every error is one line naming the key path."""
    if not isinstance(raw, dict):
        raise UserError(f"{where}: expected a mapping of keys, got {type(raw).__name__}")
    return validated(TrainingConfig, raw, where, _check)


def load(path: str, overrides: list[str] | None = None) -> TrainingConfig:
    """Read, override (`--set key=value`, as for sweeps) and validate a training YAML config."""
    return from_dict(read_yaml(path, overrides), f"config {path}")


def resolved(cfg: TrainingConfig) -> dict[str, Any]:
    """The fully resolved config, as stored in env.json."""
    d = cfg.model_dump()
    d["targets"] = cfg.resolved_targets()
    d["checkpoint_steps"] = cfg.checkpoint_steps()
    d["engine_options"] = resolved_options(cfg, [e for e in cfg.engines if e != NONE])
    return d


def param_count(m: ModelConfig) -> int:
    d, f = m.d_model, m.d_ff
    per_layer = 4 * d * d + 4 * d + 2 * d * f + f + d + 4 * d  # attention, MLP, two LayerNorms
    return m.vocab * d * 2 + m.seq_len * d + m.n_layers * per_layer + 2 * d


def state_bytes(m: ModelConfig) -> int:
    """About the checkpoint's size: fp32 parameters, AdamW's exp_avg and exp_avg_sq (its 0-dim
    `step` tensors, a few hundred bytes, left out)."""
    return 3 * 4 * param_count(m)
