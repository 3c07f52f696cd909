"""Stall in a real training loop: a small transformer trained with AdamW on synthetic tokens,
checkpointed every k steps through each engine while it trains (`ckptbench train CONFIG`).

What training feels is the step-time inflation: the wall time of every step (forward, backward,
optimizer step, and the checkpoint call when there is one) against the same loop without
checkpoints (`none`). It holds the engine's stall_s plus what the background persist costs the
steps that run beside it (the GIL, memory bandwidth, CPU time of the writer threads).

Per engine (`none` first, then the engines in the config's order), with the same seed, model
and data every time: `warmup_steps` untimed steps (so AdamW's state exists and caches are warm),
`eng.warm(state)`, `warmup_checkpoints` flagged saves (waited for), then `steps` timed steps with
a save at the end of every step whose index is a multiple of `checkpoint_every` (step 0 first,
so each checkpoint is followed by the steps that overlap its persist). A save that finds the
previous one still persisting waits for it (counted in its stall, as training would). The
previous checkpoint is deleted once the next is durable, between steps and untimed; the last one
is restored and compared bit for bit with a clone of the state taken just before its save.

Writes `training_steps.csv` (one row per timed step), `training_checkpoints.csv` (one row per
save, warm-ups flagged) and `env.json` into results/<run-id>/. The summary (inflation per
checkpoint, contention during persist) is derived in analysis/training.py.

This module sits above the engines (it drives them), beside bench/runner.py rather than below
it like the states in bench/workloads/{synthetic,models}.py.
"""

from __future__ import annotations

import copy
import csv
import gc
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import torch
from pydantic import Field
from torch import nn
from tqdm import tqdm

from bench import devices, env, measure, odirect, results, verify
from bench.config import check_engines, engine_options, resolved_options
from bench.engines import REGISTRY, create
from bench.errors import UserError
from bench.schema import Float, NonNeg, PosInt, Strict, read_yaml, validated

NONE = "none"  # the baseline: the same loop without checkpoints

STEP_COLUMNS = [
    "run_id", "engine", "device", "emulated", "gds_mode", "step", "step_s", "compute_s",
    "save_call_s", "checkpoint", "stall_s", "during_persist", "persist_of_step", "t_start_s",
    "t_end_s", "loss",
]  # fmt: skip
CKPT_COLUMNS = [
    "run_id", "engine", "device", "emulated", "gds_mode", "step", "warmup", "name", "bytes",
    "stall_s", "persist_s", "total_s", "wait_prev_s", "hash_s", "pinned_bytes", "save_call_s",
    "overlap_steps", "t_save_s", "t_return_s", "t_durable_s", "verified", "error",
]  # fmt: skip
STEPS_CSV, CKPTS_CSV = "training_steps.csv", "training_checkpoints.csv"


# --- config -----------------------------------------------------------------------------------


class ModelConfig(Strict):
    """A GPT-like stack of pre-norm transformer encoder layers with a causal mask."""

    d_model: PosInt = 512
    n_layers: PosInt = 4
    n_heads: PosInt = 8
    d_ff: PosInt = 2048
    vocab: PosInt = 8192
    seq_len: PosInt = 64
    batch_size: PosInt = 4


class TrainingConfig(Strict):
    """One training-loop run. `engines` may include `none` (no checkpoints: the baseline)."""

    name: str = "training"
    engines: Annotated[list[str], Field(min_length=1)] = [
        NONE, "gds", "cpu-double", "cpu-single", "torch-save", "dcp"
    ]  # fmt: skip
    steps: PosInt = 60
    checkpoint_every: PosInt = 10
    warmup_steps: PosInt = 3
    warmup_checkpoints: NonNeg = 1
    model: ModelConfig = ModelConfig()
    lr: Annotated[Float, Field(gt=0)] = 3e-4
    weight_decay: Annotated[Float, Field(ge=0)] = 0.01
    threads: PosInt | None = None  # torch.set_num_threads; None leaves torch's default
    device: Literal["auto", "cuda", "host-emulated"] = "auto"
    seed: int = 0
    n_targets: PosInt = 1
    targets: list[str] = []
    scratch: str = "scratch/training"
    verify: bool = True  # restore the last checkpoint and compare it with the state it saved
    keep_last: bool = False  # leave each engine's last checkpoint on the targets
    engine_options: dict[str, dict[str, Any]] = {}

    def resolved_targets(self) -> list[str]:
        """The first `n_targets` of `targets`, or `scratch/target-i`."""
        if self.targets:
            return [os.path.abspath(t) for t in self.targets[: self.n_targets]]
        return [os.path.abspath(os.path.join(self.scratch, f"target-{i}"))
                for i in range(self.n_targets)]  # fmt: skip

    def checkpoint_steps(self) -> list[int]:
        return list(range(0, self.steps, self.checkpoint_every))


def _check(cfg: TrainingConfig) -> None:
    if not cfg.name or cfg.name in (".", "..") or "/" in cfg.name or "\0" in cfg.name:
        raise UserError(f"name: {cfg.name!r} must be a non-empty name without '/'")
    check_engines(cfg.engines, cfg.engine_options, extra=(NONE,))
    m = cfg.model
    if m.d_model % m.n_heads:
        raise UserError(f"model.n_heads: {m.n_heads} does not divide d_model {m.d_model}")
    if cfg.targets and cfg.n_targets > len(cfg.targets):
        raise UserError(
            f"n_targets: {cfg.n_targets} targets asked for, but targets lists only "
            f"{len(cfg.targets)}"
        )
    targets = cfg.resolved_targets()
    for i, t in enumerate(targets):
        if t in targets[:i]:
            raise UserError(f"targets.{i}: {t} is already listed as targets.{targets.index(t)}")


def from_dict(raw: Any, where: str = "config") -> TrainingConfig:
    """Validate a raw mapping; every error is one line naming the key path."""
    if not isinstance(raw, dict):
        raise UserError(f"{where}: expected a mapping of keys, got {type(raw).__name__}")
    return validated(TrainingConfig, raw, where, _check)


def load(path: str, overrides: list[str] | None = None) -> TrainingConfig:
    """Read, override (`--set key=value`, as for sweeps) and validate a training YAML config."""
    return from_dict(read_yaml(path, overrides), f"config {path}")


def resolved(cfg: TrainingConfig) -> dict[str, Any]:
    """The fully resolved config, as stored in env.json."""
    d = cfg.model_dump()
    d["targets"] = cfg.resolved_targets()
    d["checkpoint_steps"] = cfg.checkpoint_steps()
    d["engine_options"] = resolved_options(cfg, [e for e in cfg.engines if e != NONE])
    return d


# --- model and data ---------------------------------------------------------------------------


class TinyGPT(nn.Module):
    """Token + position embeddings, `n_layers` pre-norm encoder layers under a causal mask, a
    final norm and an untied output head: the state_dict of a real (small) language model."""

    def __init__(self, m: ModelConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(m.vocab, m.d_model)
        self.pos = nn.Embedding(m.seq_len, m.d_model)
        layer = nn.TransformerEncoderLayer(m.d_model, m.n_heads, m.d_ff, dropout=0.0,
                                           batch_first=True, norm_first=True)  # fmt: skip
        self.blocks = nn.TransformerEncoder(layer, m.n_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(m.d_model)
        self.head = nn.Linear(m.d_model, m.vocab, bias=False)
        self.register_buffer(
            "mask", nn.Transformer.generate_square_subsequent_mask(m.seq_len), persistent=False
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        h = self.tok(x) + self.pos.weight[:n]
        h = self.blocks(h, mask=self.mask[:n, :n], is_causal=True)
        return self.head(self.norm(h))


def param_count(m: ModelConfig) -> int:
    d, f = m.d_model, m.d_ff
    per_layer = 4 * d * d + 4 * d + 2 * d * f + f + d + 4 * d  # attention, MLP, two LayerNorms
    return m.vocab * d * 2 + m.seq_len * d + m.n_layers * per_layer + 2 * d


def state_bytes(m: ModelConfig) -> int:
    """About the checkpoint's size: fp32 parameters, AdamW's exp_avg and exp_avg_sq (its 0-dim
    `step` tensors, a few hundred bytes, left out)."""
    return 3 * 4 * param_count(m)


@dataclass
class Trainer:
    """Model, optimizer and a seeded token stream; `step()` is one training step."""

    cfg: TrainingConfig
    device: torch.device

    def __post_init__(self) -> None:
        torch.manual_seed(self.cfg.seed)
        self.model = TinyGPT(self.cfg.model).to(self.device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=self.cfg.lr,
                                     weight_decay=self.cfg.weight_decay)  # fmt: skip
        self.gen = torch.Generator().manual_seed(self.cfg.seed + 1)

    def batch(self) -> torch.Tensor:
        m = self.cfg.model
        x = torch.randint(0, m.vocab, (m.batch_size, m.seq_len + 1), generator=self.gen)
        return x.to(self.device)

    def step(self) -> float:
        """Forward, backward, optimizer step; returns the loss."""
        x = self.batch()
        logits = self.model(x[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                           x[:, 1:].reshape(-1))  # fmt: skip
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return float(loss.detach())  # waits for the device, like a training loop's logging

    def state(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optim": self.opt.state_dict()}


def clone_state(state: Any) -> Any:
    """A deep copy whose tensors no longer share memory with the model or optimizer."""
    return copy.deepcopy(state)


# --- the loop ---------------------------------------------------------------------------------

OnSave = Callable[[str, int, Any], None]


@dataclass
class _Pending:
    """A timed save: its step, name, the engine's PendingSave, and when save() returned."""

    step: int
    name: str
    pending: Any
    save_call_s: float
    t_save_ns: int
    t_return_ns: int


class TrainingRun:
    """Runs one config: every engine in turn, rows into the run directory."""

    def __init__(self, cfg: TrainingConfig, out_root: str, quiet: bool = False,
                 on_save: OnSave | None = None) -> None:  # fmt: skip
        self.cfg = cfg
        self.out_root = out_root
        self.quiet = quiet
        self.on_save = on_save  # called with (engine, step, state) just before each timed save
        self.failures: list[str] = []
        self.notes: list[str] = []
        self.run_dir: str | None = None
        self.run_id = ""

    def log(self, msg: str) -> None:
        if not self.quiet:
            tqdm.write(msg, file=sys.stderr)

    def preflight(self, targets: list[str]) -> None:
        cfg = self.cfg
        for e in cfg.engines:
            if e != NONE and (why := REGISTRY[e].unavailable()):
                raise UserError(f"engines: {e} cannot run here: {why}")
        for t in targets:
            if not os.path.isdir(t):
                raise UserError(f"target {t}: does not exist or is not a directory")
            if not os.access(t, os.W_OK | os.X_OK):
                raise UserError(f"target {t}: is not writable by this user")
            users = [e for e in cfg.engines if e != NONE and REGISTRY[e].traits.o_direct]
            if users and (why := odirect.probe(t)):
                raise UserError(f"target {t}: {why}; needed by {', '.join(users)}")
            # the previous checkpoint stays until the next is durable: two at once, plus slack
            need = 2 * state_bytes(cfg.model) + (64 << 20)
            if shutil.disk_usage(t).free < need:
                raise UserError(f"target {t}: less than {need >> 20} MiB free for two checkpoints")

    def run(self) -> str:
        cfg = self.cfg
        if cfg.threads is not None:
            torch.set_num_threads(cfg.threads)
        self.device = devices.detect(cfg.device)
        targets = cfg.resolved_targets()
        if not cfg.targets:
            for t in targets:
                os.makedirs(t, exist_ok=True)
        self.preflight(targets)
        self.run_id, self.run_dir = results.new_run_dir(self.out_root, cfg.name)
        envb = env.collect(targets)
        envb["device"] = {"kind": self.device.kind, "emulated": self.device.emulated}
        envb["config"] = resolved(cfg)
        envb["engines"] = {
            e: {"traits": REGISTRY[e].traits.to_json()} for e in cfg.engines if e != NONE
        }
        envb["training"] = {"params": param_count(cfg.model),
                            "state_bytes": state_bytes(cfg.model),
                            "torch_threads": torch.get_num_threads()}  # fmt: skip
        if envb["storage"]["shared_device"]:
            self.notes.append("all targets share one device")
        drop = measure.drop_page_cache()
        if drop:
            self.notes.append(f"page cache not dropped between engines: {drop}")
        envb["notes"] = self.notes
        results.write_json(os.path.join(self.run_dir, "env.json"), envb)
        self.steps_w = _CsvWriter(os.path.join(self.run_dir, STEPS_CSV), STEP_COLUMNS)
        self.ckpts_w = _CsvWriter(os.path.join(self.run_dir, CKPTS_CSV), CKPT_COLUMNS)
        per = cfg.warmup_steps + cfg.steps
        self.log(f"training run {self.run_id}: {len(cfg.engines)} engine(s) x {cfg.steps} steps "
                 f"on {self.device.kind}, checkpoint every {cfg.checkpoint_every} "
                 f"({state_bytes(cfg.model) / 1e6:.0f} MB); results in {self.run_dir}")  # fmt: skip
        self.bar = tqdm(total=per * len(cfg.engines), unit="step", file=sys.stderr,
                        disable=self.quiet, dynamic_ncols=True)  # fmt: skip
        try:
            for e in cfg.engines:
                self.bar.set_description(e)
                self._engine(e, targets)
        finally:
            self.bar.close()
            self.steps_w.close()
            self.ckpts_w.close()
        return self.run_dir

    def _row(self, engine: str, gds_mode: str) -> dict[str, Any]:
        return {"run_id": self.run_id, "engine": engine, "device": self.device.kind,
                "emulated": self.device.emulated, "gds_mode": gds_mode}  # fmt: skip

    def _engine(self, engine: str, targets: list[str]) -> None:
        """Train from the same seed with one engine (or none); write its rows."""
        cfg = self.cfg
        os.sync()  # earlier engines' writeback must not land in this one's steps
        measure.drop_page_cache()
        gc.collect()
        tr = Trainer(cfg, self.device.torch_device)
        eng = None if engine == NONE else create(engine, targets, **engine_options(cfg, engine))
        prefix = f"ckptbench-{self.run_id}-train-{engine}"
        self._made: list[str] = []  # checkpoints of this engine still on the targets
        step_rows: list[dict[str, Any]] = []
        ckpt_rows: list[dict[str, Any]] = []
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
                    t0 = time.perf_counter_ns()
                    p = eng.save(tr.state(), name)
                    t1 = time.perf_counter_ns()
                    self._made.append(name)
                    res = p.wait()
                    ckpt_rows.append(self._ckpt_row(engine, -1, True, name, p, res,
                                                    (t1 - t0) / 1e9, t1, t0))  # fmt: skip
                    self._delete(eng, name)
            step_rows, timed = self._loop(engine, tr, eng, prefix)
            ckpt_rows += timed
        except Exception as e:  # noqa: BLE001 - one engine's failure must not lose the others
            msg = f"{type(e).__name__}: {e}".replace("\n", " ")
            self.failures.append(f"{engine}: {msg}")
            self.log(f"{engine}: failed: {msg}")
            row = self._row(engine, "none") | {"step": -1, "warmup": False, "error": msg}
            ckpt_rows.append({c: row.get(c, "") for c in CKPT_COLUMNS})
            step_rows = []
        finally:
            if eng is not None:
                for name in list(self._made):  # an error or Ctrl-C left them
                    try:
                        self._delete(eng, name)
                    except Exception as e:  # noqa: BLE001 - cleanup must not mask the cause
                        self.log(f"could not delete checkpoint {name}: {e}")
                eng.close()
        for r in step_rows:
            self.steps_w.write(r)
        for r in ckpt_rows:
            self.ckpts_w.write(r)
        self.steps_w.sync()
        self.ckpts_w.sync()

    def _loop(self, engine: str, tr: Trainer, eng: Any,
              prefix: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:  # fmt: skip
        """The timed steps; returns (step rows, checkpoint rows)."""
        cfg = self.cfg
        sync = self.device.synchronize
        every = cfg.checkpoint_every
        last_ckpt = cfg.checkpoint_steps()[-1]
        saves: list[_Pending] = []
        live: list[_Pending] = []  # checkpoints still on the targets
        expected: Any = None  # clone of the state the last checkpoint saved
        steps: list[dict[str, Any]] = []
        gds_mode = "none"
        t_loop = time.perf_counter_ns()
        for s in range(cfg.steps):
            # Untimed, between steps: once the newest save is durable, delete the older ones (a
            # striped engine's delete() would wait for a save still persisting).
            if len(live) > 1 and live[-1].pending.done():
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
            if ckpt:
                if s == last_ckpt and cfg.verify:
                    expected = clone_state(tr.state())  # untimed: between t1 and t2
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
            steps.append({
                **self._row(engine, "none"), "step": s,
                "step_s": (t1 - t0) / 1e9 + save_call_s, "compute_s": (t1 - t0) / 1e9,
                "save_call_s": save_call_s if ckpt else "", "checkpoint": ckpt,
                "stall_s": saves[-1].pending.result.stall_s if ckpt else "",
                "t_start_s": (t0 - t_loop) / 1e9, "t_end_s": (t_end - t_loop) / 1e9,
                "loss": loss,
            })  # fmt: skip
            self.bar.update()
        ckpts = []
        for sv in saves:
            res = sv.pending.wait()
            ckpts.append(self._ckpt_row(engine, sv.step, False, sv.name, sv.pending, res,
                                        sv.save_call_s, sv.t_return_ns, t_loop))  # fmt: skip
        # Which steps ran (at least partly) while a save persisted: they started after its
        # save() returned and before it was durable. The checkpoint step itself is not one.
        for r in steps:
            r["gds_mode"] = gds_mode
            r["during_persist"], r["persist_of_step"] = False, ""
            for c in ckpts:
                if c["t_return_s"] <= r["t_start_s"] < c["t_durable_s"] and r["step"] > c["step"]:
                    r["during_persist"], r["persist_of_step"] = True, c["step"]
                    c["overlap_steps"] += 1
        if saves:
            last = saves[-1]
            if expected is not None:
                loaded = eng.load(last.name, device=str(self.device.torch_device))
                check = verify.first_tensor_difference if eng.traits.loose_keys \
                    else verify.first_difference  # fmt: skip
                diff = check(expected, loaded)
                ckpts[-1]["verified"] = diff is None
                if diff:
                    ckpts[-1]["error"] = f"restored state differs at {diff}"
                    self.failures.append(f"{engine}: step {last.step}: restored state differs")
                del loaded, expected
            for sv in live:
                if sv is not last or not cfg.keep_last:
                    self._delete(eng, sv.name)
            if cfg.keep_last:
                self._made.remove(last.name)
        return steps, ckpts

    def _delete(self, eng: Any, name: str) -> None:
        eng.delete(name)
        if name in self._made:
            self._made.remove(name)

    def _ckpt_row(self, engine: str, step: int, warmup: bool, name: str, pending: Any, res: Any,
                  save_call_s: float, t_return_ns: int, t_loop_ns: int) -> dict[str, Any]:  # fmt: skip
        """A checkpoint row; times relative to `t_loop_ns` (the start of the timed loop)."""
        t_save = (pending.t0_ns - t_loop_ns) / 1e9  # when the engine's save() started timing
        return {
            **self._row(engine, res.gds_mode), "step": step, "warmup": warmup, "name": name,
            "bytes": res.bytes, "stall_s": res.stall_s, "persist_s": res.persist_s,
            "total_s": res.total_s, "wait_prev_s": res.wait_prev_s, "hash_s": res.hash_s,
            "pinned_bytes": res.pinned_bytes, "save_call_s": save_call_s, "overlap_steps": 0,
            "t_save_s": t_save, "t_return_s": (t_return_ns - t_loop_ns) / 1e9,
            "t_durable_s": t_save + res.total_s, "verified": "", "error": "",
        }  # fmt: skip


class _CsvWriter:
    """Rows of one CSV with a fixed header; `sync()` flushes and fsyncs after each engine."""

    def __init__(self, path: str, columns: list[str]) -> None:
        self._f = open(path, "w", newline="")  # noqa: SIM115 - closed in close()
        self._w = csv.DictWriter(self._f, fieldnames=columns, extrasaction="raise")
        self._w.writeheader()

    def write(self, row: dict[str, Any]) -> None:
        self._w.writerow(row)

    def sync(self) -> None:
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self.sync()
        self._f.close()
