"""bench.workloads: synthetic states of exact sizes, and model-shaped presets with real shapes."""

from __future__ import annotations

import gc
import math
from collections import OrderedDict

import pytest
import torch

from bench.common.errors import UserError
from bench.workloads import PRESETS, model_state, synthetic_state
from bench.workloads.models import _gpt2_shapes, _llama_shapes, _moe_shapes, _state, model_size
from bench.workloads.presets import Arch, cut

MiB = 2**20


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _n_params(shapes: list[tuple[str, tuple[int, ...]]]) -> int:
    return sum(math.prod(s) for _, s in shapes)


def test_synthetic_sizes_last_tensor_smaller() -> None:
    state = synthetic_state(10 * MiB, 4 * MiB)
    assert list(state) == ["t00000", "t00001", "t00002"]
    assert [_nbytes(t) for t in state.values()] == [4 * MiB, 4 * MiB, 2 * MiB]
    assert sum(_nbytes(t) for t in state.values()) == 10 * MiB
    assert all(t.dim() == 1 and t.dtype == torch.float32 for t in state.values())


@pytest.mark.parametrize(
    ("total", "tensor", "dtype", "n"),
    [
        (8 * MiB, 1 * MiB, torch.float32, 8),
        (8 * MiB, 8 * MiB, torch.bfloat16, 1),
        (4 * MiB + 6, 2 * MiB, torch.float16, 3),
        (1000, 1000, torch.uint8, 1),
        (12_345, 100, torch.uint8, 124),
        (64 * MiB, 4096, torch.float64, 16384),
    ],
)
def test_synthetic_exact_bytes_and_dtype(
    total: int, tensor: int, dtype: torch.dtype, n: int
) -> None:
    state = synthetic_state(total, tensor, dtype)
    assert len(state) == n
    assert sum(_nbytes(t) for t in state.values()) == total
    assert all(t.dtype == dtype and t.device.type == "cpu" for t in state.values())
    assert all(_nbytes(t) == tensor for t in list(state.values())[:-1])
    assert 0 < _nbytes(list(state.values())[-1]) <= tensor
    # Random bits, never zeros: no tensor may be all zero bytes.
    for t in state.values():
        assert t.view(torch.uint8).any(), "a tensor is all zeros"


def test_synthetic_deterministic_for_a_seed() -> None:
    a = synthetic_state(3 * MiB + 12, MiB, seed=7)
    b = synthetic_state(3 * MiB + 12, MiB, seed=7)
    c = synthetic_state(3 * MiB + 12, MiB, seed=8)
    assert list(a) == list(b)
    assert all(torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)) for k in a)
    assert not torch.equal(a["t00000"].view(torch.uint8), c["t00000"].view(torch.uint8))
    # Tensors differ from each other too (not one block repeated).
    assert not torch.equal(a["t00000"].view(torch.uint8), a["t00001"].view(torch.uint8))


@pytest.mark.parametrize(
    ("total", "tensor", "dtype", "says"),
    [
        (MiB, 2 * MiB, torch.float32, "tensor size 2097152 is larger than the total 1048576"),
        (MiB + 2, MiB, torch.float32, "multiples of the torch.float32 element size (4 B)"),
        (MiB, 6, torch.float64, "multiples of the torch.float64 element size (8 B)"),
    ],
)
def test_synthetic_errors(total: int, tensor: int, dtype: torch.dtype, says: str) -> None:
    with pytest.raises(UserError) as e:
        synthetic_state(total, tensor, dtype)
    assert says in str(e.value)


def test_gpt2_small_parameters_and_names() -> None:
    state = model_state("gpt2-small", optimizer=False)
    assert list(state) == ["model"]
    model = state["model"]
    assert isinstance(model, OrderedDict)
    assert sum(t.numel() for t in model.values()) == 124_439_808
    assert _n_params(_gpt2_shapes(PRESETS["gpt2-small"])) == 124_439_808
    assert len(model) == 2 + 12 * 12 + 2
    assert list(model)[:3] == ["wte.weight", "wpe.weight", "h.0.ln_1.weight"]
    assert list(model)[-2:] == ["ln_f.weight", "ln_f.bias"]
    assert model["wte.weight"].shape == (50257, 768)
    assert model["wpe.weight"].shape == (1024, 768)
    assert model["h.0.attn.c_attn.weight"].shape == (768, 2304)
    assert model["h.11.mlp.c_fc.weight"].shape == (768, 3072)
    assert model["h.11.mlp.c_proj.weight"].shape == (3072, 768)
    assert all(t.dtype == torch.float32 and t.is_contiguous() for t in model.values())


@pytest.mark.parametrize(
    ("preset", "params"),
    [("gpt2-medium", 354_823_168), ("gpt2-large", 774_030_080), ("gpt2-xl", 1_557_611_200)],
)
def test_gpt2_sizes_match_hugging_face(preset: str, params: int) -> None:
    assert _n_params(_gpt2_shapes(PRESETS[preset])) == params


def test_gpt2_small_with_adamw_state() -> None:
    # bf16 parameters keep this at ~1.2 GB; AdamW's moments stay fp32 whatever the params are.
    state = model_state("gpt2-small", dtype=torch.bfloat16, optimizer=True)
    model, optim = state["model"], state["optim"]
    params = list(model.values())
    assert all(p.dtype == torch.bfloat16 for p in params)
    assert sorted(optim) == ["param_groups", "state"]
    assert list(optim["state"]) == list(range(len(params)))
    for i, p in enumerate(params):
        s = optim["state"][i]
        assert sorted(s) == ["exp_avg", "exp_avg_sq", "step"]
        assert s["step"].dim() == 0 and s["step"].dtype == torch.float32
        assert s["step"].item() == 1000.0
        for k in ("exp_avg", "exp_avg_sq"):
            assert s[k].shape == p.shape and s[k].dtype == torch.float32
    (group,) = optim["param_groups"]
    assert group["params"] == list(range(len(params)))
    assert group["betas"] == (0.9, 0.95)


def test_llama_7b_shards_add_up_to_the_full_model() -> None:
    a = PRESETS["llama-7b-shard"]
    full = 6_738_415_616  # Llama-2-7B
    assert _n_params(_llama_shapes(a, 1, 0)) == full
    for world_size in (4, 5, 32):
        shards = [_llama_shapes(a, world_size, r) for r in range(world_size)]
        assert sum(_n_params(s) for s in shards) == full
        names = [n for s in shards for n, _ in s]
        assert len(names) == len(set(names)) == 1 + 32 * 9 + 2
    first, last = _llama_shapes(a, 4, 0), _llama_shapes(a, 4, 3)
    assert first[0] == ("model.embed_tokens.weight", (32000, 4096))
    assert last[-2:] == [("model.norm.weight", (4096,)), ("lm_head.weight", (32000, 4096))]
    assert [n for n, _ in first[1:10]][0] == "model.layers.0.self_attn.q_proj.weight"
    assert [n for n, _ in last][-3] == "model.layers.31.post_attention_layernorm.weight"


def test_llama_shard_allocates_one_layer() -> None:
    state = model_state(
        "llama-7b-shard", dtype=torch.bfloat16, optimizer=False, world_size=32, rank=1
    )
    model = state["model"]
    assert list(model)[0] == "model.layers.1.self_attn.q_proj.weight"
    assert all(n.startswith("model.layers.1.") for n in model)
    assert sum(t.numel() for t in model.values()) == 202_383_360
    assert model["model.layers.1.mlp.gate_proj.weight"].shape == (11008, 4096)
    assert model["model.layers.1.mlp.down_proj.weight"].shape == (4096, 11008)
    assert all(t.dtype == torch.bfloat16 for t in model.values())


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"preset": "gpt3"}, "unknown model preset 'gpt3' (known: gpt2-small, "),
        ({"preset": "llama-7b-shard", "world_size": 4, "rank": 4}, "got world_size=4, rank=4"),
        ({"preset": "llama-7b-shard", "world_size": 4, "rank": -1}, "got world_size=4, rank=-1"),
        ({"preset": "llama-7b-shard", "world_size": 33, "rank": 0}, "world_size <= 32"),
        ({"preset": "llama-7b-shard", "world_size": 0, "rank": 0}, "got world_size=0, rank=0"),
        (
            {"preset": "llama-7b-shard", "expert_parallel": 2},
            "llama-7b-shard: expert_parallel applies to mixture-of-experts presets only, got 2",
        ),
        (
            {"preset": "olmoe-1b-7b-shard", "world_size": 8, "expert_parallel": 3},
            "expert_parallel must divide num_experts (64) and world_size (8), got 3",
        ),
        (
            {"preset": "olmoe-1b-7b-shard", "world_size": 12, "expert_parallel": 12},
            "expert_parallel must divide num_experts (64) and world_size (12), got 12",
        ),
        (
            {"preset": "olmoe-1b-7b-shard", "world_size": 34, "expert_parallel": 2},
            "need 1 <= world_size / expert_parallel <= 16 pipeline stages and 0 <= rank < "
            "world_size, got world_size=34, expert_parallel=2, rank=0",
        ),
        (
            {"preset": "olmoe-1b-7b-shard", "world_size": 8, "expert_parallel": 8, "rank": 8},
            "got world_size=8, expert_parallel=8, rank=8",
        ),
    ],
)
def test_model_state_errors(kwargs: dict, says: str) -> None:
    with pytest.raises(UserError) as e:
        model_state(**kwargs)
    assert says in str(e.value)


def test_synthetic_bytes_are_incompressible_and_the_same_on_any_device():
    """Random bytes, not random floats: every byte position takes every value, zlib cannot shrink
    them, and the piecewise fill a GPU tensor gets gives the same bytes as the host fill."""
    import zlib

    import numpy as np

    from bench.workloads.synthetic import fill_random

    state = synthetic_state(1 << 20, 1 << 20, torch.float32, "cpu", seed=5)
    raw = state["t00000"].view(torch.uint8).numpy()
    assert len(zlib.compress(raw.tobytes(), 6)) >= raw.size
    for k in range(4):  # the exponent byte of a float in [0, 1) would be nearly constant
        assert len(np.unique(raw[k::4])) == 256
    a = fill_random(
        torch.empty(1000003, dtype=torch.uint8), np.random.Generator(np.random.SFC64(7))
    )
    b = fill_random(
        torch.empty(1000003, dtype=torch.uint8), np.random.Generator(np.random.SFC64(7)), piece=4096
    )
    assert torch.equal(a, b)


def _vma_of(address: int) -> list[str]:
    """The /proc/self/smaps block of the mapping that holds `address`."""
    block: list[str] = []
    found = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                if found:
                    break
                lo, hi = (int(x, 16) for x in head.split("-"))
                found = lo <= address < hi
                block = []
            if found:
                block.append(line.strip())
    return block


def test_emulated_device_memory_is_huge_page_memory_with_one_storage_per_tensor() -> None:
    """Host-emulated tensors come from mappings advised for transparent huge pages (as GPU
    memory is not paged 4 KiB at a time), page-aligned, each with a storage of its own; their
    memory outlives the allocator."""
    state = synthetic_state(6 << 20, 1 << 20)
    ptrs = [t.untyped_storage().data_ptr() for t in state.values()]
    assert all(p % 4096 == 0 for p in ptrs)
    assert len(set(ptrs)) == len(ptrs)
    assert all(t.untyped_storage().nbytes() == 1 << 20 for t in state.values())
    ends = sorted((p, p + (1 << 20)) for p in ptrs)
    assert all(
        a[1] <= b[0] for a, b in zip(ends[:-1], ends[1:], strict=True)
    )  # no two tensors overlap
    vma = _vma_of(ptrs[0])
    assert vma, "the tensor's memory is in no mapping of this process"
    flags = next(line for line in vma if line.startswith("VmFlags:")).split()[1:]
    assert "hg" in flags, vma  # madvise(MADV_HUGEPAGE) was applied to the mapping
    # a copy made now matches after everything but the tensors is gone
    copies = {k: t.clone().view(torch.uint8) for k, t in state.items()}
    gc.collect()
    assert all(torch.equal(state[k].view(torch.uint8), copies[k]) for k in state)


# --- olmoe-1b-7b-shard: a mixture of experts, cut by pipeline stage and expert rank ---------

OLMOE = PRESETS["olmoe-1b-7b-shard"]
# allenai/OLMoE-1B-7B-0924 config.json (Hugging Face), as quoted in bench.workloads.presets
D, F, E, L, V = 2048, 1024, 64, 16, 50304
DENSE_PER_LAYER = 4 * D * D + 2 * D + E * D + 2 * D  # attention, QK-norm, router, two norms
EXPERT = 3 * F * D  # gate, up and down


def test_olmoe_whole_model_matches_its_configuration() -> None:
    assert (OLMOE.d_model, OLMOE.d_ff, OLMOE.n_experts, OLMOE.n_layer, OLMOE.vocab) == (
        D,
        F,
        E,
        L,
        V,
    )
    shapes = dict(_moe_shapes(OLMOE, cut(OLMOE, 1, 0)))
    # embeddings and an untied head, the final norm, and per layer 9 dense tensors and 3 per
    # expert: 3,219 tensors and 6,919,161,856 parameters ("6.9B", arXiv 2409.02060)
    assert len(shapes) == 3 + L * (9 + 3 * E) == 3219
    assert _n_params(list(shapes.items())) == 2 * V * D + D + L * (DENSE_PER_LAYER + E * EXPERT)
    assert _n_params(list(shapes.items())) == 6_919_161_856
    assert shapes["model.embed_tokens.weight"] == shapes["lm_head.weight"] == (V, D)
    assert shapes["model.layers.0.self_attn.k_proj.weight"] == (D, D)  # 16 KV heads of 128
    assert shapes["model.layers.0.self_attn.k_norm.weight"] == (D,)
    assert shapes["model.layers.15.mlp.gate.weight"] == (E, D)
    assert shapes["model.layers.15.mlp.experts.63.gate_proj.weight"] == (F, D)
    assert shapes["model.layers.15.mlp.experts.63.up_proj.weight"] == (F, D)
    assert shapes["model.layers.15.mlp.experts.63.down_proj.weight"] == (D, F)
    assert list(shapes)[-2:] == ["model.norm.weight", "lm_head.weight"]


@pytest.mark.parametrize(("world_size", "ep"), [(8, 8), (8, 1), (16, 4), (64, 64), (1024, 64)])
def test_olmoe_shards_add_up_to_the_whole_model(world_size: int, ep: int) -> None:
    """Every name once over all ranks: a stage's dense tensors on its expert rank 0 only."""
    whole = _moe_shapes(OLMOE, cut(OLMOE, 1, 0))
    shards = [_moe_shapes(OLMOE, cut(OLMOE, world_size, r, ep)) for r in range(world_size)]
    names = [n for s in shards for n, _ in s]
    assert len(names) == len(set(names)) == len(whole)
    assert set(names) == {n for n, _ in whole}
    assert sum(_n_params(s) for s in shards) == 6_919_161_856


ENDS = {"model.embed_tokens.weight": V * D, "model.norm.weight": D, "lm_head.weight": V * D}


@pytest.mark.parametrize(
    ("world_size", "ep", "rank", "layers", "experts", "dense", "ends"),
    [
        # one stage, 8 expert ranks: rank 0 holds the dense tensors and the embeddings and head
        (8, 8, 0, range(16), range(0, 8), True, list(ENDS)),
        (8, 8, 1, range(16), range(8, 16), False, []),
        # 8 stages of 2 layers, every expert: rank 3 is layers 6-7
        (8, 1, 3, range(6, 8), range(64), True, []),
        # 16 stages of one layer, 4 expert ranks: rank 5 is layer 1's experts 16-31
        (64, 4, 5, range(1, 2), range(16, 32), False, []),
        (64, 4, 63, range(15, 16), range(48, 64), False, []),
        (64, 4, 60, range(15, 16), range(0, 16), True, ["model.norm.weight", "lm_head.weight"]),
    ],
)
def test_olmoe_cut_tensors_and_bytes_follow_the_formula(
    world_size: int,
    ep: int,
    rank: int,
    layers: range,
    experts: range,
    dense: bool,
    ends: list[str],
) -> None:
    shapes = _moe_shapes(OLMOE, cut(OLMOE, world_size, rank, ep))
    params = len(layers) * (3 * len(experts) + (9 if dense else 0)) + len(ends)
    numel = len(layers) * (len(experts) * EXPERT + (DENSE_PER_LAYER if dense else 0))
    numel += sum(ENDS[n] for n in ends)
    assert len(shapes) == params
    assert _n_params(shapes) == numel
    expert_names = {
        f"model.layers.{i}.mlp.experts.{e}.{m}.weight"
        for i in layers
        for e in experts
        for m in ("gate_proj", "up_proj", "down_proj")
    }
    assert {n for n, _ in shapes if ".experts." in n} == expert_names
    assert {n for n, _ in shapes if n in ENDS} == set(ends)
    assert any(n.endswith("mlp.gate.weight") for n, _ in shapes) == dense
    # fp32 parameters, fp32 exp_avg and exp_avg_sq, a 4-byte step: 4 tensors a parameter
    largest = V * D if ends else (D * D if dense else F * D)
    assert model_size("olmoe-1b-7b-shard", torch.float32, True, world_size, rank, ep) == (
        3 * 4 * numel + 4 * params,
        4 * largest,
        4 * params,
    )
    # bf16 parameters keep fp32 moments; without the optimizer, the parameters alone
    assert model_size("olmoe-1b-7b-shard", torch.bfloat16, True, world_size, rank, ep) == (
        (2 + 8) * numel + 4 * params,
        4 * largest,
        4 * params,
    )
    assert model_size("olmoe-1b-7b-shard", torch.bfloat16, False, world_size, rank, ep) == (
        2 * numel,
        2 * largest,
        params,
    )


def test_olmoe_small_shard_builds_fast_with_adamw_state() -> None:
    """Layer 1's expert 1 of 64 expert ranks (1024 ranks): 3 matrices and their AdamW state,
    12 tensors, the bytes model_size says."""
    import time

    t0 = time.perf_counter()
    state = model_state(
        "olmoe-1b-7b-shard", world_size=1024, rank=65, expert_parallel=64, optimizer=True
    )
    elapsed = time.perf_counter() - t0
    model, optim = state["model"], state["optim"]
    assert list(model) == [
        f"model.layers.1.mlp.experts.1.{m}.weight" for m in ("gate_proj", "up_proj", "down_proj")
    ]
    assert [tuple(t.shape) for t in model.values()] == [(F, D), (F, D), (D, F)]
    tensors = list(model.values()) + [
        t for s in optim["state"].values() for t in (s["step"], s["exp_avg"], s["exp_avg_sq"])
    ]
    assert len(tensors) == 12
    assert sum(_nbytes(t) for t in tensors) == 3 * 3 * 4 * F * D + 3 * 4
    assert (sum(_nbytes(t) for t in tensors), 8 * MiB, 12) == model_size(
        "olmoe-1b-7b-shard", torch.float32, True, 1024, 65, 64
    )
    assert optim["param_groups"][0]["params"] == [0, 1, 2]
    for i, p in enumerate(model.values()):
        assert optim["state"][i]["exp_avg"].shape == p.shape
        assert optim["state"][i]["exp_avg_sq"].dtype == torch.float32
    assert all(t.view(torch.uint8).any() for t in model.values())  # random bits, not zeros
    assert elapsed < 5, f"72 MiB of state took {elapsed:.1f} s to build"


def test_state_builder_time_per_tensor_holds_at_56x_the_tensors() -> None:
    """The builder makes one pass over the shapes: OLMoE's layout with tiny widths, one layer
    of 16 experts (228 tensors) against the whole model (12,876 tensors, 56x); a cost per
    tensor that grew with the count (a list scanned per tensor) would show as a ratio of 56."""
    import time

    tiny = Arch("moe", 16, 64, 128, d_ff=32, n_head=4, n_kv_head=4, n_experts=64)
    small, whole = _moe_shapes(tiny, cut(tiny, 64, 4, 4)), _moe_shapes(tiny, cut(tiny, 1, 0))
    _state(small, "cpu", torch.float32, True, 0)  # first-use costs out of the way

    def per_tensor(shapes: list[tuple[str, tuple[int, ...]]]) -> float:
        best = math.inf
        for _ in range(3):
            t0 = time.perf_counter()
            state = _state(shapes, "cpu", torch.float32, True, 0)
            best = min(best, time.perf_counter() - t0)
            assert len(state["model"]) + 3 * len(state["optim"]["state"]) == 4 * len(shapes)
            del state
        return best / (4 * len(shapes))

    a, b = per_tensor(small), per_tensor(whole)
    assert 4 * len(small) == 228 and 4 * len(whole) == 12876
    assert b < 4 * a, f"{b * 1e6:.0f} us a tensor at 12,876 tensors, {a * 1e6:.0f} us at 228"
