"""The model presets by name, with their architecture hyperparameters, and how a sharded preset
is cut among ranks (no torch here: configs name presets, and validating one must stay cheap).
bench.workloads.models builds their states.

olmoe-1b-7b-shard is OLMoE-1B-7B-0924 (Allen Institute for AI), a mixture of experts whose
figures are those of its public Hugging Face configuration
(https://huggingface.co/allenai/OLMoE-1B-7B-0924/blob/main/config.json): hidden_size 2048,
intermediate_size 1024 (each expert's SwiGLU width), num_experts 64 (routed to 8 a token),
num_hidden_layers 16, num_attention_heads 16, num_key_value_heads 16, vocab_size 50304,
max_position_embeddings 4096, tie_word_embeddings false. The model's paper gives 6.9B parameters
in all (arXiv 2409.02060); these shapes add up to 6,919,161,856 in 3,219 tensors.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Arch:
    kind: str  # gpt2, llama (pipeline-sharded) or moe (pipeline x expert-parallel)
    n_layer: int
    d_model: int
    vocab: int
    ctx: int = 1024
    d_ff: int = 0  # MLP width (moe: of one expert)
    n_head: int = 0
    n_kv_head: int = 0
    n_experts: int = 0  # routed experts per layer (moe)


PRESETS: dict[str, Arch] = {
    "gpt2-small": Arch("gpt2", 12, 768, 50257),
    "gpt2-medium": Arch("gpt2", 24, 1024, 50257),
    "gpt2-large": Arch("gpt2", 36, 1280, 50257),
    "gpt2-xl": Arch("gpt2", 48, 1600, 50257),
    "llama-7b-shard": Arch("llama", 32, 4096, 32000, ctx=4096, d_ff=11008),
    "olmoe-1b-7b-shard": Arch(
        "moe", 16, 2048, 50304, ctx=4096, d_ff=1024, n_head=16, n_kv_head=16, n_experts=64
    ),
}


@dataclass(frozen=True)
class Cut:
    """One rank's slice of a sharded preset: layers [lo, hi) of its pipeline stage and experts
    [e_lo, e_hi) of each of those layers; `dense` when it also holds the stage's non-expert
    tensors (attention, router, norms, and the embeddings or the head on the first or last
    stage)."""

    lo: int
    hi: int
    e_lo: int
    e_hi: int
    dense: bool
    first: bool
    last: bool


def cut_error(preset: str, world_size: int, rank: int, expert_parallel: int = 1) -> str | None:
    """Why a preset cannot be cut this way, in one line; None when it can."""
    if preset not in PRESETS:
        return f"unknown model preset {preset!r} (known: {', '.join(PRESETS)})"
    a = PRESETS[preset]
    if a.kind != "moe" and expert_parallel != 1:
        return (
            f"{preset}: expert_parallel applies to mixture-of-experts presets only, "
            f"got {expert_parallel}"
        )
    if a.kind == "llama":
        if not (1 <= world_size <= a.n_layer) or not (0 <= rank < world_size):
            return (
                f"{preset}: need 1 <= world_size <= {a.n_layer} and 0 <= rank < world_size, "
                f"got world_size={world_size}, rank={rank}"
            )
    if a.kind == "moe":
        ep = expert_parallel
        if ep < 1 or a.n_experts % ep or world_size % ep:
            return (
                f"{preset}: expert_parallel must divide num_experts ({a.n_experts}) and "
                f"world_size ({world_size}), got {ep}"
            )
        if not (1 <= world_size // ep <= a.n_layer) or not (0 <= rank < world_size):
            return (
                f"{preset}: need 1 <= world_size / expert_parallel <= {a.n_layer} pipeline "
                f"stages and 0 <= rank < world_size, got world_size={world_size}, "
                f"expert_parallel={ep}, rank={rank}"
            )
    return None


def cut(a: Arch, world_size: int, rank: int, expert_parallel: int = 1) -> Cut:
    """The slice of rank `rank` (validated by cut_error first).

    world_size / expert_parallel pipeline stages take consecutive layers (the last stage the
    remainder); the expert_parallel ranks of a stage are consecutive (rank = stage *
    expert_parallel + expert rank) and each takes a contiguous block of every layer's experts,
    as Megatron-style expert parallelism places them. The non-expert tensors of a stage are
    replicated on its expert ranks in memory but saved once, by its expert rank 0, as a
    deduplicating checkpointer (DCP, Megatron's distributed checkpoint) writes them: the shards
    of all ranks add up to the model once."""
    ep = expert_parallel
    stages = world_size // ep
    stage, e_rank = divmod(rank, ep)
    per = a.n_layer // stages
    lo, hi = stage * per, (stage + 1) * per if stage < stages - 1 else a.n_layer
    local = a.n_experts // ep if a.n_experts else 0
    return Cut(
        lo, hi, e_rank * local, (e_rank + 1) * local, e_rank == 0, stage == 0, stage == stages - 1
    )
