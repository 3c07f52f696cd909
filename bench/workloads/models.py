"""Model-shaped states computed from architecture hyperparameters (no downloads).

Each preset gives what a training job checkpoints: `{"model": model.state_dict()-like
OrderedDict, "optim": torch.optim.AdamW.state_dict()-like dict}` with real names, shapes and
dtypes. Parameters are fp32 (or `dtype`), Adam's exp_avg and exp_avg_sq fp32, `step` a 0-dim
fp32 tensor, as torch.optim stores them.

- GPT-2 small/medium/large/xl: the Hugging Face GPT-2 layout (tied embeddings, Conv1D weights).
- llama-7b-shard: a Llama-2-7B-style model cut into `world_size` pipeline shards by layer;
  `rank` picks one (rank 0 also holds the embeddings, the last rank the norm and lm_head).
- olmoe-1b-7b-shard: OLMoE-1B-7B (64 experts in each of 16 layers; figures and source in
  bench.workloads.presets) with the Hugging Face names, cut into `world_size / expert_parallel`
  pipeline stages by layer and `expert_parallel` expert ranks within a stage
  (bench.workloads.presets.cut). One expert's gate, up and down matrices are 8 MiB each in fp32,
  and AdamW keeps three tensors per parameter: a shard holds hundreds to thousands of tensors.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any

import numpy as np
import torch

from bench.common.errors import UserError
from bench.workloads.presets import PRESETS, Arch, Cut, cut, cut_error
from bench.workloads.synthetic import DeviceMemory, fill_random


def _gpt2_shapes(a: Arch) -> list[tuple[str, tuple[int, ...]]]:
    d = a.d_model
    shapes: list[tuple[str, tuple[int, ...]]] = [
        ("wte.weight", (a.vocab, d)),
        ("wpe.weight", (a.ctx, d)),
    ]
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
    c = cut(a, world_size, rank)
    shapes: list[tuple[str, tuple[int, ...]]] = []
    if c.first:
        shapes.append(("model.embed_tokens.weight", (a.vocab, d)))
    for i in range(c.lo, c.hi):
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
    if c.last:
        shapes += [("model.norm.weight", (d,)), ("lm_head.weight", (a.vocab, d))]
    return shapes


def _moe_shapes(a: Arch, c: Cut) -> list[tuple[str, tuple[int, ...]]]:
    """The Hugging Face OlmoeForCausalLM state dict (transformers 4.4x: one module per expert,
    QK-norm over the whole projection) of a cut, in its module order; experts keep their
    global index, so that names are unique across ranks."""
    d, f = a.d_model, a.d_ff
    kv = d // a.n_head * a.n_kv_head
    shapes: list[tuple[str, tuple[int, ...]]] = []
    if c.dense and c.first:
        shapes.append(("model.embed_tokens.weight", (a.vocab, d)))
    for i in range(c.lo, c.hi):
        p = f"model.layers.{i}."
        if c.dense:
            shapes += [
                (p + "self_attn.q_proj.weight", (d, d)),
                (p + "self_attn.k_proj.weight", (kv, d)),
                (p + "self_attn.v_proj.weight", (kv, d)),
                (p + "self_attn.o_proj.weight", (d, d)),
                (p + "self_attn.q_norm.weight", (d,)),
                (p + "self_attn.k_norm.weight", (kv,)),
                (p + "mlp.gate.weight", (a.n_experts, d)),
            ]
        for e in range(c.e_lo, c.e_hi):
            x = f"{p}mlp.experts.{e}."
            shapes += [
                (x + "gate_proj.weight", (f, d)),
                (x + "up_proj.weight", (f, d)),
                (x + "down_proj.weight", (d, f)),
            ]
        if c.dense:
            shapes += [
                (p + "input_layernorm.weight", (d,)),
                (p + "post_attention_layernorm.weight", (d,)),
            ]
    if c.dense and c.last:
        shapes += [("model.norm.weight", (d,)), ("lm_head.weight", (a.vocab, d))]
    return shapes


def _shapes(
    preset: str, world_size: int, rank: int, expert_parallel: int = 1
) -> list[tuple[str, tuple[int, ...]]]:
    why = cut_error(preset, world_size, rank, expert_parallel)
    if why:
        raise UserError(why)
    a = PRESETS[preset]
    if a.kind == "llama":
        return _llama_shapes(a, world_size, rank)
    if a.kind == "moe":
        return _moe_shapes(a, cut(a, world_size, rank, expert_parallel))
    return _gpt2_shapes(a)


def model_size(
    preset: str,
    dtype: torch.dtype = torch.float32,
    optimizer: bool = True,
    world_size: int = 8,
    rank: int = 0,
    expert_parallel: int = 1,
) -> tuple[int, int, int]:
    """(bytes, largest tensor's bytes, tensors) of `model_state`'s state, without building it."""
    item = torch.empty(0, dtype=dtype).element_size()
    numels = [math.prod(shape) for _, shape in _shapes(preset, world_size, rank, expert_parallel)]
    sizes = [n * item for n in numels]
    if optimizer:  # exp_avg and exp_avg_sq in fp32, and a 4-byte step per parameter
        sizes += [n * 4 for n in numels] * 2 + [4] * len(numels)
    return sum(sizes), max(sizes), len(sizes)


def model_state(
    preset: str,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    optimizer: bool = True,
    world_size: int = 8,
    rank: int = 0,
    seed: int = 0,
    expert_parallel: int = 1,
) -> dict[str, Any]:
    """The checkpoint state of a preset model (and its AdamW state when `optimizer`)."""
    shapes = _shapes(preset, world_size, rank, expert_parallel)
    return _state(shapes, device, dtype, optimizer, seed)


def _state(
    shapes: list[tuple[str, tuple[int, ...]]],
    device: torch.device | str,
    dtype: torch.dtype,
    optimizer: bool,
    seed: int,
) -> dict[str, Any]:
    """A model state dict of these shapes and, when `optimizer`, torch.optim.AdamW's state dict
    for it; one pass over the shapes, each tensor carved from the device's memory as it comes."""
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


def mlperf_state(
    preset: str, rank: int, scale: float, device: torch.device | str = "cpu", seed: int = 0
) -> dict[str, Any]:
    """Rank `rank`'s checkpoint of an MLPerf Storage preset (bench.workloads.mlperf) at `scale`,
    in DLIO's layout: `model`, its layers' fp16 tensors by layer index (absent where the rank
    holds no model states), and `optim`, its fp32 optimizer tensors; random bits, as DLIO's
    torch.rand fills them with no constant byte."""
    from bench.workloads.mlperf import shard_at

    shard = shard_at(preset, rank, scale)
    rng = np.random.Generator(np.random.SFC64(seed))
    memory = DeviceMemory(device)

    def rand(n: int, dt: torch.dtype) -> torch.Tensor:
        return fill_random(memory.empty((n,), dt), rng)

    state: dict[str, Any] = {}
    if shard.model:
        state["model"] = {
            str(i): {str(j): rand(n, torch.float16) for j, n in enumerate(layer)}
            for i, layer in enumerate(shard.model)
        }
    state["optim"] = {str(j): rand(n, torch.float32) for j, n in enumerate(shard.optim)}
    return state
