"""Other tools' results as the other side of `ckptbench compare RUN OTHER...`.

A user sets a ckptbench run next to a published number or a colleague's: fio's JSON output
(`--output-format=json`), gdsio's output (its `IoType: ... Throughput: ... GiB/sec` lines), a
DLIO run of MLPerf Storage's checkpointing workload (its `summary.json`, or the folder that holds
it), or MLPerf Storage's results table (`results.csv`, its "Write B/W (GiB/s)" and "Read B/W
(GiB/s)" columns). Each becomes `Point`s: a direction (write or read), its bandwidth in decimal
GB/s as ckptbench reports it (gdsio's and DLIO's GiB/s converted), whether its timing ran until
the bytes were durable, and whether they moved to or from GPU memory. The environment each file
records sits beside the run's.

What each tool's output shows of durability:
- fio: a write is durable when the job had `end_fsync`, `fsync=1`, `fdatasync=1` or `sync` (an
  fsync every N > 1 writes may miss the last ones: "unknown"); fio
  counts `end_fsync`'s final fsync in its runtime, but may stop its clock before the one of
  `fsync_on_close` (fio issue #831): "unknown".
- gdsio: its output does not say whether writes reached the media: "unknown".
- DLIO: "no" (`DLIO_FSYNC`: its `fsync` setting never reaches its save).

A GPU-side point (gdsio's GPUD or CPU_GPU paths) against a host-emulated run is an essential
difference: refused unless forced, as for two runs. fio and DLIO move host memory, so a
host-emulated run's storage-bound rows are a fair match for them.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

from bench.common.errors import UserError

GB = 1e9
GIB = 2**30


@dataclass(frozen=True)
class Point:
    """One measurement of another tool: a direction and its GB/s (one value per sample)."""

    label: str  # what it was, e.g. "fio job odirect-write"
    direction: str  # "write" | "read"
    GBps: tuple[float, ...]
    path: str  # the data path in words
    gpu: bool  # the bytes moved to or from GPU memory
    durable: bool | None  # writes: the timing ends when durable; None: the output does not say
    detail: str = ""  # block size, depth, threads: what a reader needs to judge it
    note: str = ""


@dataclass(frozen=True)
class External:
    """Another tool's result file: its points, and the environment it records."""

    path: str
    tool: str
    points: list[Point]
    env: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def is_run_dir(path: str) -> bool:
    """A ckptbench run directory (results.csv in it)."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, "results.csv"))


def load(path: str) -> External:
    """Read another tool's result file; a file of no known kind is a UserError naming it."""
    if os.path.isdir(path):
        summary = os.path.join(path, "summary.json")
        if os.path.isfile(summary):
            return load(summary)
        raise UserError(
            f"{path}: neither a ckptbench run (no results.csv) nor a DLIO output folder "
            "(no summary.json)"
        )
    if not os.path.isfile(path):
        raise UserError(f"{path}: no such run directory or result file")
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})") from None
    if path.lower().endswith(".csv"):
        return _mlperf_csv(path, text)
    doc = _json(text)
    if isinstance(doc, dict) and "fio version" in doc:
        return _fio(path, doc)
    if isinstance(doc, dict) and isinstance(doc.get("metric"), dict):
        return _dlio(path, doc)
    if doc is None and GDSIO_LINE.search(text):
        return _gdsio(path, text)
    raise UserError(
        f"{path}: not a result file compare knows (fio --output-format=json, gdsio's output, "
        "DLIO's summary.json or MLPerf Storage's results.csv)"
    )


def _json(text: str) -> Any:
    """The JSON document in `text` (fio may print notes before its opening brace), or None."""
    start = min((i for i in (text.find("{"), text.find("[")) if i >= 0), default=-1)
    if start < 0:
        return None
    try:
        return json.loads(text[start:])
    except ValueError:
        return None


def _num(path: str, where: str, value: Any) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise UserError(f"{path}: {where} is not a number ({value!r})") from None
    if not math.isfinite(out) or out < 0:
        raise UserError(f"{path}: {where} is not a number >= 0 ({value!r})")
    return out


def _rate(path: str, where: str, value: Any) -> float:
    """A bandwidth the other tool reports: a finite number above zero (a zero, negative or
    infinite rate is no measurement to compare against)."""
    out = _num(path, where, value)
    if not out > 0:
        raise UserError(f"{path}: {where} is not a rate above zero ({value!r})")
    return out


# --- fio ----------------------------------------------------------------------------------


def _on(v: Any) -> bool:
    return str(v).strip().lower() not in ("", "0", "false", "none", "no", "off")


def _fio_durable(opts: dict[str, Any]) -> tuple[bool | None, str]:
    if _on(opts.get("end_fsync", "")):
        return True, ""
    every = [str(opts.get(k, "")).strip() for k in ("fsync", "fdatasync")]
    if "1" in every:
        return True, ""
    if any(_on(v) for v in every):  # every N writes: the last ones may follow the last fsync
        return (
            None,
            "fsync or fdatasync every N > 1 writes without end_fsync: the last writes may come after the last fsync",
        )
    if str(opts.get("sync", "")).lower() in ("1", "sync", "dsync"):
        return True, ""
    if _on(opts.get("fsync_on_close", "")):
        return None, "fsync_on_close: fio may stop its clock before that fsync (fio issue #831)"
    return False, "no fsync in the job: the bytes may still be in the page cache or a disk cache"


def _fio(path: str, doc: dict[str, Any]) -> External:
    jobs = doc.get("jobs")
    if not isinstance(jobs, list) or not jobs:
        raise UserError(f"{path}: fio output without jobs")
    glob = doc.get("global options") or {}
    points = []
    for i, job in enumerate(jobs):
        if not isinstance(job, dict):
            raise UserError(f"{path}: jobs[{i}] is not an object")
        opts = {**glob, **(job.get("job options") or {})}
        name = str(job.get("jobname", f"job {i}"))
        direct = _on(opts.get("direct", "0")) or not _on(opts.get("buffered", "1"))
        for d in ("write", "read"):
            s = job.get(d)
            if not isinstance(s, dict):
                continue
            nbytes = _num(path, f"jobs[{i}].{d}.io_bytes", s.get("io_bytes", 0))
            ms = _num(path, f"jobs[{i}].{d}.runtime", s.get("runtime", 0))
            if nbytes <= 0 or ms <= 0:
                continue
            durable, note = _fio_durable(opts) if d == "write" else (None, "")
            depth = opts.get("iodepth", "1")
            points.append(
                Point(
                    label=f"fio job {name}",
                    direction=d,
                    GBps=(nbytes / (ms / 1e3) / GB,),
                    path=("O_DIRECT" if direct else "buffered") + " from host memory",
                    gpu=False,
                    durable=durable,
                    detail=f"bs={opts.get('bs', '4k')}, iodepth={depth}, "
                    f"numjobs={opts.get('numjobs', '1')}, ioengine={opts.get('ioengine', 'psync')}",
                    note=note,
                )
            )
    if not points:
        raise UserError(f"{path}: fio output with no bytes read or written")
    disks = [str(d.get("name")) for d in doc.get("disk_util") or [] if isinstance(d, dict)]
    hosts = {str(j["hostname"]) for j in jobs if isinstance(j, dict) and j.get("hostname")}
    env = {
        "tool": str(doc.get("fio version")),
        "when": str(doc.get("time", "?")),
        "storage": ", ".join(disks) or "?",
    }
    if hosts:
        env["host"] = ", ".join(sorted(hosts))
    return External(path, "fio", points, env)


# --- gdsio ----------------------------------------------------------------------------------

GDSIO_LINE = re.compile(
    r"IoType:\s*(?P<io>\w+)\s+XferType:\s*(?P<xfer>\w+)\s+Threads:\s*(?P<threads>\d+)\s+"
    r"(?:IoDepth:\s*\d+\s+)?DataSetSize:\s*(?P<done>\d+)(?:/\d+)?\s*\(KiB\)\s+IOSize:\s*(?P<iosize>[\d-]+)\s*\(KiB\)"
    r"\s+Throughput:\s*(?P<gib>[\d.]+)\s*GiB/sec"
)
# gdsio's transfer types as its output names them (GPUD, GPUD_ASYNC, GPU_BATCH, CPUONLY and
# CPU_GPU seen in published outputs; the other names after its -x options): what moves the
# bytes. A name not here is taken for a GPU path.
GDSIO_PATHS = {
    "GPUD": "GDS: storage <-> GPU memory",
    "GPUD_ASYNC": "GDS (async): storage <-> GPU memory",
    "GPU_BATCH": "GDS (batch): storage <-> GPU memory",
    "GPU_BATCH_STREAM": "GDS (batch, stream): storage <-> GPU memory",
    "CPUONLY": "storage <-> host memory",
    "CPU_GPU": "through host memory to GPU memory",
    "CPU_ASYNC_GPU": "through host memory to GPU memory (async)",
    "CPU_CACHED_GPU": "through the page cache to GPU memory",
}


def _gdsio(path: str, text: str) -> External:
    points = []
    for n, line in enumerate(text.splitlines(), 1):
        m = GDSIO_LINE.search(line)
        if m is None:
            if "IoType:" in line:
                raise UserError(
                    f"{path}: line {n}: a gdsio result line not understood: {line[:80]!r}"
                )
            continue
        io, xfer = m["io"].upper(), m["xfer"].upper()
        direction = "write" if "WRITE" in io else "read"
        points.append(
            Point(
                label=f"gdsio {io} {xfer}, {m['threads']} threads",
                direction=direction,
                GBps=(_rate(path, f"line {n}: Throughput (GiB/sec)", m["gib"]) * GIB / GB,),
                path=GDSIO_PATHS.get(xfer, f"gdsio transfer type {xfer}"),
                gpu=xfer != "CPUONLY",
                durable=None,
                detail=f"{io.lower()}, IOSize {m['iosize']} KiB",
                note="gdsio's output does not say whether writes reached the media"
                if direction == "write"
                else "",
            )
        )
    return External(path, "gdsio", points, {"tool": "gdsio"})


# --- MLPerf Storage (DLIO) -----------------------------------------------------------------

# DLIO names its checkpoint figures "GB" but divides bytes by 1024**3 (its checkpointing code,
# base_checkpointing.py, and statscounter.py): they are GiB and GiB/s.
DLIO_METRICS = {"write": "save_checkpoint_io_mean_GB_per_second",
                "read": "load_checkpoint_io_mean_GB_per_second"}  # fmt: skip
DLIO_NOTE = (
    "MLPerf's metric: the whole checkpoint (all ranks) over rank 0's duration, as DLIO computes it"
)
# DLIO of MLPerf Storage v2.0 (argonne-lcf/dlio_benchmark, branch mlperf_storage_v2.0, commit
# 392621b): utils/config.py stores the workload's `checkpoint.fsync` as `args.checkpoint_sync`
# (line 879), while the save passes `args.checkpoint_fsync` (checkpointing/base_checkpointing.py
# line 393 on; default False, config.py line 110) to save_state, which fsyncs only then
# (pytorch_checkpointing.py line 136): its checkpoint files are never fsync'd. The same holds at
# the newest DLIO read (commit e1919d7, 2026-06-17: config.py lines 110, 800 and 1080).
DLIO_FSYNC = (
    "DLIO never fsyncs its checkpoint files, MLPerf Storage v2.0's included (the workload's "
    "`fsync: True` is stored under another name than the one its save reads)"
)


def _dlio_samples(summary_path: str, direction: str) -> list[float]:
    """Rank 0's GiB/s per checkpoint from the per-epoch file beside summary.json, if there."""
    stats = os.path.join(os.path.dirname(summary_path) or ".", "0_per_epoch_stats.json")
    prefix = "save_ckpt" if direction == "write" else "load_ckpt"
    try:
        with open(stats) as f:
            per_epoch = json.load(f)
    except (OSError, ValueError):
        return []
    out = []
    for epoch in per_epoch.values() if isinstance(per_epoch, dict) else []:
        for key, rec in (epoch or {}).items():
            if key.startswith(prefix) and isinstance(rec, dict) and "throughput" in rec:
                out.append(_rate(stats, f"{key}.throughput", rec["throughput"]))
    return out


def _dlio_points(path: str, metric: dict[str, Any], label: str) -> list[Point]:
    points = []
    for direction, key in DLIO_METRICS.items():
        if key not in metric:
            continue
        gib = _dlio_samples(path, direction)
        mean = _rate(path, f"metric.{key}", metric[key])
        n = f"{len(gib)} checkpoints of rank 0" if gib else "the mean over its checkpoints"
        points.append(
            Point(
                label=f"{label} {'save' if direction == 'write' else 'load'}",
                direction=direction,
                GBps=tuple(v * GIB / GB for v in (gib or [mean])),
                path="torch.save / torch.load of host tensors (DLIO)",
                gpu=False,
                durable=False if direction == "write" else None,
                detail=f"checkpoint {_num(path, 'metric.checkpoint_size_GB', metric.get('checkpoint_size_GB', 0)):.3g} GiB; {n}",
                note=DLIO_NOTE + (f"; {DLIO_FSYNC}" if direction == "write" else ""),
            )
        )
    return points


def _model(path: str) -> str:
    """The workload's model name, from the hydra config DLIO writes beside its summary."""
    import yaml

    cfg = os.path.join(os.path.dirname(path) or ".", ".hydra", "config.yaml")
    try:
        with open(cfg) as f:
            doc = yaml.safe_load(f) or {}
        return str(doc["workload"]["model"]["name"])
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return "?"


def _total(v: Any) -> str:
    """DLIO's per-host lists (one value a host), summed."""
    if isinstance(v, list) and all(isinstance(x, (int, float)) for x in v) and v:
        return f"{sum(v):g}"
    return "?" if v is None else str(v)


def _dlio(path: str, doc: dict[str, Any]) -> External:
    points = _dlio_points(path, doc["metric"], f"DLIO {_model(path)}")
    if not points:
        raise UserError(
            f"{path}: a DLIO summary without checkpoint metrics (metric.{DLIO_METRICS['write']})"
        )
    mem = doc.get("host_memory_GB")
    env = {
        "tool": "DLIO (MLPerf Storage)",
        "when": str(doc.get("start", "?")),
        "host": str(doc.get("hostname", "?")),
        "hosts": str(doc.get("num_hosts", "?")),
        "accelerators": str(doc.get("num_accelerators", "?")),
        "CPU": str(doc.get("host_processor_name") or "?"),
        "cores": _total(doc.get("host_cpu_count")),
        "memory": f"{sum(mem):.0f} GiB" if isinstance(mem, list) and mem else "?",
    }
    return External(path, "dlio", points, env)


# MLPerf Storage's results table (mlpstorage reportgen's results.csv, as published): the
# checkpointing columns, in GiB/s (the rules' "checkpointResultAggregation")
MLPERF_COLUMNS = {"write": "Write B/W (GiB/s)", "read": "Read B/W (GiB/s)"}
MLPERF_LABELS = ["Public ID", "Organization", "Submitter", "System Name", "System", "Model"]


def _mlperf_csv(path: str, text: str) -> External:
    import csv
    import io

    rows = list(csv.DictReader(io.StringIO(text)))
    header = list(rows[0]) if rows else []
    if not any(c in header for c in MLPERF_COLUMNS.values()):
        raise UserError(
            f"{path}: a CSV without MLPerf Storage's checkpointing columns "
            f"({' or '.join(repr(c) for c in MLPERF_COLUMNS.values())})"
        )
    points = []
    for i, r in enumerate(rows, 2):  # line 1 is the header
        label = ", ".join(r[c] for c in MLPERF_LABELS if r.get(c)) or f"line {i}"
        for direction, col in MLPERF_COLUMNS.items():
            if not (r.get(col) or "").strip():
                continue
            gib = _rate(path, f"line {i}, {col!r}", r[col])
            points.append(
                Point(
                    label=f"MLPerf Storage {label}",
                    direction=direction,
                    GBps=(gib * GIB / GB,),
                    path="DLIO's torch.save / torch.load on the submitted storage",
                    gpu=False,
                    durable=False if direction == "write" else None,
                    detail=f"line {i}",
                    note=DLIO_NOTE + (f"; {DLIO_FSYNC}" if direction == "write" else ""),
                )
            )
    if not points:
        raise UserError(f"{path}: no row with a checkpoint bandwidth")
    return External(path, "MLPerf Storage results", points, {"tool": "MLPerf Storage"})


# --- set against a run ---------------------------------------------------------------------

# compare's metric -> the direction of the other tool's points it meets
DIRECTION = {"write": "write", "restore": "read"}


def refusals(a_emulated: bool, letter: str, ext: External) -> list[str]:
    """Essential differences: a real GPU path against a host-emulated run."""
    gpu = sorted({p.path for p in ext.points if p.gpu})
    if not a_emulated or not gpu:
        return []
    return [
        f"{letter} ({ext.tool}) moved bytes to or from GPU memory ({'; '.join(gpu)}); A is "
        "host-emulated: its gds rows are an O_DIRECT emulation from host memory"
    ]


def warnings(metric: str, letter: str, ext: External) -> list[str]:
    """What makes the other side a different yardstick, said once per point."""
    out = []
    for p in ext.points:
        if p.direction != DIRECTION[metric]:
            continue
        if p.direction == "write" and p.durable is not True:
            why = "does not include" if p.durable is False else "may not include"
            out.append(
                f"{letter} {p.label}: its timing {why} making the bytes durable (fsync), while "
                f"A's write GB/s runs until they are" + (f" ({p.note})" if p.note else "")
            )
        elif p.note and p.direction == "read":
            out.append(f"{letter} {p.label}: {p.note}")
    if not any(p.direction == DIRECTION[metric] for p in ext.points):
        have = ", ".join(sorted({p.direction for p in ext.points}))
        out.append(f"{letter} ({ext.path}) has no {DIRECTION[metric]} measurement (it has: {have})")
    return out
