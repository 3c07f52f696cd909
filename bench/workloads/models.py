"""Model-shaped states computed from architecture hyperparameters (no downloads).

Each preset gives what a training job checkpoints: `{"model": model.state_dict()-like
OrderedDict, "optim": torch.optim.AdamW.state_dict()-like dict}` with real names, shapes and
dtypes. Parameters are fp32 (or `dtype`), Adam's exp_avg and exp_avg_sq fp32, `step` a 0-dim
fp32 tensor, as torch.optim stores them.

- GPT-2 small/medium/large/xl: the Hugging Face GPT-2 layout (tied embeddings, Conv1D weights).
- llama-7b-shard: a Llama-2-7B-style model cut into `world_size` pipeline shards by layer;
  `rank` picks one (rank 0 also holds the embeddings, the last rank the norm and lm_head).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np
import torch

from bench.common.errors import UserError
from bench.workloads.presets import PRESETS, Arch
from bench.workloads.synthetic import DeviceMemory, fill_random


def _gpt2_shapes(a: Arch) -> list[tuple[str, tuple[int, ...]]]:
    d = a.d_model
    shapes = [("wte.weight", (a.vocab, d)), ("wpe.weight", (a.ctx, d))]
    for i in range(a.n_layer):
        p = f"h.{i}."
        shapes += [
            (p + "ln_1.weight", (d,)),
            (p + "ln_1.bias", (d,)),
            (p + "attn.c_attn.weight", (d, 3 * d)),
            (p + "attn.c_attn.bias", (3 * d,)),
            (p + "attn.c_proj.weight", (d, d)),
            (p + "attn.c_proj.bias", (d,)),
            (p + "ln_2.weight", (d,)),
            (p + "ln_2.bias", (d,)),
            (p + "mlp.c_fc.weight", (d, 4 * d)),
            (p + "mlp.c_fc.bias", (4 * d,)),
            (p + "mlp.c_proj.weight", (4 * d, d)),
            (p + "mlp.c_proj.bias", (d,)),
        ]
    shapes += [("ln_f.weight", (d,)), ("ln_f.bias", (d,))]
    return shapes


def _llama_shapes(a: Arch, world_size: int, rank: int) -> list[tuple[str, tuple[int, ...]]]:
    d, f = a.d_model, a.d_ff
    per = a.n_layer // world_size
    lo, hi = rank * per, (rank + 1) * per if rank < world_size - 1 else a.n_layer
    shapes: list[tuple[str, tuple[int, ...]]] = []
    if rank == 0:
        shapes.append(("model.embed_tokens.weight", (a.vocab, d)))
    for i in range(lo, hi):
        p = f"model.layers.{i}."
        shapes += [
            (p + "self_attn.q_proj.weight", (d, d)),
            (p + "self_attn.k_proj.weight", (d, d)),
            (p + "self_attn.v_proj.weight", (d, d)),
            (p + "self_attn.o_proj.weight", (d, d)),
            (p + "mlp.gate_proj.weight", (f, d)),
            (p + "mlp.up_proj.weight", (f, d)),
            (p + "mlp.down_proj.weight", (d, f)),
            (p + "input_layernorm.weight", (d,)),
            (p + "post_attention_layernorm.weight", (d,)),
        ]
    if rank == world_size - 1:
        shapes += [("model.norm.weight", (d,)), ("lm_head.weight", (a.vocab, d))]
    return shapes


def _shapes(preset: str, world_size: int, rank: int) -> list[tuple[str, tuple[int, ...]]]:
    if preset not in PRESETS:
        raise UserError(f"unknown model preset {preset!r} (known: {', '.join(PRESETS)})")
    a = PRESETS[preset]
    if a.kind == "llama":
        if not (1 <= world_size <= a.n_layer) or not (0 <= rank < world_size):
            raise UserError(
                f"{preset}: need 1 <= world_size <= {a.n_layer} and 0 <= rank < world_size, "
                f"got world_size={world_size}, rank={rank}"
            )
        return _llama_shapes(a, world_size, rank)
    return _gpt2_shapes(a)


def model_size(
    preset: str,
    dtype: torch.dtype = torch.float32,
    optimizer: bool = True,
    world_size: int = 8,
    rank: int = 0,
) -> tuple[int, int, int]:
    """(bytes, largest tensor's bytes, tensors) of `model_state`'s state, without building it."""
    item = torch.empty(0, dtype=dtype).element_size()
    sizes = [int(np.prod(shape)) * item for _, shape in _shapes(preset, world_size, rank)]
    if optimizer:  # exp_avg and exp_avg_sq in fp32, and a 4-byte step per parameter
        sizes += [int(np.prod(shape)) * 4 for _, shape in _shapes(preset, world_size, rank)] * 2
        sizes += [4] * (len(sizes) // 3)
    return sum(sizes), max(sizes), len(sizes)


def model_state(
    preset: str,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    optimizer: bool = True,
    world_size: int = 8,
    rank: int = 0,
    seed: int = 0,
) -> dict[str, Any]:
    """The checkpoint state of a preset model (and its AdamW state when `optimizer`)."""
    shapes = _shapes(preset, world_size, rank)
    rng = np.random.Generator(np.random.SFC64(seed))
    memory = DeviceMemory(device)

    def rand(shape: tuple[int, ...], dt: torch.dtype) -> torch.Tensor:
        return fill_random(memory.empty(shape, dt), rng)

    model = OrderedDict((name, rand(shape, dtype)) for name, shape in shapes)
    state: dict[str, Any] = {"model": model}
    if optimizer:
        per_param = {
            i: {
                "step": torch.tensor(1000.0),
                "exp_avg": rand(shape, torch.float32),
                "exp_avg_sq": rand(shape, torch.float32),
            }
            for i, (_, shape) in enumerate(shapes)
        }
        state["optim"] = {
            "state": per_param,
            "param_groups": [
                {
                    "lr": 3e-4,
                    "betas": (0.9, 0.95),
                    "eps": 1e-8,
                    "weight_decay": 0.1,
                    "amsgrad": False,
                    "foreach": None,
                    "maximize": False,
                    "capturable": False,
                    "differentiable": False,
                    "fused": None,
                    "params": list(range(len(shapes))),
                }
            ],
        }
    return state
