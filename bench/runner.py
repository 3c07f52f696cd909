"""A sweep: config -> cases -> engine saves -> one row per repetition -> results/<run-id>/.

For each SSD count N (the first N targets), for each workload (synthetic total x tensor size,
then model presets): build the state once on the device, warm every engine's staging for it
(outside the timed region), drop the page cache (root) and then run the repetitions with the
engines alternating, warm-ups first and flagged. Each repetition saves, waits until durable,
evicts the checkpoint's pages, restores, compares with the source byte for byte, and deletes
the checkpoint. Every row is flushed to disk before the next save starts.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import sys
import traceback
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from tqdm import tqdm

from bench import ceiling, devices, env, measure, odirect, results, sizes, verify
from bench import config as config_mod
from bench.engines import ENGINES, REGISTRY, create
from bench.engines.traits import Traits
from bench.errors import UserError
from bench.workloads import model_state, synthetic_state


@dataclass(frozen=True)
class Workload:
    """One state to checkpoint."""

    id: str
    kind: str  # synthetic or model
    total_bytes: int  # planned (synthetic) or actual (model) tensor bytes
    tensor_bytes: int  # 0 for models (mixed sizes)
    model: config_mod.ModelSpec | None = None

    def build(self, cfg: config_mod.Config, device: torch.device) -> Any:
        if self.model is None:
            return synthetic_state(self.total_bytes, self.tensor_bytes, getattr(torch, cfg.dtype),
                                   device, cfg.seed)  # fmt: skip
        m = self.model
        return model_state(m.preset, device, getattr(torch, m.dtype), m.optimizer, m.world_size,
                           m.rank, cfg.seed)  # fmt: skip


def workloads(cfg: config_mod.Config) -> list[Workload]:
    out = []
    run, _ = cfg.synthetic_cases()
    for total, tensor in run:
        wid = f"synthetic-{sizes.format_size(total)}-{sizes.format_size(tensor)}"
        out.append(Workload(wid, "synthetic", total, tensor))
    for m in cfg.models:
        wid = m.preset if m.optimizer else f"{m.preset}-noopt"
        if m.preset == "llama-7b-shard":
            wid += f"-r{m.rank}of{m.world_size}"
        out.append(Workload(wid, "model", 0, 0, m))
    return out


def preflight(cfg: config_mod.Config, targets: list[str], wls: list[Workload],
              scale: int = 1) -> None:  # fmt: skip
    """Fail before anything runs: missing or unwritable targets, O_DIRECT refused, no space."""
    check_dirs(targets[: max(cfg.ssd_counts)], cfg.engines)
    check_space(cfg, targets, wls, scale)


def skipped_engines(cfg: config_mod.Config) -> dict[str, str]:
    """The engines of `cfg` that cannot run here with their options, and why; a UserError if
    none can."""
    out = {}
    for e in cfg.engines:
        reason = REGISTRY[e].unavailable(_options(cfg, e, 1))
        if reason:
            out[e] = reason
    if len(out) == len(cfg.engines):
        e, why = next(iter(out.items()))
        raise UserError(f"engines: no engine of the config can run here ({e}: {why})")
    return out


def engines_block(names: list[str]) -> dict[str, Any]:
    """env.json `engines`: what each engine of the run is (its traits), so that analysis never
    needs to know engines by name."""
    return {e: {"traits": REGISTRY[e].traits.to_json()} for e in names}


def check_dirs(dirs: list[str], engines: list[str]) -> None:
    """Each directory exists and is writable, and takes O_DIRECT if an engine needs it."""
    for t in dirs:
        if not os.path.isdir(t):
            raise UserError(
                f"target {t}: does not exist or is not a directory (create it or fix targets)"
            )
        if not os.access(t, os.W_OK | os.X_OK):
            raise UserError(f"target {t}: is not writable by this user")
    users = ", ".join(e for e in engines if REGISTRY[e].traits.o_direct)
    if users:
        for t in dirs:
            reason = odirect.probe(t)
            if reason:
                raise UserError(
                    f"target {t}: {reason}; needed by {users} (use a disk-backed target)"
                )


def check_space(cfg: config_mod.Config, targets: list[str], wls: list[Workload],
                scale: int = 1) -> None:  # fmt: skip
    """Enough free space on every target for the largest checkpoint it will hold at once.

    Target i holds a stripe 1/N of a checkpoint over N targets (the smallest N that includes it);
    the first target also holds whole checkpoints of the baselines. Model presets are sized when
    built; a full disk during a case is recorded as that case's error row. `scale`: how many
    checkpoints of that size are written at once (ranks that each save a whole total).
    """
    largest = scale * max((w.total_bytes for w in wls if w.kind == "synthetic"), default=0)
    if not largest:
        return
    baselines = any(not REGISTRY[e].traits.stripes for e in cfg.engines)
    for i, t in enumerate(targets[: max(cfg.ssd_counts)]):
        n = min(c for c in cfg.ssd_counts if c > i)
        share = largest if (i == 0 and baselines) else -(-largest // n)
        need = int(share * 1.05) + (64 << 20)  # stripes round up to chunks; temp files
        free = shutil.disk_usage(t).free
        if free < need:
            raise UserError(
                f"target {t}: {sizes.format_size(free)} free, but a "
                f"{sizes.format_size(largest)} checkpoint needs {sizes.format_size(need)} here"
            )


def _options(cfg: config_mod.Config, engine: str, n_targets: int,
             indices: list[int] | None = None) -> dict[str, Any]:  # fmt: skip
    """The engine's options for a case over the first `n_targets` targets (or the targets at
    `indices`, with their write caps)."""
    opts = config_mod.engine_options(cfg, engine)
    fields = ENGINES[engine].options.model_fields
    all_caps = cfg.target_caps()
    caps = [all_caps[i] for i in indices] if indices is not None else all_caps[:n_targets]
    if "max_write_bw" in fields and any(caps):
        opts["max_write_bw"] = caps
    return opts


def efficiency(row: dict[str, Any], ceilings: dict[str, Any] | None,
               traits: Traits | None = None) -> tuple[Any, Any]:  # fmt: skip
    """(persist, snapshot) efficiency of a row against the run's ceilings, or None.

    Persist: bytes / persist_s (total_s for the synchronous engines) over the ceiling of the
    engine's write (`traits.write_ceiling()`: O_DIRECT, or buffered for page-cache paths).
    Snapshot: bytes / stall_s of an engine whose stall is a snapshot out of device memory over
    the copy ceiling (device-to-host on CUDA).
    """
    if not ceilings or not row.get("total_s"):
        return None, None
    tr = traits or REGISTRY[row["engine"]].traits
    c = ceilings["per_ssd_count"].get(str(row["n_targets"]))
    key = f"{tr.write_ceiling()}_Bps"
    persist = None
    if c and key in c:
        t = row["persist_s"] if row["persist_s"] and row["persist_s"] > 0 else row["total_s"]
        persist = round(row["total_bytes"] / t / c[key], 4)
    snapshot = None
    copy = ceilings.get("d2h_Bps") or ceilings.get("copy_Bps")
    if tr.stall == "snapshot" and not tr.baseline and copy and row["stall_s"]:
        snapshot = round(row["total_bytes"] / row["stall_s"] / copy, 4)
    return persist, snapshot


def _tensor_stats(state: Any) -> tuple[int, int]:
    from bench.manifest import flatten  # noqa: PLC0415

    _, tensors = flatten(state)
    return len(tensors), sum(t.numel() * t.element_size() for _, t in tensors)


class Runner:
    """Runs one config and writes its run directory."""

    def __init__(
        self,
        cfg: config_mod.Config,
        out_root: str,
        quiet: bool = False,
        resume: str | None = None,
    ) -> None:
        self.cfg = cfg
        self.out_root = out_root
        self.quiet = quiet
        self.resume = resume
        self.failures = 0
        self.notes: list[str] = []
        self.run_dir: str | None = None
        self.done: set[tuple[str, bool, int]] = set()
        self.skipped_engines: dict[str, str] = {}

    def log(self, msg: str) -> None:
        if not self.quiet:
            tqdm.write(msg, file=sys.stderr)

    def run(self) -> str:
        cfg = self.cfg
        device = devices.detect(cfg.device)
        targets = cfg.resolved_targets()
        if not cfg.targets:
            for t in targets:
                os.makedirs(t, exist_ok=True)
        wls = workloads(cfg)
        self.skipped_engines = skipped_engines(cfg)
        for e, why in self.skipped_engines.items():
            self.notes.append(f"engine {e} skipped: it cannot run here: {why}")
            self.log(f"warning: engine {e} skipped: {why}")
        preflight(cfg, targets, wls)
        self.device = device
        if self.resume:
            envb = self._resume_from(self.resume)
        else:
            self.run_id, self.run_dir = results.new_run_dir(self.out_root, cfg.name)
            envb = env.collect(targets[: max(cfg.ssd_counts)])
            envb["device"] = {"kind": device.kind, "emulated": device.emulated}
            envb["config"] = config_mod.resolved(cfg)
            envb["engines"] = engines_block(cfg.engines)
        if envb["storage"]["shared_device"]:
            self.notes.append(
                "all targets share one device: SSD-count scaling on this run is not real scaling"
            )
        if envb.get("vm", {}).get("memory_balloon"):
            self.notes.append(
                "a VM with a memory balloon: memory touched afresh (new page-cache pages) may pay "
                "a host fault per page, which slows the buffered paths (cpu-double, baselines)"
            )
        drop_reason = measure.drop_page_cache()
        self.cache_dropped = drop_reason is None
        if drop_reason:
            self.notes.append(f"page cache not dropped between cases: {drop_reason}")
            self.log(f"warning: {drop_reason}")
        if cfg.ceilings.enabled and "ceilings" not in envb:
            ceil, why = self.measure_ceilings(targets, wls)
            if ceil is not None:
                envb["ceilings"] = ceil
                envb.pop("ceilings_error", None)
            else:
                envb["ceilings_error"] = why
        self.ceilings = envb.get("ceilings")
        envb["notes"] = sorted(set(envb.get("notes", []) + self.notes))
        results.write_json(os.path.join(self.run_dir, "env.json"), envb)
        self.writer = results.RowWriter(os.path.join(self.run_dir, "results.csv"))
        per_n = sum(len(self.engines_at(n)) for n in cfg.ssd_counts)
        n_saves = per_n * len(wls) * (cfg.warmups + cfg.repetitions)
        self.log(f"run {self.run_id}: {n_saves} saves on {device.kind}; results in {self.run_dir}"
                 + (f" ({len(self.done)} already recorded)" if self.done else ""))  # fmt: skip
        self.bar = tqdm(total=n_saves, unit="save", file=sys.stderr, disable=self.quiet,
                        dynamic_ncols=True, initial=len(self.done))  # fmt: skip
        try:
            for n in cfg.ssd_counts:
                self._run_targets(targets[:n], wls)
        finally:
            self.bar.close()
            self.writer.close()
        return self.run_dir

    def measure_ceilings(self, targets: list[str],
                         wls: list[Workload]) -> tuple[dict[str, Any] | None, str]:  # fmt: skip
        """(the ceilings, "") or, when a probe cannot finish (a full disk, fio failing), (None,
        why): a ceiling is a reference, not the benchmark, so that is said loudly in the notes
        and the engines still run, without efficiency columns."""
        try:
            return self._ceilings(targets, wls), ""
        except (OSError, RuntimeError, ValueError) as e:
            why = " ".join(str(e).split())[:300]
            self.notes.append(f"device ceilings not measured: {why}")
            self.log(f"warning: device ceilings not measured ({why}); no efficiency columns")
            return None, why

    def _ceilings(self, targets: list[str], wls: list[Workload]) -> dict[str, Any] | None:
        """Measure the device ceilings for this sweep (see bench.ceiling)."""
        cfg = self.cfg
        spec = cfg.ceilings
        if spec.tool == "fio" and not ceiling.fio_version():
            raise UserError(
                "ceilings.tool: fio is not installed (apt-get install fio, or use auto)"
            )
        sizes_ = [w.total_bytes for w in wls if w.kind == "synthetic"]
        largest = max(sizes_, default=1 << 30)
        opts = config_mod.resolved(cfg)["engine_options"]
        block = next((o["chunk_bytes"] for o in opts.values() if "chunk_bytes" in o), 16 << 20)
        self.log("measuring device ceilings (storage with "
                 f"{'fio' if spec.tool != 'builtin' and ceiling.fio_version() else 'built-in probe'}, "
                 "memory copy)")  # fmt: skip
        drop = measure.drop_page_cache if self.cache_dropped else None
        out = ceiling.measure(targets, cfg.ssd_counts, largest, block, spec.queue_depth,
                              self.device, use_fio=spec.tool != "builtin", drop=drop,
                              caps=cfg.target_caps(), repetitions=spec.repetitions)  # fmt: skip
        if drop:
            drop()
        return out

    def _resume_from(self, run_dir: str) -> dict[str, Any]:
        """Continue `run_dir`: same config (else refuse), skip the rows already recorded."""
        env_path = os.path.join(run_dir, "env.json")
        rows_path = os.path.join(run_dir, "results.csv")
        if not (os.path.isfile(env_path) and os.path.isfile(rows_path)):
            raise UserError(
                f"--resume {run_dir}: not a run directory (needs env.json and results.csv)"
            )
        with open(env_path) as f:
            envb = json.load(f)
        old, new = envb.get("config", {}), json.loads(json.dumps(config_mod.resolved(self.cfg)))
        changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        if changed:
            k = changed[0]
            raise UserError(
                f"--resume {run_dir}: the config changed since that run ({k}: "
                f"{old.get(k)!r} then, {new.get(k)!r} now); start a new run instead"
            )
        if envb.get("device", {}).get("kind") != self.device.kind:
            raise UserError(
                f"--resume {run_dir}: it ran on {envb.get('device')}, this is {self.device.kind}"
            )
        self.run_dir = run_dir
        self.run_id = os.path.basename(os.path.normpath(run_dir))
        done = results.read_rows(run_dir)
        self.done = {
            (str(r.case_id), bool(r.warmup), int(r.rep)) for r in done.itertuples(index=False)
        }
        self.notes.append(f"resumed with {len(self.done)} rows already recorded")
        return envb

    def engines_at(self, n: int) -> list[str]:
        """Engines run with N targets: the baselines write to the first target only, whatever
        N is, so they run once, at the smallest SSD count (their rows say targets_used=1)."""
        first = min(self.cfg.ssd_counts)
        return [
            e
            for e in self.cfg.engines
            if e not in self.skipped_engines and (REGISTRY[e].traits.stripes or n == first)
        ]

    def _run_targets(self, targets: list[str], wls: list[Workload]) -> None:
        cfg = self.cfg
        names = self.engines_at(len(targets))
        engines = {e: create(e, targets, **_options(cfg, e, len(targets))) for e in names}
        try:
            for w in wls:
                todo = [
                    (i, name)
                    for i in range(cfg.warmups + cfg.repetitions)
                    for name in engines
                    if self._key(w, len(targets), name, i) not in self.done
                ]
                if not todo:
                    continue
                self.bar.set_description(f"{w.id} x{len(targets)}")
                state = w.build(cfg, self.device.torch_device)
                n_tensors, total = _tensor_stats(state)
                for eng in engines.values():
                    eng.warm(state)
                if self.cache_dropped:
                    measure.drop_page_cache()
                for i, name in todo:
                    row = self._one(
                        engines[name], name, state, w, len(targets), n_tensors, total, i
                    )
                    self.writer.write(row)
                    self.bar.update(1)
                    if row["error"] or (cfg.verify and not row["verified"]):
                        self.failures += 1
                        why = row["error"] or "restored state differs from the source"
                        self.log(f"case {row['case_id']} rep {row['rep']}: {why}")
                        if cfg.on_error == "stop":
                            raise UserError(
                                f"stopped after a failed case ({row['case_id']}); "
                                f"results so far are in {self.run_dir}"
                            )
                del state
        finally:
            for eng in engines.values():
                eng.close()

    def _key(self, w: Workload, n_targets: int, engine: str, i: int) -> tuple[str, bool, int]:
        """(case_id, warmup, rep) of repetition `i` (warm-ups first)."""
        warm = i < self.cfg.warmups
        return (f"{w.id}-x{n_targets}-{engine}", warm, i if warm else i - self.cfg.warmups)

    def _one(self, eng: Any, engine: str, state: Any, w: Workload, n_targets: int,
             n_tensors: int, total: int, i: int) -> dict[str, Any]:  # fmt: skip
        cfg = self.cfg
        case_id, warm, rep = self._key(w, n_targets, engine, i)
        name = f"ckptbench-{self.run_id}-{case_id}-{'w' if warm else 'r'}{rep}"
        capped = any(cfg.target_caps()[:n_targets]) and REGISTRY[engine].traits.stripes
        row = new_row(cfg, self.run_id, case_id, engine, eng, self.device, w, total, n_tensors,
                      n_targets, warm, rep, self.cache_dropped, capped)  # fmt: skip
        try:
            save_phase(row, eng, state, name, self.ceilings)
            restore_phase(row, eng, engine, state, name, self.device, cfg.verify)
        except Exception as e:  # noqa: BLE001 - one bad case must not lose the sweep
            row["error"] = error_text(e)
            if not isinstance(e, UserError | OSError):
                self.log(traceback.format_exc())
        finally:
            delete_checkpoint(eng, name, self.log)
        return row


# --- one repetition, in phases (bench.distributed puts barriers between them) -----------------


def new_row(cfg: config_mod.Config, run_id: str, case_id: str, engine: str, eng: Any,
            device: devices.Device, w: Workload, total: int, n_tensors: int, n_targets: int,
            warm: bool, rep: int, cache_dropped: bool, capped: bool) -> dict[str, Any]:  # fmt: skip
    """A result row with the case's identity filled and every measurement empty; a
    single-process row (rank 0 of 1 on this host)."""
    opts = getattr(eng, "options", None)
    return {
        "run_id": run_id, "case_id": case_id, "engine": engine,
        "device": device.kind, "emulated": device.emulated, "gds_mode": "none",
        "workload": w.id, "total_bytes": total, "tensor_bytes": w.tensor_bytes,
        "n_tensors": n_tensors, "n_targets": n_targets, "targets_used": 0, "rep": rep,
        "warmup": warm, "stall_s": None, "persist_s": None, "total_s": None,
        "restore_s": None, "hash_s": None, "wait_prev_s": None, "pinned_bytes": None,
        "page_cache_peak_bytes": None, "rss_peak_bytes": None, "cpu_user_s": None,
        "cpu_sys_s": None, "checksums": False, "staging_grew": False, "copied_tensors": 0,
        "cache_dropped": cache_dropped, "dtype": cfg.dtype if w.model is None else w.model.dtype,
        "options": json.dumps(opts.model_dump(), sort_keys=True) if opts else "{}",
        "capped": capped, "persist_efficiency": None, "snapshot_efficiency": None,
        "verified": False, "error": "",
        "rank": 0, "world_size": 1, "node": socket.gethostname(), "node_rank": 0,
        "aggregate": False, "ranks_active": 1, "target_map": "",
        "io_detail": "", "restore_mode": "",
    }  # fmt: skip


def save_phase(row: dict[str, Any], eng: Any, state: Any, name: str,
               ceilings: dict[str, Any] | None, after_save: Any = None) -> None:  # fmt: skip
    """Save `state` as `name` and wait until durable, sampling memory; fills the row's save
    columns. `after_save()`, if given, runs between save() returning and the wait (a hook for
    fault injection). Raises what the save raised."""
    sampler = measure.Sampler()
    sampler.start()
    try:
        pending = eng.save(state, name)
        if after_save is not None:
            after_save()
        res = pending.wait()
    finally:
        sample = sampler.stop()
    row.update(
        gds_mode=res.gds_mode, targets_used=res.targets_used, stall_s=res.stall_s,
        persist_s=res.persist_s, total_s=res.total_s, hash_s=res.hash_s,
        wait_prev_s=res.wait_prev_s, pinned_bytes=eng.pinned_bytes,
        checksums=res.checksums, staging_grew=res.staging_grew,
        copied_tensors=res.copied_tensors, **dataclasses.asdict(sample),
        io_detail=json.dumps(res.extra, sort_keys=True) if res.extra else "",
    )  # fmt: skip
    row["persist_efficiency"], row["snapshot_efficiency"] = efficiency(row, ceilings)


def restore_phase(row: dict[str, Any], eng: Any, engine: str, state: Any, name: str,
                  device: devices.Device, check: bool, load: Any = None) -> None:  # fmt: skip
    """Evict the checkpoint's pages, restore it (timed) and, if `check`, compare it with the
    source byte for byte; fills restore_s, verified and (on a difference) error. `load(name,
    device)` replaces `eng.load` (bench.distributed checks the world size first)."""
    measure.evict_files(eng.cached_files(name))
    t0 = measure.now_ns()
    loaded = (load or eng.load)(name, device=str(device.torch_device))
    device.synchronize()
    row["restore_s"] = (measure.now_ns() - t0) / 1e9
    row["restore_mode"] = getattr(eng, "restore_mode", "host")
    if check:
        loose = REGISTRY[engine].traits.loose_keys
        compare = verify.first_tensor_difference if loose else verify.first_difference
        diff = compare(state, loaded)
        row["verified"] = diff is None
        if diff:
            row["error"] = f"restored state differs at {diff}"
    del loaded


def error_text(e: BaseException) -> str:
    """An exception as one line for the row's error column."""
    return f"{type(e).__name__}: {e}".replace("\n", " ")


def delete_checkpoint(eng: Any, name: str, log: Any) -> None:
    """Remove checkpoint `name`; a failure is logged, never raised."""
    try:
        eng.delete(name)
    except OSError as e:
        log(f"could not delete checkpoint {name}: {e}")


def summary(run_dir: str) -> pd.DataFrame:
    """Median write GB/s, stall and page-cache growth per engine x workload x SSD count; with
    the persist and snapshot efficiencies when the run measured its ceilings."""
    df = results.read_rows(run_dir)
    df = df[(~df["warmup"].astype(bool)) & (df["error"].isna() | (df["error"] == ""))]
    if df.empty:
        return df
    df = df.assign(
        write_GBps=df["total_bytes"] / df["total_s"] / 1e9,
        restore_GBps=df["total_bytes"] / df["restore_s"] / 1e9,
        cache_pct=100 * df["page_cache_peak_bytes"] / df["total_bytes"],
    )
    g = df.groupby(["workload", "n_targets", "engine"], sort=False)
    cols = {
        "n": ("rep", "size"), "write_GBps": ("write_GBps", "median"),
        "stall_s": ("stall_s", "median"), "total_s": ("total_s", "median"),
        "restore_GBps": ("restore_GBps", "median"), "cache_pct": ("cache_pct", "median"),
        "gds_mode": ("gds_mode", "first"),
    }  # fmt: skip
    if df["persist_efficiency"].notna().any():
        cols["persist_eff"] = ("persist_efficiency", "median")
        cols["snapshot_eff"] = ("snapshot_efficiency", "median")
    out = g.agg(**cols)
    return out.round({"write_GBps": 2, "stall_s": 3, "total_s": 3, "restore_GBps": 2,
                      "cache_pct": 1, "persist_eff": 2, "snapshot_eff": 2})  # fmt: skip


def ceiling_lines(run_dir: str) -> list[str]:
    """The run's device ceilings, one line per SSD count, for the terminal summary."""
    import json  # noqa: PLC0415

    with open(os.path.join(run_dir, "env.json")) as f:
        c = json.load(f).get("ceilings")
    if not c:
        return []
    reps = f", median of {c['repetitions']}" if c.get("repetitions", 1) > 1 else ""
    head = (f"ceilings ({c['tool']}, {sizes.format_size(c['block_bytes'])} writes, queue depth "
            f"{c['queue_depth']}{reps}): copy into a warm buffer {c['copy_Bps'] / 1e9:.2f} GB/s")  # fmt: skip
    if c.get("d2h_Bps"):
        head += f", device-to-host {c['d2h_Bps'] / 1e9:.2f} GB/s"
    lines = [head]
    for n, v in c["per_ssd_count"].items():
        lines.append(f"  {n} target(s): O_DIRECT {_bw(v, 'direct_write')}, "
                     f"buffered + fsync {_bw(v, 'buffered_write')}")  # fmt: skip
    lines.append("  persist_eff: persist GB/s / the O_DIRECT (cpu-single, gds) or buffered "
                 "(cpu-double, baselines) ceiling; snapshot_eff: snapshot GB/s / copy ceiling")  # fmt: skip
    return lines


def _bw(v: dict[str, Any], mode: str) -> str:
    """A ceiling in GB/s, with its runs when there were several."""
    out = f"{v[mode + '_Bps'] / 1e9:.2f} GB/s"
    runs = v.get(mode + "_runs", [])
    if len(runs) > 1:
        out += " (runs " + " ".join(f"{r / 1e9:.2f}" for r in runs) + ")"
    return out


def mode_notes(run_dir: str) -> list[str]:
    """Loud labels for rows that must not be read as GPU or GDS numbers."""
    df = results.read_rows(run_dir)
    modes = set(df.loc[df["engine"] == "gds", "gds_mode"].astype(str))
    notes = []
    if "compat" in modes:
        notes.append("kvikio ran in compat mode: gds rows marked compat are NOT GPUDirect Storage")
    if "emulated" in modes:
        notes.append(
            "gds rows are a host emulation (O_DIRECT from host memory), not GPUDirect Storage"
        )
    if df["emulated"].astype(bool).any():
        notes.append("device=host-emulated: host memory stands in for GPU memory in every row")
    return notes
