"""The cases of a sweep, group by group: make the engines over this rank's targets, and for each
workload build the state (a rank's shard under torchrun), warm the engines, drop the page
cache, probe the ceilings after the warm-ups, then run the repetitions with the engines
alternating. One repetition is the same on every rank: a barrier, the save until durable
(bench.run.protocol.save_phase), a barrier, the restore and its comparison, the rows gathered to
rank 0, which writes them (and the aggregate row under torchrun) before the next save."""

from __future__ import annotations

import gc
import traceback
from functools import partial
from typing import TYPE_CHECKING, Any

from bench.common import sizes
from bench.common.errors import UserError
from bench.config import sweep as config_mod
from bench.engines import REGISTRY
from bench.measure import hostcost, results
from bench.measure import timers as measure
from bench.measure.ceilings import Ceilings
from bench.measure.clock import Clocked
from bench.run import distributed as dist
from bench.run import plan, preflight, protocol, rows
from bench.run.ceiling_runs import CeilingRunner
from bench.run.core import Core
from bench.run.plan import Group, RunPlan, Workload
from bench.storage import verify

if TYPE_CHECKING:
    from bench.common.devices import Device


class CaseRunner:
    """Runs the cases of one run's plan as this rank (see the module): `ctx` holds the config,
    the world, the device, the core and the decided plan; `ceilings` are the run's, `host` its
    idle baseline, `probes` measures the ceilings between warm-ups and timed saves."""

    def __init__(
        self,
        ctx: dist.RankContext,
        *,
        ranked: bool,
        ceilings: Ceilings | None,
        judges: rows.Judges = None,
        host: hostcost.Host,
        probes: CeilingRunner,
    ) -> None:
        self.cfg: config_mod.Config = ctx.cfg
        self.device: Device = ctx.device
        self.core: Core = ctx.core
        self.world = ctx.world
        self.plan: RunPlan = ctx.plan
        self.ctx = ctx
        self.ranked = ranked
        self.ceilings = ceilings  # this rank's host's
        self.judges = judges if judges is not None else ceilings  # an aggregate row's
        self.host = host
        self.probes = probes
        self.faults = dist.faults() if ranked else {}
        self.saves = 0  # saves this rank took part in (fault injection counts them)
        self._fingerprint: list[tuple[str, str]] | None = None  # the state's, for a restart

    def run_group(self, g: Group) -> None:
        cfg, w, the_plan = self.cfg, self.world, self.plan
        names = plan.engines_at(cfg, the_plan.engines, g.n)
        mine = the_plan.my_targets(g, w.rank)
        caps = cfg.target_caps()

        def make() -> dict[str, Clocked]:
            if mine is None:
                return {}
            paths, idx = mine
            return {
                e: self.core.create(e, paths, [caps[i] for i in idx], the_plan.options[e])
                for e in names
            }

        engines = w.agree(f"the engines of {g.key}", make)
        try:
            for wl in the_plan.workloads:
                todo = [
                    (i, e)
                    for i in range(cfg.warmups + cfg.repetitions)
                    for e in names
                    if plan.case_key(wl, g, e, i, cfg.warmups) not in the_plan.done
                    and the_plan.restore(wl, g, e) is not None
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
                    e: eng for e, eng in engines.items() if the_plan.restore(wl, g, e) is not None
                }
                short = w.agree(f"the memory for {wl.id}", partial(self.memory_now, wl, g))
                if short:
                    if cfg.on_error == "stop":
                        raise UserError(short)
                    self.core.note(f"workload skipped: {short}")
                    self.core.warn(f"skipped: {short}")
                    continue
                state = w.agree(f"the state of {wl.id}", partial(self.build, wl, g, admitted))
                if self.plan.cache_dropped and w.local_rank == 0:
                    measure.drop_page_cache()
                if cfg.mlperf is not None:
                    for e in dict.fromkeys(e for _, e in todo):
                        self.mlperf_engine(g, wl, e, admitted.get(e), state)
                    del state
                    continue
                probed = False
                for i, e in todo:
                    if not probed and i >= cfg.warmups:
                        # after the warm-ups, in the conditions of the timed saves
                        self.probe(g, wl)
                        probed = True
                    if not self.case(g, wl, e, admitted.get(e), state, i):
                        # a restart that failed or did not verify left wrong (scrubbed) bytes in the state
                        del state
                        state = w.agree(
                            f"the state of {wl.id}", partial(self.build, wl, g, admitted)
                        )
                del state
                self._fingerprint = None
        finally:
            for eng in engines.values():
                eng.close()

    def probe(self, g: Group, wl: Workload) -> None:
        """The ceilings once more before the timed saves (single-process runs, where asked for),
        into env.json `ceilings_probes`."""
        cfg, core = self.cfg, self.core
        chosen = self.ceilings.chosen().get(g.n) if self.ceilings else None
        if self.ranked or not (cfg.ceilings.enabled and cfg.ceilings.probes and chosen):
            return
        got = self.probes.probe(g, wl, self.plan.my_targets(g, self.world.rank), chosen)
        if got is not None:
            core.env.setdefault("ceilings_probes", []).append(got.to_json())
            core.write_env()

    def memory_now(self, wl: Workload, g: Group) -> str | None:
        """Whether this workload's state and its engines' staging still fit in the host memory
        available now (another process may have taken some since the preflight): None, or why
        not, in one line. Never leave that to the kernel's OOM killer."""
        if self.device.is_cuda or self.world.rank >= g.k:
            return None
        cases = [
            v for (wid, gkey, _), v in self.plan.verdicts.items() if (wid, gkey) == (wl.id, g.key)
        ]
        need = max((v.host_need for v in cases if v.restore is not None), default=0)
        have = preflight.host_available() - preflight.HEADROOM // 2
        if need <= have:
            return None
        return (
            f"{wl.id} x{g.n}: host memory: its cases need up to {sizes.format_size(need)}, "
            f"{sizes.format_size(have)} is available now (less than at the start of the run: "
            "another process took memory); way out: rerun when it is free, or a smaller size"
        )

    def build(self, wl: Workload, g: Group, engines: dict[str, Clocked]) -> Any:
        """This rank's state (its shard under torchrun) on its device, engines warmed (None:
        not active in this group)."""
        if self.world.rank >= g.k:
            return None
        if self.ranked:
            state = dist.build_shard(self.ctx, wl, g)
        else:
            state = wl.build(self.cfg, self.device.torch_device)
        self._fingerprint = None
        if self.cfg.verify and any(self.plan.restore(wl, g, e) == "restart" for e in engines):
            # what a restart is checked against: taken now, before any save
            self._fingerprint = verify.fingerprint(state)
        for eng in engines.values():
            eng.warm(state)
        return state

    def case(
        self, g: Group, wl: Workload, engine: str, eng: Clocked | None, state: Any, i: int
    ) -> bool:
        """One repetition on every rank, its steps back to back (`Repetition`). False when a
        restart failed or did not verify: the state may hold its wrong or scrubbed bytes."""
        key = plan.case_key(wl, g, engine, i, self.cfg.warmups)
        case_id, warm, rep = key
        r = Repetition(self, g, wl, engine, eng, state, key)
        where = f"{case_id} {'warm-up' if warm else 'rep'} {rep}"
        try:
            got = r.run(where)
        except dist.RankLost as lost:
            lost = lost.on_hosts(self.plan.table)
            r.restore_after_loss()
            r.delete()
            if self.world.rank == 0:
                dist.write_lost(self.ctx, r.row, lost, g, wl, engine, key)
            raise lost from None
        except KeyboardInterrupt:
            r.delete()  # the case in flight leaves nothing behind
            raise
        r.delete()
        r.record(got, f"rep {rep}")
        row = r.row
        return not (
            row is not None
            and row.restore_into == "restart"
            and bool(row.error or (self.cfg.verify and not row.verified))
        )

    def new_row(
        self,
        g: Group,
        wl: Workload,
        engine: str,
        eng: Clocked | None,
        state: Any,
        key: tuple[str, bool, int],
    ) -> results.Row | None:
        """This rank's row of one repetition, its measurements to come (None: not active)."""
        if eng is None:
            return None
        cfg, w, core = self.cfg, self.world, self.core
        case_id, warm, rep = key
        mine = self.plan.my_targets(g, w.rank)
        assert mine is not None
        caps = cfg.target_caps()
        capped = any(caps[j] for j in mine[1]) and REGISTRY[engine].traits.stripes
        n_tensors, total = rows.tensor_stats(state)
        return results.Row(
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
            cache_dropped=self.plan.cache_dropped,
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

    def mlperf_engine(
        self, g: Group, wl: Workload, engine: str, eng: Clocked | None, state: Any
    ) -> None:
        """One engine through MLPerf Storage's order (bench.workloads.mlperf [R]): every rank
        writes all the checkpoints (each after a barrier, each until durable), the page cache
        is cleared (dropped where the run can, and each checkpoint's pages evicted and checked
        gone before its read, bench.run.protocol.restore_phase), then every rank reads them back in
        turn. A checkpoint's rows hold its write and its read; rank 0 writes them, with their
        aggregate, after the read. Rank 0 records when each phase began (env.json `mlperf`)."""
        cfg, w, core = self.cfg, self.world, self.core
        n = cfg.repetitions
        keys = [plan.case_key(wl, g, engine, i, 0) for i in range(n)]
        reps = [Repetition(self, g, wl, engine, eng, state, k) for k in keys]
        events: list[dict[str, Any]] = []

        def event(what: str, i: int | None = None) -> None:
            events.append({"event": what, "checkpoint": i, "t_ns": measure.now_ns()})

        recorded = 0
        try:
            for i, r in enumerate(reps):
                w.barrier(f"the write of {keys[i][0]} checkpoint {i}")
                event("write", i)
                r.save()
            w.barrier(f"the cache drop of {keys[0][0]}")
            event("clear cache")
            if self.plan.cache_dropped and w.local_rank == 0:
                measure.drop_page_cache()
            for i, r in enumerate(reps):
                w.barrier(f"the read of {keys[i][0]} checkpoint {i}")
                event("read", i)
                r.restore()
                r.record(r.gather(f"the rows of {keys[i][0]} {i}"), f"checkpoint {i}")
                recorded += 1
        except dist.RankLost as lost:
            # the checkpoints not yet recorded: each rank's committed ones restored all the
            # same, rank 0's rows of them kept (its own, and an aggregate naming the loss)
            lost = lost.on_hosts(self.plan.table)
            todo = [r for r in reps[recorded:] if r.row is not None and r.row.total_s is not None]
            for r in todo:
                r.restore_after_loss()
            if w.rank == 0:
                for r in todo or reps[recorded : recorded + 1]:
                    dist.write_lost(self.ctx, r.row, lost, g, wl, engine, r.key, close=False)
                core.env.setdefault("mlperf", {}).setdefault("order", {})[engine] = events
                core.write_env()
                core.close()
            raise lost from None
        finally:
            for r in reps:
                r.delete()
        if w.rank == 0:
            core.env.setdefault("mlperf", {}).setdefault("order", {})[engine] = events
            core.write_env()

    def sharing(self, g: Group) -> bool:
        """Whether other active ranks of group g share this rank's host (its ceilings then judge
        their sum, the aggregate row, not this rank's share)."""
        if g.k == 1 or not self.plan.table:
            return g.k > 1
        me = self.world.node_rank
        return sum(1 for t in self.plan.table[: g.k] if t["node_rank"] == me) > 1

    def save(self, row: results.Row, eng: Clocked, state: Any, name: str, g: Group) -> None:
        fault = self.faults.get((self.world.rank, self.saves))
        try:
            hook = dist.inject(fault, self.world.rank, self.saves) if fault else None
            protocol.save_phase(
                row, eng, state, name, self.ceilings, after_save=hook, host=self.host
            )
            if self.sharing(g):  # the ceilings are the whole host's: see the aggregate row
                row.write_efficiency = row.snapshot_efficiency = None
                row.ceiling_beaten = False
        except Exception as e:  # reported on every rank (fail_together)
            row.error = rows.error_text(e)
            if not isinstance(e, UserError | OSError):
                self.core.warn(traceback.format_exc())
        self.saves += 1

    def restore(
        self,
        row: results.Row,
        eng: Clocked,
        engine: str,
        state: Any,
        name: str,
        base: str,
        g: Group,
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
        in_place = self.plan.verdicts[(row.workload, g.key, engine)].restore == "restart"
        try:
            protocol.restore_phase(
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
            if not self.sharing(g):  # a rank's share of its host's: see the aggregate row
                rows.judge_row(row, self.ceilings)
        except Exception as e:
            row.error = rows.error_text(e)
            if not isinstance(e, UserError | OSError):
                self.core.warn(traceback.format_exc())


class Repetition:
    """One repetition of a case as every rank runs it, in the measurement protocol's order
    (bench.run.protocol): a barrier, the save until durable, a barrier, the restore and its
    comparison, the rows gathered to rank 0, which writes them (and their aggregate under
    torchrun); a failure on one rank fails the repetition on all, and is counted once. The
    sweep runs the steps back to back (`run`, from CaseRunner.case); MLPerf's order saves every
    checkpoint before it restores one, calling the steps itself (CaseRunner.mlperf_engine).
    `row` is None on a rank not active in the group, which only takes part in the
    collectives."""

    def __init__(
        self,
        cases: CaseRunner,
        g: Group,
        wl: Workload,
        engine: str,
        eng: Clocked | None,
        state: Any,
        key: tuple[str, bool, int],
    ) -> None:
        self.cases, self.g, self.engine, self.eng = cases, g, engine, eng
        self.state, self.key = state, key
        self.world = cases.world
        # a shard of a checkpoint per rank, and an aggregate row (MLPerf runs under torchrun)
        self.ranked = cases.ranked or cases.cfg.mlperf is not None
        self.base = plan.checkpoint_name(cases.core.run_id, key)
        self.name = dist.shard_name(self.base, self.world.rank, g.k) if self.ranked else self.base
        self.row = cases.new_row(g, wl, engine, eng, state, key)

    def run(self, where: str) -> list[results.Row]:
        """Save, restore and gather, each after a barrier named for its step and `where`."""
        w = self.world
        w.barrier(f"the save of {where}")
        self.save()
        w.barrier(f"the restore of {where}")
        self.restore()
        w.barrier(f"the rows of {where}")
        return self.gather(f"the rows of {where}")

    def save(self) -> None:
        """This rank's save until durable (bench.run.protocol.save_phase)."""
        if self.row is not None and self.eng is not None:
            self.cases.save(self.row, self.eng, self.state, self.name, self.g)

    def restore(self) -> None:
        """This rank's restore and comparison, unless its save failed."""
        if self.row is not None and self.eng is not None and not self.row.error:
            self.cases.restore(
                self.row, self.eng, self.engine, self.state, self.name, self.base, self.g
            )

    def restore_after_loss(self) -> None:
        """Another rank was lost after this rank's save was durable: restore and compare this
        rank's committed shard all the same (a lost rank, or host, costs no other rank its
        checkpoint; rank 0's row says so), unless it was restored already."""
        row = self.row
        if row is not None and not row.error and row.total_s is not None:
            if row.restore_into is None:
                self.restore()

    def gather(self, where: str) -> list[results.Row]:
        """Every active rank's row, in rank order."""
        return [r for r in self.world.all_gather(self.row, where) if r is not None]

    def record(self, got: list[results.Row], which: str) -> None:
        """Rank 0 writes the rows `got` (and their aggregate under torchrun), a failure on one
        rank failing every row; the failure is counted (bench.run.core.Core.failed), naming the
        case, `which` repetition of it and, under torchrun, the rank it failed on."""
        cases, core, ranked = self.cases, self.cases.core, self.ranked
        bad = rows.fail_together(got, cases.cfg.verify)
        core.write(got)
        if ranked:
            core.write([rows.aggregate(got, cases.judges)])
        if core.bar is not None:
            core.bar.update(1)
        if bad is not None:
            case_id = self.key[0]
            on = f" on rank {bad.rank}" if ranked else ""
            core.failed(
                f"case {case_id} {which}{on}",
                bad.error,
                f"{case_id}, rank {bad.rank}" if ranked else case_id,
            )

    def delete(self) -> None:
        """Remove this rank's checkpoint (never raises, bench.run.protocol.delete_checkpoint)."""
        if self.row is not None and self.eng is not None:
            protocol.delete_checkpoint(self.eng, self.name, self.cases.core.warn)
