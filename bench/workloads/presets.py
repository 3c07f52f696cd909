"""The model presets by name, with their architecture hyperparameters (no torch here: configs
name presets, and validating one must stay cheap). bench.workloads.models builds their states."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Arch:
    kind: str
    n_layer: int
    d_model: int
    vocab: int
    ctx: int = 1024
    d_ff: int = 0


PRESETS: dict[str, Arch] = {
    "gpt2-small": Arch("gpt2", 12, 768, 50257),
    "gpt2-medium": Arch("gpt2", 24, 1024, 50257),
    "gpt2-large": Arch("gpt2", 36, 1280, 50257),
    "gpt2-xl": Arch("gpt2", 48, 1600, 50257),
    "llama-7b-shard": Arch("llama", 32, 4096, 32000, ctx=4096, d_ff=11008),
}
