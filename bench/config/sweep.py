"""Sweep configs: strict YAML -> frozen, validated Config; every error names its key path.

Axes (each a list, expanded to a cartesian product by bench.run.plan): `engines`, `total_sizes` x
`tensor_sizes` (synthetic states) and/or `models` (model-shaped presets), `ssd_counts` (each takes
the first N entries of `targets`). Unknown keys and bad values fail before anything runs.
"""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from bench.common.errors import UserError
from bench.common.schema import DTYPES, PosInt, Rate, Size, Strict, read_yaml, validated
from bench.engines import ENGINES, validate_options
from bench.engines.registry import knob_grid
from bench.workloads import mlperf as mlperf_mod
from bench.workloads.presets import PRESETS, cut_error

Mapping = Literal["shared", "dedicated", "per_target"]
JobsDepth = Annotated[list[PosInt], Field(min_length=2, max_length=2)]  # [writers, queue depth]
# `in-place`, the restart's destination before restarts were the default, reads as `restart`.
Restore = Annotated[
    Literal["restart", "fresh", "auto"],
    BeforeValidator(lambda v: "restart" if v == "in-place" else v),
]


class ModelSpec(Strict):
    """A model-shaped preset (see bench.workloads.models)."""

    preset: str
    optimizer: bool = True
    dtype: str = "float32"
    world_size: PosInt = 8
    rank: Annotated[int, Field(ge=0)] = 0
    # Mixture-of-experts presets: expert ranks within a pipeline stage (world_size /
    # expert_parallel stages); 1 for every other preset.
    expert_parallel: PosInt = 1


class TargetSpec(Strict):
    """A target directory, optionally capped to emulate a slower SSD."""

    path: str
    max_write_bw: Rate | None = None  # bytes/s, paced by the writers (token bucket)


class CeilingSpec(Strict):
    """How device ceilings are measured before (and after) the sweep (bench.measure.ceilings)."""

    enabled: bool = True
    tool: Literal["auto", "fio", "builtin"] = "auto"  # auto: fio when installed
    # The best configuration of the search runs this many times; the ceiling is the best run
    # (all kept in env.json): one run of a virtual or shared disk can be off by a factor of
    # several.
    repetitions: PosInt = 3
    # The storage probes write at least this much in all (steady state, not a burst), and at
    # most `max_bytes`, each run issuing writes for at most `max_seconds` (then its fsync): the
    # ceilings of a 40 GiB sweep cost what those of a 4 GiB one do.
    min_bytes: Size = 1 << 30
    max_bytes: Size = 4 << 30
    max_seconds: Annotated[float, Field(gt=0)] = 10.0
    after: bool = True  # measure the storage ceilings again after the sweep (disks drift)
    # Before each workload's saves, the chosen configurations once more (and the page cache
    # with one writer, copy, serialisation): env.json `ceilings_probes`, from which the model
    # predicts that workload. Single-process runs only.
    probes: bool = True
    # The search for the O_DIRECT ceiling: (writers per target, queue depth) pairs, each run once;
    # the best is then run `repetitions` times. Buffered + fsync: the writer counts searched.
    # One entry each skips the search (a quick look, or a test).
    direct_search: Annotated[list[JobsDepth], Field(min_length=1)] = [
        [j, q] for j in (1, 2, 4) for q in (8, 16, 32)
    ]
    buffered_jobs: Annotated[list[PosInt], Field(min_length=1)] = [1, 2, 4]
    # The read ceilings too (O_DIRECT and buffered, with the searches above), against which the
    # restores are judged (restore_efficiency) and modelled; false roughly halves the storage
    # runs.
    reads: bool = True


class RanksSpec(Strict):
    """Multi-rank runs (bench.run.distributed, under torchrun): each rank checkpoints its own shard.

    `mapping` is an axis: `shared` (every rank stripes over all N targets of the case),
    `dedicated` (the N targets split among the ranks, or with `dedicated_subfolders` a folder
    `target/rank-R` of every target for each rank) and `per_target` (groups of
    `ranks_per_target` ranks, each group on its own share of the targets). `active` is an axis
    too: how many ranks (the first k) checkpoint at once; the others wait at the barriers.
    """

    nproc: PosInt = 1  # processes `ckptbench run` starts through torchrun (--nproc overrides)
    mapping: Annotated[list[Mapping], Field(min_length=1)] = ["shared"]
    dedicated_subfolders: bool = False
    ranks_per_target: PosInt = 2
    active: list[PosInt] = []  # [] = every rank of the job
    shard: Literal["even", "per_rank"] = "even"  # total split across ranks, or a total per rank
    timeout_s: Annotated[float, Field(gt=0)] = 60.0  # collectives; a lost rank fails by then


class MlperfSpec(Strict):
    """MLPerf Storage v2.0's checkpoint workload (bench.workloads.mlperf): one of its models, the
    ranks of one host (its subset mode) or of `hosts` hosts, laid out as DLIO lays them out
    (host h runs ranks h x host_procs onwards), each rank's shard of DLIO's model and optimizer
    states at `scale` of its bytes; every engine writes `repetitions` checkpoints, the page
    cache is cleared, then it reads them back (bench.run.cases)."""

    preset: str
    scale: Annotated[float, Field(gt=0, le=1)] = 1.0  # of every rank's bytes (1: as published)
    host_procs: PosInt = mlperf_mod.HOST_PROCS  # the GPUs (ranks) of each host
    hosts: PosInt = 1  # the hosts of the job, one torchrun agent each (ranks.nproc = host_procs)


class Config(Strict):
    """One sweep. Sizes are bytes after validation."""

    name: str = "run"
    engines: Annotated[list[str], Field(min_length=1)]
    total_sizes: list[Size] = []
    tensor_sizes: list[Size] = []
    dtype: str = "float32"
    models: list[ModelSpec] = []
    ssd_counts: Annotated[list[PosInt], Field(min_length=1)] = [1]
    targets: list[TargetSpec] = []
    max_write_bw: Rate | None = None  # cap for every target without its own
    scratch: str = "scratch/bench"
    repetitions: PosInt = 3
    warmups: Annotated[int, Field(ge=0)] = 1
    device: Literal["auto", "cuda", "host-emulated"] = "auto"
    seed: int = 0
    verify: bool = True
    on_error: Literal["continue", "stop"] = "continue"
    # How each case's restore is held (bench.run.restart): `restart` into the state's own
    # tensors, scrubbed first, as a relaunched job restores into the model it has built
    # (checked against fingerprints of the source taken before the save; `in-place` is read as
    # this); `fresh` into new memory, a process with no model yet (compared byte for byte with
    # the source); `auto` fresh where a second copy fits, else the restart (bench.run.preflight).
    restore: Restore = "restart"
    engine_options: dict[str, dict[str, Any]] = {}
    # `ckptbench tune`'s ranges, engine -> knob -> values, in place of the engine's declared ones
    # (bench.engines.options TUNABLE); `run` ignores it.
    tune: dict[str, dict[str, Any]] = {}
    ceilings: CeilingSpec = CeilingSpec()
    # Seconds the host is watched at rest before the saves, and again after them: the idle
    # baseline whose background rate the host-cost figures take away (bench.measure.hostcost,
    # whose BASELINE_S is this default). Shorter only where those figures are not read.
    host_baseline_s: Annotated[float, Field(gt=0)] = 0.5
    ranks: RanksSpec | None = None
    mlperf: MlperfSpec | None = None

    def synthetic_cases(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """(total, tensor) pairs to run, and those skipped because tensor > total."""
        run: list[tuple[int, int]] = []
        skipped: list[tuple[int, int]] = []
        for total in self.total_sizes:
            for tensor in self.tensor_sizes:
                (skipped if tensor > total else run).append((total, tensor))
        return run, skipped

    def resolved_targets(self) -> list[str]:
        """The targets: as given, or `scratch/target-i` for as many as the largest SSD count."""
        if self.targets:
            return [os.path.abspath(t.path) for t in self.targets]
        return [
            os.path.abspath(os.path.join(self.scratch, f"target-{i}"))
            for i in range(max(self.ssd_counts))
        ]

    def target_caps(self) -> list[int | None]:
        """Write-bandwidth cap of each resolved target (None: uncapped)."""
        if self.targets:
            return [t.max_write_bw or self.max_write_bw for t in self.targets]
        return [self.max_write_bw] * max(self.ssd_counts)


def _check(cfg: Config) -> None:
    # The name goes into the run directory and every checkpoint name: one path component.
    if not cfg.name or cfg.name in (".", "..") or "/" in cfg.name or "\0" in cfg.name:
        raise UserError(f"name: {cfg.name!r} must be a non-empty name without '/'")
    check_engines(cfg.engines, cfg.engine_options)
    for e, ranges in cfg.tune.items():
        if e not in ENGINES:
            raise UserError(f"tune.{e}: unknown engine {e!r}")
        knob_grid(e, ranges, cfg.engine_options.get(e))
    targets = cfg.resolved_targets()
    for i, t in enumerate(targets):
        if t in targets[:i]:
            raise UserError(f"targets.{i}: {t} is already listed as targets.{targets.index(t)}")
    if cfg.targets and max(cfg.ssd_counts) > len(cfg.targets):
        raise UserError(
            f"ssd_counts: {max(cfg.ssd_counts)} SSDs asked for, but targets lists only {len(cfg.targets)}"
        )
    if cfg.mlperf is not None:
        _check_mlperf(cfg)
    elif not cfg.models and not (cfg.total_sizes and cfg.tensor_sizes):
        raise UserError("total_sizes, tensor_sizes: give both (synthetic states) and/or models")
    if bool(cfg.total_sizes) != bool(cfg.tensor_sizes):
        raise UserError("total_sizes, tensor_sizes: give both or neither")
    dtypes = [("dtype", cfg.dtype)] + [
        (f"models.{i}.dtype", m.dtype) for i, m in enumerate(cfg.models)
    ]
    for key, name in dtypes:
        if name not in DTYPES:
            raise UserError(
                f"{key}: unknown dtype {name!r} (e.g. float32, bfloat16, float16, uint8)"
            )
    item = DTYPES[cfg.dtype]
    for key in ("total_sizes", "tensor_sizes"):
        for i, v in enumerate(getattr(cfg, key)):
            if v % item:
                raise UserError(
                    f"{key}.{i}: {v} bytes is not a multiple of the {cfg.dtype} size ({item} B)"
                )
    run, _ = cfg.synthetic_cases()
    if cfg.total_sizes and not run:
        raise UserError("tensor_sizes: every tensor size is larger than every total size")
    for i, m in enumerate(cfg.models):
        if m.preset not in PRESETS:
            raise UserError(
                f"models.{i}.preset: unknown preset {m.preset!r} (known: {', '.join(PRESETS)})"
            )
        if m.rank >= m.world_size:
            raise UserError(f"models.{i}.rank: {m.rank} must be below world_size {m.world_size}")
        why = cut_error(m.preset, m.world_size, m.rank, m.expert_parallel)
        if why:
            raise UserError(f"models.{i}: {why}")
    if cfg.ranks is not None:
        _check_ranks(cfg)


def _check_mlperf(cfg: Config) -> None:
    """An MLPerf run is its workload alone, on the ranks of its hosts, without warm-ups."""
    m = cfg.mlperf
    assert m is not None
    model = mlperf_mod.model(m.preset)
    if cfg.models or cfg.total_sizes or cfg.tensor_sizes:
        raise UserError(
            "mlperf: the run's state is the preset's; give no models, total_sizes or tensor_sizes"
        )
    if m.hosts > 1 and m.hosts * m.host_procs > model.world:
        raise UserError(
            f"mlperf.hosts: {m.hosts} hosts of {m.host_procs} GPUs (host_procs) are "
            f"{m.hosts * m.host_procs} ranks, {m.preset}'s layout has {model.world} (TP x PP x DP "
            f"{model.tp} x {model.pp} x {model.dp}); give hosts x host_procs <= {model.world}"
        )
    procs = len(mlperf_mod.host_ranks(model, m.host_procs))
    r = cfg.ranks
    if r is None or r.nproc != procs:
        where = (
            f"on each of its {m.hosts} hosts (mlperf.host_procs)"
            if m.hosts > 1
            else f"on a host of {m.host_procs} GPUs (MLPerf's subset mode)"
        )
        raise UserError(
            f"ranks.nproc: {m.preset} runs {procs} ranks {where}, got "
            f"{r.nproc if r else 'no ranks section'}"
        )
    every = len(mlperf_mod.job_ranks(model, m.host_procs, m.hosts))
    if r.shard != "per_rank" or len(r.mapping) != 1 or (r.active and r.active != [every]):
        raise UserError(
            "ranks: an MLPerf run has every rank save its own shard at once: shard per_rank, "
            "one mapping, active all ranks"
        )
    if cfg.warmups:
        raise UserError("warmups: MLPerf times every checkpoint; set warmups: 0")


def _check_ranks(cfg: Config) -> None:
    r = cfg.ranks
    assert r is not None
    if cfg.models:
        raise UserError(
            "models: model presets are not sharded across ranks; with ranks, use "
            "total_sizes and tensor_sizes (each rank saves its shard of the total)"
        )
    for key in ("mapping", "active"):
        values = getattr(r, key)
        if len(set(values)) != len(values):
            raise UserError(f"ranks.{key}: a value is listed twice in {values}")
    if r.dedicated_subfolders and "dedicated" not in r.mapping:
        raise UserError(
            "ranks.dedicated_subfolders: applies to mapping dedicated, which is not listed"
        )
    if r.active and max(r.active) > r.nproc:
        raise UserError(
            f"ranks.active: {max(r.active)} ranks asked for, but ranks.nproc is {r.nproc}"
        )


def check_engines(
    engines: list[str], options: dict[str, dict[str, Any]], extra: tuple[str, ...] = ()
) -> None:
    """The engine names of a config (`extra`: names that are not engines but allowed, such as
    a training config's `none`) and each engine's options, validated by its options model."""
    known = [*extra, *ENGINES]
    for i, e in enumerate(engines):
        if e not in known:
            raise UserError(f"engines.{i}: unknown engine {e!r} (known: {', '.join(known)})")
    if len(set(engines)) != len(engines):
        raise UserError(f"engines: an engine is listed twice in {engines}")
    for e, opts in options.items():
        if e in extra:
            raise UserError(f"engine_options.{e}: {e} is not an engine and takes no options")
        if e not in ENGINES:
            raise UserError(f"engine_options.{e}: unknown engine {e!r}")
        validate_options(e, opts, f"engine_options.{e}")


def engine_options(cfg: Any, engine: str) -> dict[str, Any]:
    """The config's options for `engine`, with the run's device where the engine takes one."""
    opts = dict(cfg.engine_options.get(engine, {}))
    if "device" in ENGINES[engine].options.model_fields and "device" not in opts:
        opts["device"] = cfg.device
    return opts


def resolved_options(cfg: Any, engines: list[str]) -> dict[str, dict[str, Any]]:
    """Every engine's options with their defaults filled in, as stored in env.json."""
    return {e: validate_options(e, engine_options(cfg, e)).model_dump() for e in engines}


def from_dict(raw: Any, where: str = "config") -> Config:
    if not isinstance(raw, dict):
        raise UserError(f"{where}: expected a mapping of keys, got {type(raw).__name__}")
    # A model given as a bare name is a preset with its defaults; a target as a bare path.
    if isinstance(raw.get("models"), list):
        raw = {**raw, "models": [{"preset": m} if isinstance(m, str) else m for m in raw["models"]]}
    if isinstance(raw.get("targets"), list):
        raw = {**raw, "targets": [{"path": t} if isinstance(t, str) else t for t in raw["targets"]]}
    # A single mapping may be given bare (`mapping: shared`).
    ranks = raw.get("ranks")
    if isinstance(ranks, dict) and isinstance(ranks.get("mapping"), str):
        raw = {**raw, "ranks": {**ranks, "mapping": [ranks["mapping"]]}}
    return validated(Config, raw, where, _check)


def load(path: str, overrides: list[str] | None = None) -> Config:
    """Read, override (`--set`) and validate a YAML config."""
    return from_dict(read_yaml(path, overrides), f"config {path}")


def resolved(cfg: Config) -> dict[str, Any]:
    """The fully resolved config, as stored with the results (sizes in bytes, targets absolute)."""
    d = cfg.model_dump()
    d["targets"] = cfg.resolved_targets()
    d["target_caps"] = cfg.target_caps()
    d["engine_options"] = {
        e: validate_options(e, cfg.engine_options.get(e, {})).model_dump() for e in cfg.engines
    }
    run, skipped = cfg.synthetic_cases()
    d["skipped_cases"] = [
        {"total_bytes": t, "tensor_bytes": s, "why": "tensor larger than total"} for t, s in skipped
    ]
    return d
