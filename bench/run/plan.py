"""A sweep's plan: config -> workloads x groups of targets x engines x repetitions.

A group is a set of cases that share targets: SSD count n, how the ranks map onto the targets,
and how many ranks checkpoint at once. A single-process run has one group per SSD count (its
one rank over the first n targets); bench.run.distributed plans the groups of multi-rank runs.
Case ids and checkpoint names are made here, so a resumed run finds its rows again.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bench.common import sizes
from bench.common.errors import UserError
from bench.common.schema import Strict
from bench.config import sweep as config_mod
from bench.engines import REGISTRY
from bench.run.preflight import Verdict
from bench.workloads import mlperf as mlperf_mod
from bench.workloads.presets import PRESETS

if TYPE_CHECKING:
    import torch

    from bench.engines.base import StateSize


@dataclass(frozen=True)
class Workload:
    """One state to checkpoint."""

    id: str
    kind: str  # synthetic, model or mlperf
    total_bytes: int  # planned (synthetic), actual (model), every rank's (mlperf) tensor bytes
    tensor_bytes: int  # 0 for models (mixed sizes)
    model: config_mod.ModelSpec | None = None
    mlperf: config_mod.MlperfSpec | None = None  # each rank its own shard of the preset

    def size(
        self,
        cfg: config_mod.Config,
        cuda: bool,
        targets: int,
        total: int | None = None,
        rank: int = 0,
    ) -> StateSize:
        """Its state's size (bench.engines.base.StateSize), without building it; `total`: a
        rank's shard of a synthetic workload; `rank`: whose shard of an MLPerf preset."""
        from bench.engines.base import StateSize

        if self.mlperf is not None:
            shard = mlperf_mod.shard_at(self.mlperf.preset, rank, self.mlperf.scale)
            parts = [n * mlperf_mod.MODEL_ITEM for layer in shard.model for n in layer]
            parts += [n * mlperf_mod.OPTIM_ITEM for n in shard.optim]
            return StateSize(
                shard.nbytes, max(parts), len(parts), cuda, targets, smallest=min(parts)
            )
        if self.model is None:
            nbytes = self.total_bytes if total is None else total
            each = min(self.tensor_bytes, nbytes)
            last = nbytes % each if each else 0
            return StateSize(
                nbytes, each, -(-nbytes // max(each, 1)), cuda, targets, smallest=last or each
            )
        import torch

        from bench.workloads.models import model_size

        m = self.model
        nbytes, largest, n = model_size(
            m.preset, getattr(torch, m.dtype), m.optimizer, m.world_size, m.rank, m.expert_parallel
        )
        return StateSize(nbytes, largest, n, cuda, targets)

    def build(
        self,
        cfg: config_mod.Config,
        device: torch.device,
        total: int | None = None,
        seed: int = 0,
        rank: int = 0,
    ) -> Any:
        """The state on `device` (`total` bytes of it for a rank's shard; rank `rank`'s shard of
        an MLPerf preset), random bits."""
        import torch

        from bench.workloads import model_state, synthetic_state

        if self.mlperf is not None:
            from bench.workloads.models import mlperf_state

            mp = self.mlperf
            return mlperf_state(mp.preset, rank, mp.scale, device, cfg.seed + seed)
        if self.model is None:
            size = self.total_bytes if total is None else total
            return synthetic_state(
                size,
                min(self.tensor_bytes, size),
                getattr(torch, cfg.dtype),
                device,
                cfg.seed + seed,
            )
        m = self.model
        return model_state(
            m.preset,
            device,
            getattr(torch, m.dtype),
            m.optimizer,
            m.world_size,
            m.rank,
            cfg.seed,
            m.expert_parallel,
        )


def workloads(cfg: config_mod.Config) -> list[Workload]:
    out = []
    if cfg.mlperf is not None:
        mp = cfg.mlperf
        wid = f"mlperf-{mp.preset}" + ("" if mp.scale == 1 else f"-scale{mp.scale:g}")
        model = mlperf_mod.model(mp.preset)
        total = sum(  # the checkpoint: every rank's of every host
            mlperf_mod.shard_at(mp.preset, r, mp.scale).nbytes
            for r in mlperf_mod.job_ranks(model, mp.host_procs, mp.hosts)
        )
        return [Workload(wid, "mlperf", total, 0, mlperf=mp)]
    run, _ = cfg.synthetic_cases()
    for total, tensor in run:
        wid = f"synthetic-{sizes.format_size(total)}-{sizes.format_size(tensor)}"
        out.append(Workload(wid, "synthetic", total, tensor))
    for m in cfg.models:
        wid = m.preset if m.optimizer else f"{m.preset}-noopt"
        if PRESETS[m.preset].kind in ("llama", "moe"):  # the sharded presets: which shard
            wid += f"-r{m.rank}of{m.world_size}"
        if m.expert_parallel > 1:
            wid += f"-ep{m.expert_parallel}"
        out.append(Workload(wid, "model", 0, 0, m))
    return out


@dataclass(frozen=True)
class Group:
    """Cases that share targets: SSD count n, mapping and k ranks checkpointing at once.
    `label` is the target_map column ("" for a single-process run)."""

    n: int
    mapping: str
    k: int
    label: str

    @property
    def key(self) -> str:
        return f"x{self.n}-{self.label}-{self.k}r" if self.label else f"x{self.n}"

    @property
    def suffix(self) -> str:
        """What the group adds to a case id (nothing for a single-process run)."""
        return f"-{self.label}-{self.k}r" if self.label else ""


@dataclass(frozen=True)
class RunPlan:
    """What one run does, decided whole before its first save (bench.run.decide) and never
    changed after: the targets, the workloads, the groups of targets and each rank's place in
    them (`layout`: per group, every rank's target indices and whether it writes a subfolder of
    its own; `table`: the ranks, under torchrun), the engines that can run here with their
    options resolved once (the run's device filled in, validated: the preflight judges and the
    run creates the engines from the same models), every case's verdict
    (bench.run.preflight) and what it was judged against (`preflight`: env.json's block), the
    cases a resumed run has already recorded (`done`), and the page-cache policy
    (`cache_dropped`: this rank's node drops the page cache between cases). `nodes` and
    `paths` are what the ranks found on their nodes (env.json's ranks block)."""

    targets: list[str]
    workloads: list[Workload]
    groups: list[Group]
    layout: Mapping[str, list[tuple[list[int], bool]]]
    engines: list[str]
    options: Mapping[str, Strict]  # engine -> its options model (bench.engines.options)
    table: list[dict[str, Any]] = field(default_factory=list)
    skipped_groups: list[str] = field(default_factory=list)
    verdicts: Mapping[tuple[str, str, str], Verdict] = field(default_factory=dict)
    preflight: Mapping[str, Any] = field(default_factory=dict)
    done: frozenset[tuple[str, bool, int]] = frozenset()
    cache_dropped: bool = False
    # every node's storage and page-cache drop (by its first rank), every rank's targets
    nodes: list[dict[str, Any] | None] = field(default_factory=list)
    paths: list[dict[str, list[str]]] = field(default_factory=list)

    def my_targets(self, g: Group, rank: int) -> tuple[list[str], list[int]] | None:
        """Rank `rank`'s target directories for group g and their indices in the config's
        targets (None: it does not checkpoint in this group)."""
        if rank >= g.k:
            return None
        idx, sub = self.layout[g.key][rank]
        paths = [self.targets[i] for i in idx]
        if sub:
            paths = [os.path.join(p, f"rank-{rank}") for p in paths]
        return paths, idx

    def restore(self, wl: Workload, g: Group, engine: str) -> str | None:
        """How the case restores (restart, fresh), or None where the preflight refused it."""
        return self.verdicts[(wl.id, g.key, engine)].restore

    def chunk_bytes(self) -> int:
        """The engines' chunk size (the storage probes' block)."""
        return next(
            (o.chunk_bytes for o in self.options.values() if hasattr(o, "chunk_bytes")), 16 << 20
        )

    def copy_threads(self) -> int:
        """The threads the snapshot copies with (the copy ceiling's)."""
        threads = next(
            (o.copy_threads for o in self.options.values() if hasattr(o, "copy_threads")), 0
        )
        return threads or min(os.cpu_count() or 1, 8)


def resolved_engine_options(cfg: config_mod.Config, engines: list[str]) -> dict[str, Strict]:
    """Each engine's options model, resolved once for the run (its device filled in)."""
    from bench.engines import validate_options

    return {e: validate_options(e, config_mod.engine_options(cfg, e)) for e in engines}


def local_groups(cfg: config_mod.Config) -> list[Group]:
    """A single-process run: one group per SSD count, this rank over the first n targets."""
    return [Group(n, "shared", 1, "") for n in cfg.ssd_counts]


def engines_at(cfg: config_mod.Config, engines: list[str], n: int) -> list[str]:
    """Engines run with n targets: those that write into the first target only run once per
    workload, at the smallest SSD count (their rows say targets_used=1)."""
    first = min(cfg.ssd_counts)
    return [e for e in engines if REGISTRY[e].traits.stripes or n == first]


def case_key(w: Workload, g: Group, engine: str, i: int, warmups: int) -> tuple[str, bool, int]:
    """(case_id, warmup, rep) of repetition `i` (warm-ups first)."""
    warm = i < warmups
    return f"{w.id}-x{g.n}-{engine}{g.suffix}", warm, i if warm else i - warmups


def checkpoint_name(run_id: str, key: tuple[str, bool, int]) -> str:
    case_id, warm, rep = key
    return f"ckptbench-{run_id}-{case_id}-{'w' if warm else 'r'}{rep}"


def check_space(
    cfg: config_mod.Config,
    targets: list[str],
    wls: list[Workload],
    engines: list[str],
    scale: int = 1,
) -> None:
    """Enough free space on every target for the largest checkpoint it will hold at once, and
    for the ceilings' files.

    Target i holds a stripe 1/N of a checkpoint over N targets (the smallest N that includes it);
    the first target also holds whole checkpoints of the engines that do not stripe. Model
    presets are sized from their shapes. A storage ceiling's file on a target is its share of
    what a ceiling run writes (`ceilings.min_bytes` to `max_bytes`); ceilings and checkpoints
    are never on the disk at once. A full disk during a case anyway is recorded as that case's
    error row. `scale`: how many checkpoints of that size are written at once (ranks that each
    save a whole total).
    """
    from bench.measure.ceilings.measure import probe_bytes

    sized = [w.size(cfg, False, 1).nbytes for w in wls]
    largest = scale * max(sized, default=0)
    if cfg.mlperf is not None:  # MLPerf writes all its checkpoints before it reads one
        largest *= cfg.repetitions
    if not largest:
        return
    spec = cfg.ceilings
    probe = probe_bytes(largest, spec.min_bytes, spec.max_bytes) if spec.enabled else 0
    whole = any(not REGISTRY[e].traits.stripes for e in engines)
    for i, t in enumerate(targets[: max(cfg.ssd_counts)]):
        n = min(c for c in cfg.ssd_counts if c > i)
        share = largest if (i == 0 and whole) else -(-largest // n)
        # stripes round up to chunks; the claim, the manifest and temp files
        need = max(int(share * 1.05), -(-probe // n)) + (64 << 20)
        free = shutil.disk_usage(t).free
        if free < need:
            raise UserError(
                f"target {t}: disk space: {sizes.format_size(free)} free, but a "
                f"{sizes.format_size(largest)} checkpoint needs {sizes.format_size(need)} here; "
                "way out: a smaller total_sizes, or more targets"
            )
