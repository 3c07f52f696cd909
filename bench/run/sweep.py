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

import dataclasses
import gc
import os
import sys
import time
import traceback
from typing import Any

from tqdm import tqdm

from bench.common import sizes
from bench.common.errors import UserError
from bench.common.schema import DTYPES
from bench.config import sweep as config_mod
from bench.engines import REGISTRY
from bench.measure import ceiling, hostcost, results
from bench.measure import env as env_mod
from bench.measure import timers as measure
from bench.measure.ceilings import BUFFERED_WRITE, DIRECT_WRITE, Ceilings, Kind
from bench.measure.clock import Clocked
from bench.measure.efficiency import rejudge_csv
from bench.run import distributed as dist
from bench.run import plan, preflight, rows
from bench.run.core import Core
from bench.storage import verify


class Sweep:
    """Runs one sweep config as this rank: rank 0 of 1, or one rank of a torchrun job
    (`world` from bench.run.distributed, `ranked`: per-rank and aggregate rows)."""

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
    ) -> None:
        self.cfg = cfg
        self.device = device
        self.preflight_only = preflight_only  # judge every case, then stop (`run --preflight`)
        self.core = Core(cfg, device, out_root, world=world, quiet=quiet, resume=resume)
        self.world = self.core.world
        self.ranked = ranked
        self.spec = cfg.ranks or config_mod.RanksSpec(nproc=self.world.size)
        self.faults = dist.faults() if ranked else {}
        self.saves = 0  # saves this rank took part in (fault injection counts them)
        self.verdicts: dict[tuple[str, str, str], preflight.Verdict] = {}
        self._fingerprint: list[tuple[str, str]] | None = None  # the state's, for in-place
        self.preflight_block: dict[str, Any] = {}  # env.json `preflight`
        self.ceilings: Ceilings | None = None
        self._probe_buffers: dict[int, Any] = {}  # the probes' copy buffers, reused
        self.cache_dropped = False
        self.done: set[tuple[str, bool, int]] = set()
        self.host = hostcost.Host()  # measured in run()

    # shortcuts for the CLI and tests
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

    # -- setup ---------------------------------------------------------------------------------

    def run(self) -> str:
        cfg, w, core = self.cfg, self.world, self.core
        self.targets = cfg.resolved_targets()
        wls = plan.workloads(cfg)
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
            self.table = w.all_gather(me, "the rank table")
            self.groups, self.layout, skipped = dist.plan_groups(cfg, self.spec, w.size, self.table)
            self.skipped_groups = skipped
            for s in skipped:
                core.note(s)
        else:
            self.groups = plan.local_groups(cfg)
            self.layout = {g.key: [(list(range(g.n)), False)] for g in self.groups}
        self.engines = core.runnable(cfg.engines)
        self._preflight(wls)
        if self.preflight_only:
            return ""
        w.agree("the target check", lambda: self._check_targets(wls))
        paths = {g.key: got[0] for g in self.groups if (got := self.my_targets(g))}
        paths_all = w.all_gather(paths, "the target check")
        head = w.agree("the run directory", self._open if w.rank == 0 else lambda: None)
        head = w.all_gather(head, "the run directory")[0]
        core.run_id, core.run_dir = head["run_id"], head["run_dir"]
        self.done = {tuple(x) for x in head["done"]}
        self._environment(wls, paths_all)
        # The host at rest, in this run, before any save: what the saves' host figures take
        # away (bench.measure.hostcost). Every rank reads its own node while all of them are idle.
        self.host = hostcost.Host.measure()
        if w.rank == 0:
            core.env["host_cost"] = self.host.info()
            core.open_writers({"results.csv": results.Row})
        n_saves = (cfg.warmups + cfg.repetitions) * sum(
            1
            for g in self.groups
            for wl in wls
            for e in plan.engines_at(cfg, self.engines, g.n)
            if self.verdicts[(wl.id, g.key, e)].restore is not None
        )
        if self.ranked:
            core.log(
                f"run {core.run_id}: {w.size} ranks, {n_saves} checkpoints (each by up to "
                f"{max(g.k for g in self.groups)} ranks at once) on {self.device.kind}; "
                f"results in {core.run_dir}"
            )
        else:
            core.log(
                f"run {core.run_id}: {n_saves} saves on {self.device.kind}; results in "
                f"{core.run_dir}" + (f" ({len(self.done)} already recorded)" if self.done else "")
            )
        if w.rank == 0:  # until the sweep ends, env.json says the run is unfinished
            core.env["sweep"] = {"planned_saves": n_saves, "finished": False}
            core.write_env()
        core.progress(n_saves, "ckpt" if self.ranked else "save", len(self.done))
        try:
            for g in self.groups:
                self._run_group(g, wls)
            after = hostcost.measure_baseline(imc=self.host.imc)
            if w.rank == 0:  # the baseline again after the sweep: how much it moved
                core.env["host_cost"]["baseline_after"] = after.to_json()
            w.agree(
                "the ceilings after the sweep",
                (lambda: self._ceilings_after(wls)) if w.rank == 0 else (lambda: None),
                timeout_s=dist.SETUP_TIMEOUT_S,
            )
        finally:
            ceiling.release(self._probe_buffers)
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
        (bench.run.preflight), before the first ceiling and the first state: `self.verdicts`, with
        each case's restore (fresh or in place). A case that cannot fit is refused in one line:
        with `on_error: stop`, or when no case fits, the run is (exit 2); else that case is
        skipped and said in the notes. Under torchrun every rank judges its own shard against
        its node's share of host memory, and a case refused on one rank is refused on all."""
        cfg, w, core = self.cfg, self.world, self.core
        cuda = self.device.is_cuda
        local = 1
        if self.ranked:
            local = sum(1 for t in self.table if t["node_rank"] == w.node_rank)
        avail = preflight.host_available() // local - preflight.HEADROOM
        gpu = preflight.device_free(self.device)
        opts = config_mod.resolved(cfg)["engine_options"]
        verdicts: dict[tuple[str, str, str], preflight.Verdict] = {}
        for g in self.groups:
            names = plan.engines_at(cfg, self.engines, g.n)
            for wl in wls:
                total = None
                if self.ranked and wl.model is None:
                    item = DTYPES[cfg.dtype]
                    total = dist.shard_bytes(wl.total_bytes, g.k, 0, item, self.spec.shard)
                size = wl.size(cfg, cuda, g.n, total)
                extra = {}
                if cfg.ceilings.enabled and cfg.ceilings.probes and not self.ranked:
                    extra["copy probe"] = 2 * min(size.nbytes, ceiling.PROBE_COPY_BYTES)
                case = f"{wl.id} x{g.n}"
                for v in preflight.judge(case, names, size, opts, avail, gpu, extra, cfg.restore):
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
        self.verdicts = verdicts
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
            if v.restore == "in-place" and cfg.restore == "auto":
                core.note(
                    f"{wid} {gkey} {e}: restored in place (a second copy of the state does not "
                    "fit in host memory) and checked against the source's fingerprints"
                )

    def my_targets(self, g: plan.Group) -> tuple[list[str], list[int]] | None:
        """This rank's target directories for group g and their indices in the config's
        targets (None: it does not checkpoint in this group)."""
        if self.world.rank >= g.k:
            return None
        idx, sub = self.layout[g.key][self.world.rank]
        paths = [self.targets[i] for i in idx]
        if sub:
            paths = [os.path.join(p, f"rank-{self.world.rank}") for p in paths]
        return paths, idx

    def _check_targets(self, wls: list[plan.Workload]) -> None:
        """This rank's preflight: its targets (and subfolders) exist, are writable and take
        O_DIRECT where needed; the first rank of each node checks their free space."""
        cfg = self.cfg
        if not cfg.targets:
            for t in self.targets:
                os.makedirs(t, exist_ok=True)
        mine: list[str] = []
        for g in self.groups:
            got = self.my_targets(g)
            if got is None:
                continue
            if self.layout[g.key][self.world.rank][1]:
                for p in got[0]:
                    os.makedirs(p, exist_ok=True)
            mine += [p for p in got[0] if p not in mine]
        if self.world.local_rank == 0:
            first = self.targets[: max(cfg.ssd_counts)]
            self.core.check_dirs(first, self.engines)
            scale = max(g.k for g in self.groups) if self.spec.shard == "per_rank" else 1
            plan.check_space(cfg, self.targets, wls, self.engines, scale)
        self.core.check_dirs(mine, self.engines)

    def _open(self) -> dict[str, Any]:
        """Rank 0: a new run directory (or the one to resume) and the rows it holds."""
        core = self.core
        if self.ranked and core.resume:
            dist.check_resume_world(core.resume, self.world.size)
        core.open(
            config_mod.resolved(self.cfg), self.targets[: max(self.cfg.ssd_counts)], self.engines
        )
        done: list[tuple[str, bool, int]] = []
        if core.resume:
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
                    "storage": env_mod.targets_info(self.targets[: max(cfg.ssd_counts)]),
                    "cache_drop": measure.drop_page_cache(),
                }
                if w.local_rank == 0
                else None
            ),
        )
        nodes = w.all_gather(node_env, "the environment")
        drops = {
            (self.table[r]["node_rank"] if self.ranked else 0): n["cache_drop"]
            for r, n in enumerate(nodes)
            if n
        }
        self.cache_dropped = drops.get(w.node_rank) is None
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
        measure_now = cfg.ceilings.enabled and w.rank == 0 and "ceilings" not in envb
        measured = w.agree(
            "the ceilings",
            (lambda: self._ceilings(wls)) if measure_now else (lambda: None),
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
                envb["ranks"] = dist.ranks_block(self, nodes, paths_all)
            core.write_env()

    def _ceilings(self, wls: list[plan.Workload], again: Ceilings | None = None) -> Ceilings | None:
        """The device ceilings for this sweep (bench.measure.ceiling); `again`: the ceilings measured
        before, whose configurations are measured once more (after the sweep). When a probe
        cannot finish (a full disk, fio failing) None: a ceiling is a reference, not the
        benchmark, so that is said loudly in the notes and the engines still run, without
        efficiency columns."""
        cfg, core = self.cfg, self.core
        try:
            spec = cfg.ceilings
            if spec.tool == "fio" and not ceiling.fio_version():
                raise UserError(
                    "ceilings.tool: fio is not installed (apt-get install fio, or use auto)"
                )
            largest = max((w.total_bytes for w in wls if w.kind == "synthetic"), default=1 << 30)
            tensor = max((w.tensor_bytes for w in wls if w.kind == "synthetic"), default=64 << 20)
            block, threads = self._ceiling_block(), self._copy_threads()
            tool = "fio" if spec.tool != "builtin" and ceiling.fio_version() else "built-in probe"
            when = "after the sweep" if again else "first"
            runs = ceiling.storage_runs(
                cfg.ssd_counts, _grids(spec), spec.repetitions, searched=again is None
            )
            each = ceiling.probe_bytes(largest, spec.min_bytes, spec.max_bytes)
            core.log(
                f"measuring device ceilings {when}: {runs} storage runs with {tool} of "
                f"{sizes.format_size(each)} each, every one cut off after {spec.max_seconds:g} s "
                f"(at most {runs * spec.max_seconds / 60:.1f} min of writing, plus fsync), "
                "then a memory copy"
            )
            drop = measure.drop_page_cache if self.cache_dropped else None
            bar = tqdm(
                total=runs,
                unit="run",
                desc="ceilings",
                file=sys.stderr,
                disable=core.quiet,
                dynamic_ncols=True,
                leave=False,
            )

            def progress(label: str) -> None:
                bar.set_postfix_str(label)
                bar.update(1)

            try:
                out = self._measure_ceilings(
                    spec, largest, block, threads, tensor, drop, again, progress
                )
            finally:
                bar.close()
            if drop:
                drop()
            return out
        except (OSError, RuntimeError, ValueError) as e:
            why = " ".join(str(e).split())[:300]
            core.env["ceilings_error"] = why
            core.note(f"device ceilings not measured: {why}")
            core.warn(f"warning: device ceilings not measured ({why}); no efficiency columns")
            return None

    def _measure_ceilings(
        self,
        spec: Any,
        largest: int,
        block: int,
        threads: int,
        tensor: int,
        drop: Any,
        again: Ceilings | None,
        progress: Any,
    ) -> Ceilings:
        cfg = self.cfg
        return ceiling.measure(
            self.targets,
            cfg.ssd_counts,
            largest,
            block,
            self.device,
            use_fio=spec.tool != "builtin",
            drop=drop,
            caps=cfg.target_caps(),
            repetitions=spec.repetitions,
            min_bytes=spec.min_bytes,
            copy_threads=threads,
            tensor_bytes=tensor,
            configs=again.chosen() if again else None,
            grids=_grids(spec),
            max_bytes=spec.max_bytes,
            max_seconds=spec.max_seconds,
            progress=progress,
        )

    def _ceiling_block(self) -> int:
        """The storage probes' block: the engines' chunk size."""
        opts = config_mod.resolved(self.cfg)["engine_options"]
        return next((o["chunk_bytes"] for o in opts.values() if "chunk_bytes" in o), 16 << 20)

    def _copy_threads(self) -> int:
        """The copy ceiling's threads: as many as the snapshot copies with."""
        opts = config_mod.resolved(self.cfg)["engine_options"]
        threads = next((o["copy_threads"] for o in opts.values() if "copy_threads" in o), 0)
        return threads or min(os.cpu_count() or 1, 8)

    def _ceilings_after(self, wls: list[plan.Workload]) -> None:
        """Rank 0, after the sweep: the ceilings again, kept beside the first; a drift noted."""
        core = self.core
        before = self.ceilings
        if not (self.cfg.ceilings.enabled and self.cfg.ceilings.after and before):
            return
        after = self._ceilings(wls, again=before)
        if after is None:
            return
        core.env["ceilings_after"] = after.to_json()
        for d in before.drift(after):
            core.note(
                f"the disk drifted during the run: {d}; efficiencies use the run's best ceiling"
            )
        core.write_env()

    def _probe(self, g: plan.Group, wl: plan.Workload) -> None:
        """The ceilings once more between this workload's warm-up and timed saves
        (bench.measure.ceiling.probe), into env.json `ceilings_probes`: the model predicts the workload
        from the probes around it. The page cache is not dropped for it: the timed saves that
        follow find it as the warm-ups left it, and so does the probe (on a VM with a memory
        balloon, a buffered write into freshly dropped memory runs at half speed). A probe that
        fails is noted and the sweep goes on."""
        cfg, core = self.cfg, self.core
        chosen = self.ceilings.chosen().get(g.n) if self.ceilings else None
        if self.ranked or not (cfg.ceilings.enabled and cfg.ceilings.probes and chosen):
            return
        paths, idx = self.my_targets(g) or ([], [])
        if not paths:
            return
        caps = cfg.target_caps()
        t0 = time.perf_counter_ns()
        try:
            got = ceiling.probe(
                paths,
                wl.total_bytes,
                self._ceiling_block(),
                self.device,
                chosen,
                use_fio=cfg.ceilings.tool != "builtin",
                caps=[caps[i] for i in idx],
                copy_threads=self._copy_threads(),
                keep=self._probe_buffers,
                max_bytes=cfg.ceilings.max_bytes,
                max_seconds=cfg.ceilings.max_seconds,
            )
        except (OSError, RuntimeError, ValueError) as e:
            why = " ".join(str(e).split())[:200]
            core.note(f"the probe of {wl.id} over {g.n} target(s) failed: {why}")
            return
        got = dataclasses.replace(
            got,
            workload=wl.id,
            unix_time=round(time.time(), 1),
            seconds=round((time.perf_counter_ns() - t0) / 1e9, 2),
        )
        core.env.setdefault("ceilings_probes", []).append(got.to_json())
        core.write_env()

    # -- cases ---------------------------------------------------------------------------------

    def _run_group(self, g: plan.Group, wls: list[plan.Workload]) -> None:
        cfg, w = self.cfg, self.world
        names = plan.engines_at(cfg, self.engines, g.n)
        mine = self.my_targets(g)
        caps = cfg.target_caps()

        def make() -> dict[str, Any]:
            if mine is None:
                return {}
            paths, idx = mine
            return {e: self.core.create(e, paths, [caps[i] for i in idx]) for e in names}

        engines = w.agree(f"the engines of {g.key}", make)
        try:
            for wl in wls:
                todo = [
                    (i, e)
                    for i in range(cfg.warmups + cfg.repetitions)
                    for e in names
                    if plan.case_key(wl, g, e, i, cfg.warmups) not in self.done
                    and self.verdicts[(wl.id, g.key, e)].restore is not None
                ]
                if not todo:
                    continue
                if self.core.bar is not None:
                    self.core.bar.set_description(f"{wl.id} {g.key}")
                for eng in engines.values():  # what is held is what the preflight counted
                    eng.release()
                # The last workload's cyclic garbage (a library's restored copy of its state)
                # goes before the next state is built, not after.
                gc.collect()
                admitted = {
                    e: eng
                    for e, eng in engines.items()
                    if self.verdicts[(wl.id, g.key, e)].restore is not None
                }
                short = w.agree(
                    f"the memory for {wl.id}", lambda wl=wl, g=g: self._memory_now(wl, g)
                )
                if short:
                    if cfg.on_error == "stop":
                        raise UserError(short)
                    self.core.note(f"workload skipped: {short}")
                    self.core.warn(f"skipped: {short}")
                    continue
                state = w.agree(
                    f"the state of {wl.id}",
                    lambda wl=wl, admitted=admitted: self._build(wl, g, admitted),
                )
                if self.cache_dropped and w.local_rank == 0:
                    measure.drop_page_cache()
                probed = False
                for i, e in todo:
                    if not probed and i >= cfg.warmups:
                        # after the warm-ups, in the conditions of the timed saves
                        self._probe(g, wl)
                        probed = True
                    if not self._case(g, wl, e, admitted.get(e), state, i):
                        # a restore in place that did not verify left wrong bytes in the state
                        del state
                        state = w.agree(
                            f"the state of {wl.id}",
                            lambda wl=wl, admitted=admitted: self._build(wl, g, admitted),
                        )
                del state
                self._fingerprint = None
        finally:
            for eng in engines.values():
                eng.close()

    def _memory_now(self, wl: plan.Workload, g: plan.Group) -> str | None:
        """Whether this workload's state and its engines' staging still fit in the host memory
        available now (another process may have taken some since the preflight): None, or why
        not, in one line. Never leave that to the kernel's OOM killer."""
        if self.device.is_cuda or self.world.rank >= g.k:
            return None
        cases = [v for (wid, gkey, _), v in self.verdicts.items() if (wid, gkey) == (wl.id, g.key)]
        need = max((v.host_need for v in cases if v.restore is not None), default=0)
        have = preflight.host_available() - preflight.HEADROOM // 2
        if need <= have:
            return None
        return (
            f"{wl.id} x{g.n}: host memory: its cases need up to {sizes.format_size(need)}, "
            f"{sizes.format_size(have)} is available now (less than at the start of the run: "
            "another process took memory); way out: rerun when it is free, or a smaller size"
        )

    def _build(self, wl: plan.Workload, g: plan.Group, engines: dict[str, Clocked]) -> Any:
        """This rank's state (its shard under torchrun) on its device, engines warmed (None:
        not active in this group)."""
        if self.world.rank >= g.k:
            return None
        if self.ranked:
            state = dist.build_shard(self, wl, g)
        else:
            state = wl.build(self.cfg, self.device.torch_device)
        self._fingerprint = None
        if self.cfg.verify and any(
            self.verdicts[(wl.id, g.key, e)].restore == "in-place" for e in engines
        ):
            # what a restore in place is checked against: taken now, before any save
            self._fingerprint = verify.fingerprint(state)
        for eng in engines.values():
            eng.warm(state)
        return state

    def _case(
        self, g: plan.Group, wl: plan.Workload, engine: str, eng: Clocked | None, state: Any, i: int
    ) -> bool:
        """One repetition on every rank: aligned save, aligned restore, rows to rank 0. False
        when a restore in place failed or did not verify: the state may hold its wrong bytes."""
        cfg, w, core = self.cfg, self.world, self.core
        key = plan.case_key(wl, g, engine, i, cfg.warmups)
        case_id, warm, rep = key
        base = plan.checkpoint_name(core.run_id, key)
        name = dist.shard_name(base, w.rank, g.k) if self.ranked else base
        row: results.Row | None = None
        if eng is not None:
            mine = self.my_targets(g)
            assert mine is not None
            caps = cfg.target_caps()
            capped = any(caps[j] for j in mine[1]) and REGISTRY[engine].traits.stripes
            n_tensors, total = rows.tensor_stats(state)
            row = results.Row(
                run_id=core.run_id,
                case_id=case_id,
                engine=engine,
                device=self.device.kind,
                emulated=self.device.emulated,
                workload=wl.id,
                total_bytes=total,
                tensor_bytes=min(wl.tensor_bytes, total) if self.ranked else wl.tensor_bytes,
                n_tensors=n_tensors,
                n_targets=g.n,
                rep=rep,
                warmup=warm,
                cache_dropped=self.cache_dropped,
                dtype=cfg.dtype if wl.model is None else wl.model.dtype,
                options=rows.options_json(eng),
                capped=capped,
                rank=w.rank,
                world_size=w.size,
                node=w.host,
                node_rank=w.node_rank,
                ranks_active=g.k,
                target_map=g.label,
            )
        where = f"{case_id} {'warm-up' if warm else 'rep'} {rep}"
        try:
            w.barrier(f"the save of {where}")
            if row is not None:
                self._save(row, eng, state, name, g)
            w.barrier(f"the restore of {where}")
            if row is not None and not row.error:
                self._restore(row, eng, engine, state, name, base, g)
            w.barrier(f"the rows of {where}")
            got = [r for r in w.all_gather(row, f"the rows of {where}") if r is not None]
        except dist.RankLost as lost:
            if row is not None:
                rows.delete_checkpoint(eng, name, core.warn)
            if w.rank == 0:
                dist.write_lost(self, row, lost, g, wl, engine, key)
            raise
        except KeyboardInterrupt:
            if row is not None:  # the case in flight leaves nothing behind
                rows.delete_checkpoint(eng, name, core.warn)
            raise
        if row is not None:
            rows.delete_checkpoint(eng, name, core.warn)
        if core.bar is not None:
            core.bar.update(1)
        bad = rows.fail_together(got, cfg.verify)
        core.write(got)
        if self.ranked:
            core.write([rows.aggregate(got, self.ceilings)])
        if bad is not None:
            on = f" on rank {bad.rank}" if self.ranked else ""
            core.failed(
                f"case {case_id} rep {rep}{on}",
                bad.error,
                case_id if not self.ranked else f"{case_id}, rank {bad.rank}",
            )
        return not (
            row is not None
            and row.restore_into == "in-place"
            and bool(row.error or (cfg.verify and not row.verified))
        )

    def _save(self, row: results.Row, eng: Clocked, state: Any, name: str, g: plan.Group) -> None:
        fault = self.faults.get((self.world.rank, self.saves))
        try:
            hook = dist.inject(fault, self.world.rank, self.saves) if fault else None
            rows.save_phase(row, eng, state, name, self.ceilings, after_save=hook, host=self.host)
            if g.k > 1:  # the ceilings are the whole device's: see the aggregate row
                row.write_efficiency = row.snapshot_efficiency = None
                row.ceiling_beaten = False
        except Exception as e:  # reported on every rank (fail_together)
            row.error = rows.error_text(e)
            if not isinstance(e, UserError | OSError):
                self.core.warn(traceback.format_exc())
        self.saves += 1

    def _restore(
        self,
        row: results.Row,
        eng: Clocked,
        engine: str,
        state: Any,
        name: str,
        base: str,
        g: plan.Group,
    ) -> None:
        w = self.world
        load = (
            (
                lambda n, device, checksums=True, into=None: dist.load_shard(
                    eng, base, w.rank, g.k, device, checksums, into
                )
            )
            if self.ranked
            else None
        )
        in_place = self.verdicts[(row.workload, g.key, engine)].restore == "in-place"
        try:
            rows.restore_phase(
                row,
                eng,
                engine,
                state,
                name,
                self.device,
                self.cfg.verify,
                load=load,
                fingerprint=(self._fingerprint or []) if in_place else None,
            )
        except Exception as e:
            row.error = rows.error_text(e)
            if not isinstance(e, UserError | OSError):
                self.core.warn(traceback.format_exc())


def _grids(spec: config_mod.CeilingSpec) -> dict[Kind, list[tuple[int, int]]]:
    """The searches the config asks for, by kind of ceiling: (writers per target, depth)."""
    return {
        DIRECT_WRITE: [(int(j), int(q)) for j, q in spec.direct_search],
        BUFFERED_WRITE: [(int(j), 1) for j in spec.buffered_jobs],
    }


def summary_lines(run_dir: str, notes: list[str]) -> list[str]:
    """The terminal summary of a sweep: the report's own table (analysis.stats), the ceilings,
    and the notes, so that `run` and `report` never disagree."""
    from analysis import summary

    return summary.terminal(run_dir, notes)
