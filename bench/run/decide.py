"""Decide, then run: a sweep's plan (bench.run.plan.RunPlan), complete and frozen before its first
ceiling, state or save, from the config and the world it runs in.

`decide` is a pipeline of steps, each taking what was decided so far (a frozen plan) and
returning it with its own part added, never changing what an earlier step decided:

1. `cases`: the targets, workloads and groups (under torchrun: every rank runs the same config,
   the ranks' table, the mapping of ranks to targets), the engines that can run here and their
   options resolved once;
2. `judge`: every case's verdict against this machine's memory (bench.run.preflight), a case
   that cannot fit refused in one line (exit 2) or skipped with a note;
3. `check_targets`: every rank's targets exist, are writable, take O_DIRECT where needed and
   hold the checkpoints;
4. `open_run`: the run directory, new or resumed (then the rows it already holds), by rank 0;
5. `page_cache`: whether each node can drop the page cache between cases (root), and what the
   first rank of each node found of its storage.

With one process the collectives do nothing (bench.run.core.LocalWorld).
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any

from bench.common.errors import UserError
from bench.common.schema import DTYPES
from bench.config import sweep as config_mod
from bench.measure import env as env_mod
from bench.measure import timers as measure
from bench.measure.ceilings.measure import PROBE_COPY_BYTES
from bench.run import distributed as dist
from bench.run import mlperf, plan, preflight
from bench.run.core import Core, World
from bench.run.plan import RunPlan

if TYPE_CHECKING:
    from bench.common.devices import Device


@dataclasses.dataclass(frozen=True)
class Inputs:
    """What a run's plan is decided from: the config and its ranks section, the world, the
    run's device and core, and whether this is a rank of a torchrun job (`ranked`)."""

    cfg: config_mod.Config
    spec: config_mod.RanksSpec
    world: World
    device: Device
    core: Core
    ranked: bool


def decide(run: Inputs, *, preflight_only: bool = False) -> RunPlan:
    """The run's plan, decided whole (see the module). `preflight_only`: stop once every case
    is judged (`run --preflight`): the plan then holds the verdicts, and nothing was opened."""
    cases_ = cases(run)
    mlperf_share(run, cases_)
    judged = judge(run, cases_)
    if preflight_only:
        return judged
    refuse(run, judged)
    paths = check_targets(run, judged)
    done = open_run(run, judged)
    nodes, dropped = page_cache(run, judged)
    return dataclasses.replace(judged, paths=paths, done=done, nodes=nodes, cache_dropped=dropped)


def cases(run: Inputs) -> RunPlan:
    """The run's targets, workloads, groups (with the ranks' table and layout under torchrun),
    the engines that can run here and their options."""
    cfg, w, core = run.cfg, run.world, run.core
    targets = cfg.resolved_targets()
    wls = plan.workloads(cfg)
    table: list[dict[str, Any]] = []
    skipped: list[str] = []
    if run.ranked:
        w.barrier("the start")
        dist.same_config(cfg, w)
        me = {
            "rank": w.rank,
            "local_rank": w.local_rank,
            "node_rank": w.node_rank,
            "host": w.host,
            "pid": os.getpid(),
            "device": str(run.device.torch_device),
        }
        table = w.all_gather(me, "the rank table")
        if cfg.mlperf is not None:  # the hosts and ranks the config asks for, on every rank
            mlperf.check_job(cfg, table)
        groups, layout, skipped = dist.plan_groups(cfg, run.spec, w.size, table)
        for s in skipped:
            core.note(s)
    else:
        groups = plan.local_groups(cfg)
        layout = {g.key: [(list(range(g.n)), False)] for g in groups}
    engines = core.runnable(cfg.engines)
    return RunPlan(
        targets=targets,
        workloads=wls,
        groups=groups,
        layout=layout,
        engines=engines,
        options=plan.resolved_engine_options(cfg, engines),
        table=table,
        skipped_groups=skipped,
    )


def mlperf_share(run: Inputs, p: RunPlan) -> None:
    """An MLPerf run under torchrun: the first rank of every host judges that host's share
    (bench.run.mlperf.host_check: its ranks' memory, its first target's room for all their
    checkpoints); a share that does not fit is refused on every rank, naming the host."""
    cfg, w = run.cfg, run.world
    if cfg.mlperf is None or not run.ranked:
        return
    w.agree(
        "the MLPerf share of each host",
        lambda: mlperf.host_check(cfg, host=w.node_rank) if w.local_rank == 0 else None,
    )


def judge(run: Inputs, p: RunPlan) -> RunPlan:
    """`p` with every case's verdict: what it will hold at its peak against what this machine
    has (bench.run.preflight), before the first ceiling and the first state, with each case's
    restore (a restart or fresh), and env.json's `preflight` block. Under torchrun every rank
    judges its own shard against its node's share of host memory, and a case refused on one
    rank is refused on all."""
    cfg, w = run.cfg, run.world
    cuda = run.device.is_cuda
    local = 1
    if run.ranked:
        local = sum(1 for t in p.table if t["node_rank"] == w.node_rank)
    avail = preflight.host_available() // local - preflight.HEADROOM
    gpu = preflight.device_free(run.device)
    verdicts: dict[tuple[str, str, str], preflight.Verdict] = {}
    for g in p.groups:
        names = plan.engines_at(cfg, p.engines, g.n)
        for wl in p.workloads:
            total = None
            if run.ranked and wl.model is None and wl.mlperf is None:
                item = DTYPES[cfg.dtype]
                total = dist.shard_bytes(wl.total_bytes, g.k, 0, item, run.spec.shard)
            size = wl.size(cfg, cuda, g.n, total, rank=w.rank)
            extra = {}
            if cfg.ceilings.enabled and cfg.ceilings.probes and not run.ranked:
                extra["copy probe"] = 2 * min(size.nbytes, PROBE_COPY_BYTES)
            case = f"{wl.id} x{g.n}"
            # the options the run will create the engines with, resolved once
            judged = preflight.judge(
                case, names, size, dict(p.options), avail, gpu, extra, cfg.restore
            )
            for v in judged:
                verdicts[(wl.id, g.key, v.engine)] = v
    if run.ranked:  # refused anywhere, refused everywhere
        refused = {
            (wid, gkey, e)
            for got in w.all_gather(
                [k for k, v in verdicts.items() if v.restore is None], "the preflight"
            )
            for wid, gkey, e in got
        }
        for k in refused:
            if verdicts[k].restore is not None:
                verdicts[k] = preflight.Verdict(k[2], None, f"{k[0]} {k[2]}: refused on a rank")
    block = {
        "host_available_bytes": avail + preflight.HEADROOM,
        "headroom_bytes": preflight.HEADROOM,
        "gpu_free_bytes": gpu,
        "memlock_bytes": preflight.memlock_limit(),
        "cases": {
            f"{wid} {gkey} {e}": {
                "restore": v.restore,
                "host_peak_bytes": v.host_need,
                **({"refused": v.why} if v.restore is None else {}),
            }
            for (wid, gkey, e), v in verdicts.items()
        },
    }
    return dataclasses.replace(p, verdicts=verdicts, preflight=block)


def refuse(run: Inputs, p: RunPlan) -> None:
    """The preflight's refusals: with `on_error: stop`, or when no case fits, the run is
    refused (UserError, exit 2); else each case refused is skipped and said in the notes."""
    cfg, core = run.cfg, run.core
    bad = [v.why for v in p.verdicts.values() if v.restore is None]
    if bad and (cfg.on_error == "stop" or len(bad) == len(p.verdicts)):
        raise UserError(bad[0] + (f" (and {len(bad) - 1} more cases)" if len(bad) > 1 else ""))
    for why in bad:
        core.note(f"case skipped: {why}")
        core.warn(f"skipped: {why}")
    for (wid, gkey, e), v in p.verdicts.items():
        if v.restore == "restart" and cfg.restore == "auto":
            core.note(
                f"{wid} {gkey} {e}: restored as a restart (a second copy of the state does "
                "not fit in host memory for a fresh restore), checked against the source's "
                "fingerprints"
            )


def check_targets(run: Inputs, p: RunPlan) -> list[dict[str, list[str]]]:
    """Every rank's targets checked (`_check_targets`, agreed by all), and every rank's own
    target directories per group (env.json's ranks block)."""
    w = run.world
    w.agree("the target check", lambda: _check_targets(run, p))
    paths = {g.key: got[0] for g in p.groups if (got := p.my_targets(g, w.rank))}
    return w.all_gather(paths, "the target check")


def _check_targets(run: Inputs, p: RunPlan) -> None:
    """This rank's preflight: its targets (and subfolders) exist, are writable and take
    O_DIRECT where needed; the first rank of each node checks their free space."""
    cfg, w = run.cfg, run.world
    if not cfg.targets:
        for t in p.targets:
            os.makedirs(t, exist_ok=True)
    mine: list[str] = []
    for g in p.groups:
        got = p.my_targets(g, w.rank)
        if got is None:
            continue
        if p.layout[g.key][w.rank][1]:
            for d in got[0]:
                os.makedirs(d, exist_ok=True)
        mine += [d for d in got[0] if d not in mine]
    if w.local_rank == 0:
        first = p.targets[: max(cfg.ssd_counts)]
        run.core.check_dirs(first, p.engines)
        # ranks that each save a whole total: as many at once as are active on this node
        on_node = max(
            sum(1 for t in p.table[: g.k] if t["node_rank"] == w.node_rank) if p.table else g.k
            for g in p.groups
        )
        scale = max(on_node, 1) if run.spec.shard == "per_rank" else 1
        plan.check_space(cfg, p.targets, p.workloads, p.engines, scale)
    run.core.check_dirs(mine, p.engines)


def open_run(run: Inputs, p: RunPlan) -> frozenset[tuple[str, bool, int]]:
    """The run directory: rank 0 opens it, new or resumed (bench.run.core.Core.open), and every
    rank learns of it and of the rows it already holds."""
    w, core = run.world, run.core

    def opened() -> dict[str, Any] | None:  # rank 0 opens it; the others learn of it
        if w.rank != 0:
            return None
        if run.ranked and core.resume:
            dist.check_resume_world(core.resume, w.size)
        done = core.open(
            config_mod.resolved(run.cfg),
            p.targets[: max(run.cfg.ssd_counts)],
            p.engines,
            ranked=run.ranked,
        )
        return {"run_id": core.run_id, "run_dir": core.run_dir, "done": done}

    head = w.agree("the run directory", opened)
    head = w.all_gather(head, "the run directory")[0]
    assert head is not None  # rank 0's
    core.run_id, core.run_dir = head["run_id"], head["run_dir"]
    return frozenset(head["done"])


def page_cache(run: Inputs, p: RunPlan) -> tuple[list[dict[str, Any] | None], bool]:
    """What the first rank of each node found (its targets' storage, and whether it could drop
    the page cache: None, or why not), and whether this rank's node drops the page cache
    between cases. A node that cannot is said in the notes."""
    cfg, w, core = run.cfg, run.world, run.core

    def probe() -> dict[str, Any] | None:
        if w.local_rank != 0:
            return None
        return {
            "env": env_mod.node_info(),
            "storage": env_mod.targets_info(p.targets[: max(cfg.ssd_counts)]),
            "cache_drop": measure.drop_page_cache(),
        }

    nodes = w.all_gather(w.agree("the environment", probe), "the environment")
    drops = {
        (p.table[r]["node_rank"] if run.ranked else 0): n["cache_drop"]
        for r, n in enumerate(nodes)
        if n
    }
    for node, why in sorted(drops.items()):
        if why:
            where = f"node {node}: " if run.ranked else ""
            core.note(f"{where}page cache not dropped between cases: {why}")
            core.warn(f"warning: {why}")
    return nodes, drops.get(w.node_rank) is None
