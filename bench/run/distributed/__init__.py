"""Many ranks checkpointing at once, under torchrun: the process group, which targets each rank
writes, barrier-aligned cases, and per-rank and aggregate rows gathered to rank 0.

    ckptbench run configs/multirank.yaml --nproc 4        # re-executes itself through torchrun
    torchrun --nproc-per-node 4 -m bench run configs/multirank.yaml

Every rank holds its own shard of the state (`ranks.shard: even` splits each total across the
ranks that checkpoint, as FSDP/ZeRO shard a model; `per_rank` gives every rank a whole total) and
saves it with the case's engine into its own targets (`ranks.mapping`, see `assign`). For each
repetition all ranks pass a barrier, the active ones save and wait until durable, pass a second
barrier, restore and verify their own shard, and every rank's row is gathered: rank 0 writes the
per-rank rows and one aggregate row (stall and time to durability = the maximum over ranks, bytes
= the sum, so aggregate bandwidth = total bytes / the slowest rank's time, as MLPerf Storage
reports it). `ranks.active` runs the same job with only the first k ranks checkpointing.

Failures: an error on a rank fails that repetition on every rank (its rows say which rank); a rank
that dies or hangs is named by rank 0's monitored barrier (gloo) within `ranks.timeout_s`, the
case gets error rows and every surviving rank exits non-zero; torchrun then ends the job. The
control collectives always run on a gloo group (on CUDA the default group is NCCL + gloo, one GPU
per rank); checkpoint data never crosses ranks.
"""

from __future__ import annotations

from bench.run.distributed.ranks import (
    FAULT_ENV,
    RankContext,
    assign,
    build_shard,
    check_resume_world,
    check_world,
    faults,
    inject,
    load_shard,
    map_label,
    plan_groups,
    ranks_block,
    same_config,
    save_shard,
    shard_bytes,
    shard_name,
    write_lost,
)
from bench.run.distributed.world import (
    SETUP_TIMEOUT_S,
    RankLost,
    TorchrunWorld,
    _lost_ranks,
    init_world,
)

__all__ = [
    "FAULT_ENV",
    "SETUP_TIMEOUT_S",
    "RankContext",
    "RankLost",
    "TorchrunWorld",
    "_lost_ranks",
    "assign",
    "build_shard",
    "check_resume_world",
    "check_world",
    "faults",
    "init_world",
    "inject",
    "load_shard",
    "map_label",
    "plan_groups",
    "ranks_block",
    "same_config",
    "save_shard",
    "shard_bytes",
    "shard_name",
    "write_lost",
]
