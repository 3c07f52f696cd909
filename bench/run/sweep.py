"""A sweep: config -> cases -> engine saves -> rows in results/<run-id>/, on one rank alone or on
every rank of a torchrun job, through one case loop on the run core (bench.run.core).

Decide, then run: the run's plan is decided whole and frozen first (bench.run.decide), and every
step after it reads that plan and changes nothing in it.

For each group of targets (bench.run.plan: SSD count; under torchrun also the mapping of ranks
to targets and how many ranks checkpoint at once), for each workload: build the state (a rank's
shard of it under torchrun), warm every engine for it outside the timed region, drop the page
cache (root), then run the repetitions with the engines alternating, warm-ups first and flagged.
Each repetition: every rank passes a barrier, the active ones save and wait until durable, pass a
second barrier, evict the checkpoint's pages, restore, compare with the source byte for byte, and
delete it; the rows are gathered to rank 0, which writes them (plus, under torchrun, one
aggregate row) and flushes them to disk before the next save. With one process the barriers and
the gather do nothing (bench.run.core.LocalWorld).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from bench.common import sizes
from bench.config import sweep as config_mod
from bench.measure import floor, hostcost, results
from bench.measure.ceilings import Ceilings
from bench.measure.efficiency import rejudge_csv
from bench.run import decide, plan, rows
from bench.run import distributed as dist
from bench.run.cases import CaseRunner
from bench.run.ceiling_runs import CeilingRunner
from bench.run.core import Core, World
from bench.run.mlperf import mlperf_block
from bench.run.plan import RunPlan

if TYPE_CHECKING:
    from bench.common.devices import Device


class Sweep:
    """Runs one sweep config as this rank: rank 0 of 1, or one rank of a torchrun job
    (`world` from bench.run.distributed, `ranked`: per-rank and aggregate rows), as a pipeline
    over a frozen plan: decide it whole (bench.run.decide: the cases, their verdicts, the
    targets checked, the run directory opened, the page-cache policy), then record the
    environment and the ceilings (bench.run.ceiling_runs), run the cases (bench.run.cases)
    and finish the run's files."""

    def __init__(
        self,
        cfg: config_mod.Config,
        device: Device,
        out_root: str,
        *,
        world: World | None = None,
        ranked: bool = False,
        quiet: bool = False,
        resume: str | None = None,
        preflight_only: bool = False,
        tuned: dict[str, Any] | None = None,
    ) -> None:
        self.cfg = cfg
        self.tuned = tuned  # env.json `tuned`: the profile `run --tuned` applied (bench.run.tune)
        self.device = device
        self.preflight_only = preflight_only  # judge every case, then stop (`run --preflight`)
        self.core = Core(cfg, device, out_root, world=world, quiet=quiet, resume=resume)
        self.world = self.core.world
        self.ranked = ranked
        self.spec = cfg.ranks or config_mod.RanksSpec(nproc=self.world.size)
        self.plan: RunPlan | None = None  # decided by run(), then never changed
        self.ceilings: Ceilings | None = None  # measured by run(), or kept by the run resumed
        # across hosts: each host's ceilings (env.json ranks.nodes[N].ceilings), and what judges
        # an aggregate row: the run's ceilings, or every host's (against their sum)
        self.host_ceilings: dict[int, Any] = {}
        self.judges: rows.Judges = None
        self.host = hostcost.Host()  # measured in run()

    @property
    def run_dir(self) -> str | None:
        return self.core.run_dir

    @property
    def run_id(self) -> str:
        return self.core.run_id

    @property
    def failures(self) -> int:
        return self.core.failures

    @property
    def notes(self) -> list[str]:
        return self.core.notes

    @property
    def cache_dropped(self) -> bool:
        """Whether the page cache is dropped between this rank's cases (root on its node)."""
        return self.plan is not None and self.plan.cache_dropped

    @property
    def preflight_block(self) -> dict[str, Any]:
        """env.json `preflight`: every case's verdict and what it was judged against."""
        return dict(self.plan.preflight) if self.plan is not None else {}

    def run(self) -> str:
        """The sweep, step by step; its run directory ("" after `preflight_only`)."""
        inputs = decide.Inputs(self.cfg, self.spec, self.world, self.device, self.core, self.ranked)
        the_plan = self.plan = decide.decide(inputs, preflight_only=self.preflight_only)
        if self.preflight_only:
            return ""
        ctx = dist.RankContext(self.cfg, self.spec, self.world, self.device, self.core, the_plan)
        probes = CeilingRunner(self.cfg, self.device, self.core, the_plan)
        self._environment(the_plan)
        self.ceilings = self._ceilings(the_plan, probes)
        self._write_environment(the_plan, ctx)
        self.host = self._host_at_rest()
        self._floor(the_plan)
        n_saves = self._announce(the_plan)
        try:
            self._cases(the_plan, ctx, probes, n_saves)
        finally:
            probes.release()
            self.host.close()
            self.core.close()
        self._finish()
        return self.core.run_dir or ""

    def _environment(self, the_plan: RunPlan) -> None:
        """The notes on how the run's machine may colour its numbers, and env.json's
        `preflight`, `mlperf` and `tuned` blocks."""
        cfg, w, core = self.cfg, self.world, self.core
        nodes = len({t["node_rank"] for t in the_plan.table}) or 1
        if self.ranked and w.size != self.spec.nproc * nodes:
            per = f" on each of {nodes} nodes" if nodes > 1 else ""
            core.note(f"ranks.nproc is {self.spec.nproc}{per}, torchrun started {w.size} ranks")
        if w.rank != 0:
            return
        envb = core.env
        if envb["storage"]["shared_device"]:
            core.note(
                "all targets share one device: SSD-count scaling on this run is not real scaling"
            )
        if envb.get("vm", {}).get("memory_balloon"):
            core.note(
                "a VM with a memory balloon: memory touched afresh (new page-cache pages) may "
                "pay a host fault per page, which slows the buffered paths (cpu-double, "
                "baselines)"
            )
        if "pageout" in (envb.get("vm", {}).get("damon") or []):
            core.note(
                "the kernel's DAMON pages out cold memory in the background (a pageout "
                "scheme): page-cache rates and a restore of older files may move with it"
            )
        envb["preflight"] = dict(the_plan.preflight)
        if self.tuned is not None:
            envb["tuned"] = self.tuned
        if cfg.mlperf is not None:
            envb["mlperf"] = {**envb.get("mlperf", {}), **mlperf_block(cfg)}

    def _ceilings(self, the_plan: RunPlan, probes: CeilingRunner) -> Ceilings | None:
        """The device ceilings this rank judges its rows against, as env.json keeps them, as
        analysis will read them: measured now (unless the run resumed kept them) by rank 0, or
        across hosts by the first rank of every host on its own targets (env.json
        `ranks.nodes[N].ceilings`; `ceilings` is host 0's), the other ranks waiting."""
        cfg, w, core = self.cfg, self.world, self.core
        envb = core.env
        hosts = {t["node_rank"] for t in the_plan.table}
        per_host = len(hosts) > 1
        resumed = w.all_gather("ceilings" in envb if w.rank == 0 else None, "the ceilings")[0]
        measures = (w.local_rank == 0) if per_host else (w.rank == 0)
        measure_now = cfg.ceilings.enabled and measures and not resumed
        measured = w.agree(
            "the ceilings",
            (lambda: probes.measure(the_plan.workloads)) if measure_now else (lambda: None),
            timeout_s=dist.SETUP_TIMEOUT_S,
        )
        got = w.all_gather(measured.to_json() if measured else None, "the ceilings")
        kept: tuple[Any, dict[int, Any]] | None = None
        if w.rank == 0:
            if got[0] is not None:
                envb["ceilings"] = got[0]
                envb.pop("ceilings_error", None)
            if per_host:  # measured now, or by the run resumed
                was = envb.get("ranks", {}).get("nodes", {})
                for r, c in enumerate(got):
                    n = the_plan.table[r]["node_rank"]
                    c = c or was.get(str(n), {}).get("ceilings")
                    if c and n not in self.host_ceilings:
                        self.host_ceilings[n] = c
            kept = (envb.get("ceilings"), self.host_ceilings)
        # Every rank judges against what env.json keeps, as analysis will.
        run_c, self.host_ceilings = w.all_gather(kept, "the ceilings")[0] or (None, {})
        mine = self.host_ceilings.get(w.node_rank) if per_host else run_c
        if per_host:
            every = [Ceilings.from_json(c) for c in self.host_ceilings.values()]
            self.judges = every if len(every) == len(hosts) else None
        else:
            self.judges = Ceilings.from_json(run_c) if run_c else None
        return Ceilings.from_json(mine) if mine else None

    def _write_environment(self, the_plan: RunPlan, ctx: dist.RankContext) -> None:
        """Rank 0: env.json as it stands before the first save, with the ranks block under
        torchrun (who ran where, on which targets)."""
        if self.world.rank != 0:
            return
        if self.ranked:
            self.core.env["ranks"] = dist.ranks_block(
                ctx, the_plan.nodes, the_plan.paths, self.host_ceilings
            )
        self.core.write_env()

    def _host_at_rest(self) -> hostcost.Host:
        """The host at rest, in this run, before any save: what the saves' host figures take
        away (bench.measure.hostcost). Every rank reads its own node while all of them are
        idle; rank 0 opens the row writers beside it."""
        host = hostcost.Host.measure(self.cfg.host_baseline_s)
        if self.world.rank == 0:
            self.core.env["host_cost"] = host.info()
            self.core.open_writers({"results.csv": results.Row})
        return host

    def _floor(self, the_plan: RunPlan) -> None:
        """Rank 0, with the ceilings: the CPU floor of the run's largest checkpoint on its first
        target (bench.measure.floor), what the report holds each path's CPU per GB against;
        kept from the run resumed."""
        cfg, core, w = self.cfg, self.core, self.world
        now = (
            w.rank == 0
            and cfg.ceilings.enabled
            and "cpu_floor" not in core.env
            and bool(the_plan.workloads and the_plan.targets)
        )

        def measure() -> dict[str, Any] | None:
            if not now:
                return None
            nbytes = max(wl.total_bytes for wl in the_plan.workloads)
            try:
                return floor.measure(the_plan.targets[0], nbytes).to_json()
            except (OSError, ValueError) as e:  # the run goes on; the report says there is none
                core.note(f"the CPU floor could not be measured ({type(e).__name__}: {e})")
                return None

        # every rank waits for rank 0's measurement, as for the ceilings
        got = w.agree("the CPU floor", measure, timeout_s=dist.SETUP_TIMEOUT_S)
        if got is not None:
            core.env["cpu_floor"] = got

    def _announce(self, the_plan: RunPlan) -> int:
        """Say what the run will do (and, for MLPerf, how it was scaled) before the first
        checkpoint; env.json says the sweep is unfinished until it is. The saves planned."""
        cfg, w, core = self.cfg, self.world, self.core
        n_saves = (cfg.warmups + cfg.repetitions) * sum(
            1
            for g in the_plan.groups
            for wl in the_plan.workloads
            for e in plan.engines_at(cfg, the_plan.engines, g.n)
            if the_plan.restore(wl, g, e) is not None
        )
        if self.ranked:
            core.log(
                f"run {core.run_id}: {w.size} ranks, {n_saves} checkpoints (each by up to "
                f"{max(g.k for g in the_plan.groups)} ranks at once) on {self.device.kind}; "
                f"results in {core.run_dir}"
            )
        else:
            done = len(the_plan.done)
            core.log(
                f"run {core.run_id}: {n_saves} saves on {self.device.kind}; results in "
                f"{core.run_dir}" + (f" ({done} already recorded)" if done else "")
            )
        if cfg.mlperf is not None:  # how it was scaled, said before the first checkpoint
            mb = core.env.get("mlperf", {}) if w.rank == 0 else {}
            if mb:
                hosts = f" on {mb['hosts']} hosts" if mb.get("hosts", 1) > 1 else ""
                core.log(
                    f"mlperf: {mb['preset']}, ranks {mb['host_ranks'][0]}-{mb['host_ranks'][-1]} "
                    f"of {mb['world']}{hosts} ({mb['mode']} mode), every rank's bytes x "
                    f"{mb['scale']:g}: "
                    f"{sizes.format_size(mb['host_bytes_run'])} a checkpoint instead of "
                    f"{sizes.format_size(mb['host_bytes_full'])}"
                )
        if w.rank == 0:  # until the sweep ends, env.json says the run is unfinished
            core.env["sweep"] = {"planned_saves": n_saves, "finished": False}
            core.write_env()
        return n_saves

    def _cases(
        self, the_plan: RunPlan, ctx: dist.RankContext, probes: CeilingRunner, n_saves: int
    ) -> None:
        """Every group's cases (bench.run.cases), then the host's baseline and (rank 0) the
        ceilings once more, to say how much they moved during the sweep."""
        w, core = self.world, self.core
        core.progress(n_saves, "ckpt" if self.ranked else "save", len(the_plan.done))
        cases = CaseRunner(
            ctx,
            ranked=self.ranked,
            ceilings=self.ceilings,
            judges=self.judges,
            host=self.host,
            probes=probes,
        )
        for g in the_plan.groups:
            cases.run_group(g)
        after = hostcost.measure_baseline(self.cfg.host_baseline_s, imc=self.host.imc)
        if w.rank == 0:  # the baseline again after the sweep: how much it moved
            core.env["host_cost"]["baseline_after"] = after.to_json()
        w.agree(
            "the ceilings after the sweep",
            (lambda: probes.after(the_plan.workloads, self.ceilings))
            if w.rank == 0
            else (lambda: None),
            timeout_s=dist.SETUP_TIMEOUT_S,
        )

    def _finish(self) -> None:
        """Rank 0: the rows judged again against the run's best ceilings, and env.json says
        the sweep finished."""
        core = self.core
        if self.world.rank != 0 or not core.run_dir:
            return
        # the rows were judged against the ceilings before the sweep; now the run's best
        # (after, probes) are known, the CSV says what the summary and the report say
        n = rejudge_csv(os.path.join(core.run_dir, "results.csv"), core.env)
        if n:
            core.log(f"{n} rows' efficiencies judged again against the run's best ceilings")
        core.env["sweep"]["finished"] = True
        core.write_env()


def summary_lines(run_dir: str, notes: list[str]) -> list[str]:
    """The terminal summary of a sweep: the report's own table (analysis.stats), the ceilings,
    and the notes, so that `run` and `report` never disagree."""
    from analysis import summary

    return summary.terminal(run_dir, notes)
