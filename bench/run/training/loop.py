"""Stall in a real training loop: a small transformer trained with AdamW on synthetic tokens,
checkpointed every k steps through each engine while it trains (`ckptbench train CONFIG`).

What training feels is the step-time inflation: the wall time of every step (forward, backward,
optimizer step, and the checkpoint call when there is one) against the same loop without
checkpoints (`none`). It holds the save's stall_s plus what the background persist costs the
steps that run beside it (the GIL, memory bandwidth, CPU time of the writer threads).

Per engine (`none` first, then the engines in the config's order), with the same seed, model
and data every time: `warmup_steps` untimed steps (so AdamW's state exists and caches are warm),
`eng.warm(state)`, `warmup_checkpoints` flagged saves (waited for), then `steps` timed steps with
a save at the end of every step whose index is a multiple of `checkpoint_every` (step 0 first,
so each checkpoint is followed by the steps that overlap its persist). A save that finds the
previous one still persisting waits for it (counted in its stall, as training would). The
previous checkpoint is deleted once the next is durable, between steps and untimed; the last one
is restored and compared bit for bit with a clone of the state taken just before its save.
Then the restart (`_restart`): the trainer's model and optimizer are lost, a fresh one is built
from the config, and the harness times, from the call of load() with the page cache dropped to
the end of the first training step after it, what a crashed run spends before it trains again;
the first steps' losses must equal the uninterrupted run's at those steps.

Writes `training_steps.csv` (one row per timed step), `training_checkpoints.csv` (one row per
save, warm-ups flagged) and `env.json` into results/<run-id>/. The summary (inflation per
checkpoint, contention during persist) is derived in analysis/training.py.

A kind of run on the run core (bench.run.core), beside bench/run/sweep.py: the core owns the run
directory, env.json, preflight, engine creation and the row writers; this module the loop.
"""

from __future__ import annotations

import gc
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from bench.common import devices
from bench.common.errors import UserError
from bench.config.training import NONE, TrainingConfig, param_count, resolved, state_bytes
from bench.measure import clock, results
from bench.measure import timers as measure
from bench.measure.clock import Clocked
from bench.measure.results import CheckpointRow, StepRow  # their columns
from bench.run.core import Core
from bench.run.training.model import Trainer, clone_state
from bench.storage import verify

STEPS_CSV, CKPTS_CSV = results.STEPS_CSV, results.CKPTS_CSV


OnSave = Callable[[str, int, Any], None]


@dataclass
class _Pending:
    """A timed save: its step, name, the clock's TimedSave, and the checkpoint call's time in
    its step (the state_dict built, save() and the device synchronised after it)."""

    step: int
    name: str
    pending: Any
    save_call_s: float
    t_save_ns: int
    t_return_ns: int


class TrainingRun:
    """Runs one config on the run core: every engine in turn, rows into the run directory."""

    def __init__(
        self, cfg: TrainingConfig, out_root: str, quiet: bool = False, on_save: OnSave | None = None
    ) -> None:
        self.cfg = cfg
        self.out_root = out_root
        self.quiet = quiet
        self.on_save = on_save  # called with (engine, step, state) just before each timed save
        self.failures: list[str] = []
        self.core: Core | None = None

    @property
    def run_dir(self) -> str | None:
        return self.core.run_dir if self.core else None

    @property
    def run_id(self) -> str:
        return self.core.run_id if self.core else ""

    @property
    def notes(self) -> list[str]:
        return self.core.notes if self.core else []

    def log(self, msg: str) -> None:
        if self.core is not None:
            self.core.log(msg)

    def _failed(self, engine: str, why: str) -> None:
        self.failures.append(f"{engine}: {why}")
        assert self.core is not None
        self.core.failed(f"{engine}: failed", why, engine)

    def _space(self, targets: list[str]) -> None:
        """The previous checkpoint stays until the next is durable: two at once, plus slack."""
        need = 2 * state_bytes(self.cfg.model) + (64 << 20)
        for t in targets:
            if shutil.disk_usage(t).free < need:
                raise UserError(f"target {t}: less than {need >> 20} MiB free for two checkpoints")

    def run(self) -> str:
        cfg = self.cfg
        if cfg.threads is not None:
            torch.set_num_threads(cfg.threads)
        self.device = devices.detect(cfg.device)
        core = self.core = Core(cfg, self.device, self.out_root, quiet=self.quiet)
        targets = cfg.resolved_targets()
        if not cfg.targets:
            for t in targets:
                os.makedirs(t, exist_ok=True)
        runnable = core.runnable([e for e in cfg.engines if e != NONE])
        engines = [e for e in cfg.engines if e == NONE or e in runnable]
        core.check_dirs(targets, runnable)
        self._space(targets)
        core.open(resolved(cfg), targets, runnable)
        core.env["training"] = {
            "params": param_count(cfg.model),
            "state_bytes": state_bytes(cfg.model),
            "torch_threads": torch.get_num_threads(),
        }
        if core.env["storage"]["shared_device"]:
            core.note("all targets share one device")
        drop = measure.drop_page_cache()
        if drop:
            core.note(f"page cache not dropped between engines: {drop}")
        core.write_env()
        core.open_writers({STEPS_CSV: StepRow, CKPTS_CSV: CheckpointRow})
        per = cfg.warmup_steps + cfg.steps
        core.log(
            f"training run {core.run_id}: {len(engines)} engine(s) x {cfg.steps} steps "
            f"on {self.device.kind}, checkpoint every {cfg.checkpoint_every} "
            f"({state_bytes(cfg.model) / 1e6:.0f} MB); results in {core.run_dir}"
        )
        self.bar = core.progress(per * len(engines), "step")
        try:
            for e in engines:
                self.bar.set_description(e)
                self._engine(e, targets)
        finally:
            core.close()
        return core.run_dir or ""

    def _who(self, engine: str) -> dict[str, Any]:
        """What every row of `engine` in this run begins with: run, engine and device."""
        return {
            "run_id": self.run_id,
            "engine": engine,
            "device": self.device.kind,
            "emulated": self.device.emulated,
        }

    def _engine(self, engine: str, targets: list[str]) -> None:
        """Train from the same seed with one engine (or none); write its rows."""
        cfg = self.cfg
        os.sync()  # earlier engines' writeback must not land in this one's steps
        measure.drop_page_cache()
        gc.collect()
        tr = Trainer(cfg, self.device.torch_device)
        core = self.core
        assert core is not None, "run() opened the core"
        # Behind the harness's clock (bench.measure.clock): stall and time to durability are
        # read around the engine's save(), never taken from it.
        eng = None if engine == NONE else clock.clocked(core.create(engine, targets))
        prefix = f"ckptbench-{self.run_id}-train-{engine}"
        self._made: list[str] = []  # checkpoints of this engine still on the targets
        step_rows: list[StepRow] = []
        ckpt_rows: list[CheckpointRow] = []
        try:
            for _ in range(cfg.warmup_steps):
                tr.step()
                self.bar.update()
            self.device.synchronize()
            if eng is not None:
                state = tr.state()
                eng.warm(state)
                for i in range(cfg.warmup_checkpoints):
                    name = f"{prefix}-warmup{i}"
                    p = eng.save(tr.state(), name)
                    self._made.append(name)
                    res = p.wait()
                    ckpt_rows.append(
                        self._ckpt_row(
                            engine, -1, True, name, p, res, p.stall_s, p.t_return_ns, p.t0_ns
                        )
                    )
                    self._delete(eng, name)
            step_rows, timed = self._loop(engine, tr, eng, prefix)
            ckpt_rows += timed
        except Exception as e:  # one engine's failure must not lose the others
            msg = f"{type(e).__name__}: {e}".replace("\n", " ")
            self._failed(engine, msg)
            ckpt_rows.append(CheckpointRow(**self._who(engine), step=-1, error=msg))
            step_rows = []
        finally:
            if eng is not None:
                for name in list(self._made):  # an error or Ctrl-C left them
                    try:
                        self._delete(eng, name)
                    except Exception as e:  # cleanup must not mask the cause
                        self.log(f"could not delete checkpoint {name}: {e}")
                eng.close()
        core.write(step_rows, STEPS_CSV)
        core.write(ckpt_rows, CKPTS_CSV)

    def _loop(
        self, engine: str, tr: Trainer, eng: Clocked | None, prefix: str
    ) -> tuple[list[StepRow], list[CheckpointRow]]:
        """The timed steps; returns (step rows, checkpoint rows)."""
        cfg = self.cfg
        sync = self.device.synchronize
        every = cfg.checkpoint_every
        last_ckpt = cfg.checkpoint_steps()[-1]
        saves: list[_Pending] = []
        live: list[_Pending] = []  # checkpoints still on the targets
        expected: Any = None  # clone of the state the last checkpoint saved
        data_at_last: torch.Tensor | None = None  # the token stream's position at its save
        steps: list[StepRow] = []
        gds_mode = "none"
        t_loop = time.perf_counter_ns()
        for s in range(cfg.steps):
            # Untimed, between steps: once the newest save is durable, delete the older ones (a
            # striped engine's delete() would wait for a save still persisting).
            if eng is not None and len(live) > 1 and live[-1].pending.done():
                for sv in live[:-1]:
                    sv.pending.wait()  # re-raises a persist error here
                    self._delete(eng, sv.name)
                live = live[-1:]
            t0 = time.perf_counter_ns()
            loss = tr.step()
            sync()
            t1 = time.perf_counter_ns()
            save_call_s, t2 = 0.0, t1
            ckpt = eng is not None and s % every == 0
            if eng is not None and ckpt:
                if s == last_ckpt:  # untimed: between t1 and t2
                    data_at_last = tr.gen.get_state()
                    if cfg.verify:
                        expected = clone_state(tr.state())
                if self.on_save is not None:
                    self.on_save(engine, s, tr.state())
                name = f"{prefix}-step{s}"
                t2 = time.perf_counter_ns()
                self._made.append(name)
                p = eng.save(tr.state(), name)
                sync()
                t3 = time.perf_counter_ns()
                save_call_s = (t3 - t2) / 1e9
                saves.append(_Pending(s, name, p, save_call_s, t2, t3))
                live.append(saves[-1])
                gds_mode = p.result.gds_mode
            t_end = t2 + int(save_call_s * 1e9)
            steps.append(
                StepRow(
                    **self._who(engine),
                    step=s,
                    step_s=(t1 - t0) / 1e9 + save_call_s,
                    compute_s=(t1 - t0) / 1e9,
                    save_call_s=save_call_s if ckpt else None,
                    checkpoint=ckpt,
                    stall_s=saves[-1].pending.stall_s if ckpt else None,
                    t_start_s=(t0 - t_loop) / 1e9,
                    t_end_s=(t_end - t_loop) / 1e9,
                    loss=loss,
                )
            )
            self.bar.update()
        ckpts = []
        for sv in saves:
            res = sv.pending.wait()
            ckpts.append(
                self._ckpt_row(
                    engine,
                    sv.step,
                    False,
                    sv.name,
                    sv.pending,
                    res,
                    sv.save_call_s,
                    sv.t_return_ns,
                    t_loop,
                )
            )
        for c in ckpts:  # one of ckptbench's own paths the device saw not durable fails
            if c.durable_witness.startswith("no") and eng is not None and not eng.traits.baseline:
                self._failed(
                    engine, f"step {c.step}: not durable as the device saw it: {c.durable_witness}"
                )
        # Which steps ran (at least partly) while a save persisted: they started after its
        # save() returned and before it was durable. The checkpoint step itself is not one.
        for r in steps:
            r.gds_mode = gds_mode
            for c in ckpts:
                assert c.t_return_s is not None and c.t_durable_s is not None
                if c.t_return_s <= r.t_start_s < c.t_durable_s and r.step > c.step:
                    r.during_persist, r.persist_of_step = True, c.step
                    c.overlap_steps += 1
        if saves:
            assert eng is not None, "only an engine saves"
            last = saves[-1]
            if expected is not None:
                loaded = eng.load(last.name, device=str(self.device.torch_device))
                check = (
                    verify.first_tensor_difference
                    if eng.traits.loose_keys
                    else verify.first_difference
                )
                diff = check(expected, loaded)
                ckpts[-1].verified = diff is None
                if diff:
                    ckpts[-1].error = f"restored state differs at {diff}"
                    self._failed(engine, f"step {last.step}: restored state differs")
                del loaded, expected
            assert data_at_last is not None, "the last checkpoint's step kept it"
            after = [r.loss for r in steps if last.step < r.step <= last.step + 2]
            self._restart(tr, eng, last.name, data_at_last, ckpts[-1], after)
            if ckpts[-1].restart_loss_match is False:
                self._failed(engine, f"step {last.step}: training after the restart diverged")
            for sv in live:
                if sv is not last or not cfg.keep_last:
                    self._delete(eng, sv.name)
            if cfg.keep_last:
                self._made.remove(last.name)
        return steps, ckpts

    def _restart(
        self,
        tr: Trainer,
        eng: Clocked,
        name: str,
        data: torch.Tensor,
        row: CheckpointRow,
        after: list[float],
    ) -> None:
        """A restart from the last checkpoint, timed by the harness: the trainer's model and
        optimizer are lost (the failure); a fresh Trainer from the same config is built and its
        token stream put where the checkpoint's step left it (a data loader's position), both
        untimed, as a restarted process has done before it loads (`restore: restart`, the
        default: AdamW's state made too, the destination of the load); the checkpoint's pages
        are dropped from the page cache (a restart after a crash finds them on the device).
        Timed, one clock from the call of load() to the end of the first step: the engine's
        load (without its checksums, as restore_s) until the device is synchronised (a
        restart: into the fresh model and optimizer's own tensors, in place or its loader then
        the copy, bench.run.restart), load_state_dict (fresh only: the copy into them), and the
        first training step, device synchronised.
        Fills restart_s and its parts; restart_loss_match compares the first steps' losses with
        `after`, the losses the uninterrupted run had at those steps (none to compare: empty)."""
        sync = self.device.synchronize
        tr.lose()
        gc.collect()
        fresh = Trainer(self.cfg, self.device.torch_device)
        fresh.gen.set_state(data)
        into = None
        if self.cfg.restore == "restart":
            fresh.init_optimizer_state()
            into = fresh.state()
        measure.drop_page_cache()
        measure.evict_files(eng.cached_files(name))
        sync()
        t0 = time.perf_counter_ns()
        loaded = eng.load(name, device=str(self.device.torch_device), checksums=False, into=into)
        sync()
        t1 = time.perf_counter_ns()
        if into is None:
            fresh.load_state(loaded)
        sync()
        t2 = time.perf_counter_ns()
        losses = [fresh.step()]
        sync()
        t3 = time.perf_counter_ns()
        del loaded
        row.restart_s = (t3 - t0) / 1e9
        row.restart_load_s = (t1 - t0) / 1e9
        row.restart_first_step_s = (t3 - t2) / 1e9
        if after:
            losses += [fresh.step() for _ in after[1:]]
            row.restart_loss_match = losses == after
        fresh.lose()

    def _delete(self, eng: Clocked, name: str) -> None:
        eng.delete(name)
        if name in self._made:
            self._made.remove(name)

    def _ckpt_row(
        self,
        engine: str,
        step: int,
        warmup: bool,
        name: str,
        pending: Any,
        res: Any,
        save_call_s: float,
        t_return_ns: int,
        t_loop_ns: int,
    ) -> CheckpointRow:
        """A checkpoint row; times relative to `t_loop_ns` (the start of the timed loop)."""
        t_save = (pending.t0_ns - t_loop_ns) / 1e9  # when the clock saw save() called
        return CheckpointRow(
            **self._who(engine),
            gds_mode=res.gds_mode,
            step=step,
            warmup=warmup,
            name=name,
            bytes=res.bytes,
            stall_s=res.stall_s,
            persist_s=res.persist_s,
            total_s=res.total_s,
            wait_prev_s=res.wait_prev_s,
            hash_s=res.hash_s,
            pinned_bytes=res.pinned_bytes,
            save_call_s=save_call_s,
            t_save_s=t_save,
            t_return_s=(t_return_ns - t_loop_ns) / 1e9,
            t_durable_s=t_save + res.total_s,
            device_written_bytes=pending.witnessed.bytes,
            device_flushes=pending.witnessed.flushes,
            durable_witness=pending.witnessed.text,
        )
