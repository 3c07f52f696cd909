"""A sweep: config -> cases -> engine saves -> rows in results/<run-id>/, on one rank alone or on
every rank of a torchrun job, through one case loop on the run core (bench.run.core).

For each group of targets (bench.run.plan: SSD count; under torchrun also the mapping of ranks to
targets and how many ranks checkpoint at once), for each workload: build the state (a rank's
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
from typing import Any

from bench.common import sizes
from bench.common.errors import UserError
from bench.common.schema import DTYPES
from bench.config import sweep as config_mod
from bench.measure import env as env_mod
from bench.measure import hostcost, results
from bench.measure import timers as measure
from bench.measure.ceilings import Ceilings
from bench.measure.ceilings.measure import PROBE_COPY_BYTES
from bench.measure.efficiency import rejudge_csv
from bench.run import distributed as dist
from bench.run import plan, preflight
from bench.run.cases import CaseRunner
from bench.run.ceiling_runs import CeilingRunner
from bench.run.core import Core
from bench.run.mlperf import mlperf_block


class Sweep:
    """Runs one sweep config as this rank: rank 0 of 1, or one rank of a torchrun job
    (`world` from bench.run.distributed, `ranked`: per-rank and aggregate rows). It decides the
    run's plan (bench.run.plan.RunPlan), judges it (bench.run.preflight), opens the run
    directory and its environment, has the ceilings measured (bench.run.ceiling_runs) and the
    cases run (bench.run.cases), and finishes the run's files."""

    def __init__(
        self,
        cfg: config_mod.Config,
        device: Any,
        out_root: str,
        *,
        world: Any = None,
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
        self.plan = plan.RunPlan([], [], [], {}, [], {})  # decided in run()
        self.ctx = dist.RankContext(cfg, self.spec, self.world, device, self.core, self.plan)
        self.ceiling_runs = CeilingRunner(cfg, device, self.core, self.plan)
        self.preflight_block: dict[str, Any] = {}  # env.json `preflight`
        self.ceilings: Ceilings | None = None
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
        return self.ctx.cache_dropped

    def _decide(self) -> None:
        """The run's plan: its targets, workloads, groups (with the ranks' table and layout
        under torchrun), the engines that can run here and their options, resolved once."""
        cfg, w, the_plan = self.cfg, self.world, self.plan
        the_plan.targets = cfg.resolved_targets()
        the_plan.workloads = plan.workloads(cfg)
        if self.ranked:
            w.barrier("the start")
            dist.same_config(cfg, w)
            me = {
                "rank": w.rank,
                "local_rank": w.local_rank,
                "node_rank": w.node_rank,
                "host": w.host,
                "pid": os.getpid(),
                "device": str(self.device.torch_device),
            }
            the_plan.table = w.all_gather(me, "the rank table")
            the_plan.groups, the_plan.layout, skipped = dist.plan_groups(
                cfg, self.spec, w.size, the_plan.table
            )
            the_plan.skipped_groups = skipped
            for s in skipped:
                self.core.note(s)
        else:
            the_plan.groups = plan.local_groups(cfg)
            the_plan.layout = {g.key: [(list(range(g.n)), False)] for g in the_plan.groups}
        the_plan.engines = self.core.runnable(cfg.engines)
        the_plan.options = plan.resolved_engine_options(cfg, the_plan.engines)

    def run(self) -> str:
        cfg, w, core, the_plan = self.cfg, self.world, self.core, self.plan
        self._decide()
        wls = the_plan.workloads
        self._preflight(wls)
        if self.preflight_only:
            return ""
        w.agree("the target check", lambda: self._check_targets(wls))
        paths = {g.key: got[0] for g in the_plan.groups if (got := the_plan.my_targets(g, w.rank))}
        paths_all = w.all_gather(paths, "the target check")

        def opened() -> dict[str, Any] | None:  # rank 0 opens it; the others learn of it
            return self._open() if w.rank == 0 else None

        head = w.agree("the run directory", opened)
        head = w.all_gather(head, "the run directory")[0]
        core.run_id, core.run_dir = head["run_id"], head["run_dir"]
        the_plan.done = {tuple(x) for x in head["done"]}
        self._environment(wls, paths_all)
        # The host at rest, in this run, before any save: what the saves' host figures take
        # away (bench.measure.hostcost). Every rank reads its own node while all of them are idle.
        self.host = hostcost.Host.measure()
        if w.rank == 0:
            core.env["host_cost"] = self.host.info()
            core.open_writers({"results.csv": results.Row})
        n_saves = (cfg.warmups + cfg.repetitions) * sum(
            1
            for g in the_plan.groups
            for wl in wls
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
                core.log(
                    f"mlperf: {mb['preset']}, ranks {mb['host_ranks'][0]}-{mb['host_ranks'][-1]} "
                    f"of {mb['world']} ({mb['mode']} mode), every rank's bytes x {mb['scale']:g}: "
                    f"{sizes.format_size(mb['host_bytes_run'])} a checkpoint instead of "
                    f"{sizes.format_size(mb['host_bytes_full'])}"
                )
        if w.rank == 0:  # until the sweep ends, env.json says the run is unfinished
            core.env["sweep"] = {"planned_saves": n_saves, "finished": False}
            core.write_env()
        core.progress(n_saves, "ckpt" if self.ranked else "save", len(the_plan.done))
        cases = CaseRunner(
            cfg,
            self.device,
            core,
            the_plan,
            self.ctx,
            ranked=self.ranked,
            ceilings=self.ceilings,
            host=self.host,
            probes=self.ceiling_runs,
        )
        try:
            for g in the_plan.groups:
                cases.run_group(g)
            after = hostcost.measure_baseline(imc=self.host.imc)
            if w.rank == 0:  # the baseline again after the sweep: how much it moved
                core.env["host_cost"]["baseline_after"] = after.to_json()
            w.agree(
                "the ceilings after the sweep",
                (lambda: self.ceiling_runs.after(wls, self.ceilings))
                if w.rank == 0
                else (lambda: None),
                timeout_s=dist.SETUP_TIMEOUT_S,
            )
        finally:
            self.ceiling_runs.release()
            self.host.close()
            core.close()
        if w.rank == 0 and core.run_dir:
            # the rows were judged against the ceilings before the sweep; now the run's best
            # (after, probes) are known, the CSV says what the summary and the report say
            n = rejudge_csv(os.path.join(core.run_dir, "results.csv"), core.env)
            if n:
                core.log(f"{n} rows' efficiencies judged again against the run's best ceilings")
            core.env["sweep"]["finished"] = True
            core.write_env()
        return core.run_dir or ""

    def _preflight(self, wls: list[plan.Workload]) -> None:
        """What every case will hold at its peak against what this machine has
        (bench.run.preflight), before the first ceiling and the first state: the plan's verdicts, with
        each case's restore (a restart or fresh). A case that cannot fit is refused in one line:
        with `on_error: stop`, or when no case fits, the run is (exit 2); else that case is
        skipped and said in the notes. Under torchrun every rank judges its own shard against
        its node's share of host memory, and a case refused on one rank is refused on all."""
        cfg, w, core, the_plan = self.cfg, self.world, self.core, self.plan
        cuda = self.device.is_cuda
        local = 1
        if self.ranked:
            local = sum(1 for t in the_plan.table if t["node_rank"] == w.node_rank)
        avail = preflight.host_available() // local - preflight.HEADROOM
        gpu = preflight.device_free(self.device)
        verdicts: dict[tuple[str, str, str], preflight.Verdict] = {}
        for g in the_plan.groups:
            names = plan.engines_at(cfg, the_plan.engines, g.n)
            for wl in wls:
                total = None
                if self.ranked and wl.model is None and wl.mlperf is None:
                    item = DTYPES[cfg.dtype]
                    total = dist.shard_bytes(wl.total_bytes, g.k, 0, item, self.spec.shard)
                size = wl.size(cfg, cuda, g.n, total, rank=w.rank)
                extra = {}
                if cfg.ceilings.enabled and cfg.ceilings.probes and not self.ranked:
                    extra["copy probe"] = 2 * min(size.nbytes, PROBE_COPY_BYTES)
                case = f"{wl.id} x{g.n}"
                # the options the run will create the engines with, resolved once
                judged = preflight.judge(
                    case, names, size, the_plan.options, avail, gpu, extra, cfg.restore
                )
                for v in judged:
                    verdicts[(wl.id, g.key, v.engine)] = v
        if self.ranked:  # refused anywhere, refused everywhere
            refused = {
                k
                for got in w.all_gather(
                    [k for k, v in verdicts.items() if v.restore is None], "the preflight"
                )
                for k in map(tuple, got)
            }
            for k in refused:
                if verdicts[k].restore is not None:
                    verdicts[k] = preflight.Verdict(k[2], None, f"{k[0]} {k[2]}: refused on a rank")
        the_plan.verdicts = verdicts
        self.preflight_block = {
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
        if self.preflight_only:
            return
        bad = [v.why for v in verdicts.values() if v.restore is None]
        if bad and (cfg.on_error == "stop" or len(bad) == len(verdicts)):
            raise UserError(bad[0] + (f" (and {len(bad) - 1} more cases)" if len(bad) > 1 else ""))
        for why in bad:
            core.note(f"case skipped: {why}")
            core.warn(f"skipped: {why}")
        for (wid, gkey, e), v in verdicts.items():
            if v.restore == "restart" and cfg.restore == "auto":
                core.note(
                    f"{wid} {gkey} {e}: restored as a restart (a second copy of the state does "
                    "not fit in host memory for a fresh restore), checked against the source's "
                    "fingerprints"
                )

    def _check_targets(self, wls: list[plan.Workload]) -> None:
        """This rank's preflight: its targets (and subfolders) exist, are writable and take
        O_DIRECT where needed; the first rank of each node checks their free space."""
        cfg, the_plan = self.cfg, self.plan
        if not cfg.targets:
            for t in the_plan.targets:
                os.makedirs(t, exist_ok=True)
        mine: list[str] = []
        for g in the_plan.groups:
            got = the_plan.my_targets(g, self.world.rank)
            if got is None:
                continue
            if the_plan.layout[g.key][self.world.rank][1]:
                for p in got[0]:
                    os.makedirs(p, exist_ok=True)
            mine += [p for p in got[0] if p not in mine]
        if self.world.local_rank == 0:
            first = the_plan.targets[: max(cfg.ssd_counts)]
            self.core.check_dirs(first, the_plan.engines)
            scale = max(g.k for g in the_plan.groups) if self.spec.shard == "per_rank" else 1
            plan.check_space(cfg, the_plan.targets, wls, the_plan.engines, scale)
        self.core.check_dirs(mine, the_plan.engines)

    def _open(self) -> dict[str, Any]:
        """Rank 0: a new run directory (or the one to resume) and the rows it holds."""
        core = self.core
        if self.ranked and core.resume:
            dist.check_resume_world(core.resume, self.world.size)
        core.open(
            config_mod.resolved(self.cfg),
            self.plan.targets[: max(self.cfg.ssd_counts)],
            self.plan.engines,
        )
        done: list[tuple[str, bool, int]] = []
        if core.resume:
            assert core.run_dir is not None  # the run resumed
            rows_ = results.read_rows(core.run_dir)
            if self.ranked and "aggregate" in rows_:
                rows_ = rows_[rows_["aggregate"].astype(str).str.lower() == "true"]
            done = [(str(r.case_id), bool(r.warmup), int(r.rep)) for r in rows_.itertuples()]
            core.note(f"resumed with {len(done)} rows already recorded")
        return {"run_id": core.run_id, "run_dir": core.run_dir, "done": done}

    def _environment(self, wls: list[plan.Workload], paths_all: list[Any]) -> None:
        """Page cache, notes, ceilings and env.json (with the ranks block under torchrun)."""
        cfg, w, core = self.cfg, self.world, self.core
        node_env = w.agree(
            "the environment",
            lambda: (
                {
                    "storage": env_mod.targets_info(self.plan.targets[: max(cfg.ssd_counts)]),
                    "cache_drop": measure.drop_page_cache(),
                }
                if w.local_rank == 0
                else None
            ),
        )
        nodes = w.all_gather(node_env, "the environment")
        drops = {
            (self.plan.table[r]["node_rank"] if self.ranked else 0): n["cache_drop"]
            for r, n in enumerate(nodes)
            if n
        }
        self.ctx.cache_dropped = self.ceiling_runs.cache_dropped = drops.get(w.node_rank) is None
        for node, why in sorted(drops.items()):
            if why:
                where = f"node {node}: " if self.ranked else ""
                core.note(f"{where}page cache not dropped between cases: {why}")
                core.warn(f"warning: {why}")
        if self.ranked and w.size != self.spec.nproc:
            core.note(f"ranks.nproc is {self.spec.nproc}, torchrun started {w.size} ranks")
        envb = core.env
        if w.rank == 0:
            if envb["storage"]["shared_device"]:
                core.note(
                    "all targets share one device: SSD-count scaling on this run is not real "
                    "scaling"
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
        if w.rank == 0:
            envb["preflight"] = self.preflight_block
            if self.tuned is not None:
                envb["tuned"] = self.tuned
            if cfg.mlperf is not None:
                envb["mlperf"] = {**envb.get("mlperf", {}), **mlperf_block(cfg)}
        measure_now = cfg.ceilings.enabled and w.rank == 0 and "ceilings" not in envb
        measured = w.agree(
            "the ceilings",
            (lambda: self.ceiling_runs.measure(wls)) if measure_now else (lambda: None),
            timeout_s=dist.SETUP_TIMEOUT_S,
        )
        kept = None
        if w.rank == 0:
            if measured is not None:
                envb["ceilings"] = measured.to_json()
                envb.pop("ceilings_error", None)
            kept = envb.get("ceilings")  # measured now, or by the run resumed
        # Every rank judges against what env.json keeps, as analysis will.
        kept = w.all_gather(kept, "the ceilings")[0]
        self.ceilings = Ceilings.from_json(kept) if kept else None
        if w.rank == 0:
            if self.ranked:
                envb["ranks"] = dist.ranks_block(self.ctx, nodes, paths_all)
            core.write_env()


def summary_lines(run_dir: str, notes: list[str]) -> list[str]:
    """The terminal summary of a sweep: the report's own table (analysis.stats), the ceilings,
    and the notes, so that `run` and `report` never disagree."""
    from analysis import summary

    return summary.terminal(run_dir, notes)
