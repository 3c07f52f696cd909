"""What each path costs the host, from a run's rows (bench.measure.hostcost's columns): CPU-seconds per
GB made durable (this process and its children; the whole host, other processes and the idle
baseline taken away), split into the stall and the persist phase, the cores busy while the
checkpoint persists, and the host's DRAM traffic per checkpoint byte (measured from memory
controller counters where the run had them, else derived from the engine's copies:
bench.common.traits.Traits.dram_per_byte, labelled `derived`).

Every figure is the median over the engine's timed repetitions of every case, per byte of each
checkpoint (1 GB = 1e9 B). Runs recorded before the host columns existed have the process
figure only (cpu_user_s + cpu_sys_s, then this process's threads alone).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from analysis.runs import Run, order_engines
from bench.measure.floor import Floor

GB = 1e9
HOST_CSV = [
    "engine",
    "n",
    "process_cpu_s_per_GB",
    "host_cpu_s_per_GB",
    "stall_host_cpu_s_per_GB",
    "persist_host_cpu_s_per_GB",
    "cores_persisting",
    "dram_bytes_per_byte",
    "dram_source",
    "dram_bytes_per_byte_gpu",
    "write_GBps",
]


def _num(df: pd.DataFrame, col: str) -> pd.Series:
    if col not in df:
        return pd.Series(np.nan, index=df.index, dtype=float)
    return pd.to_numeric(df[col], errors="coerce")


def per_row(df: pd.DataFrame) -> pd.DataFrame:
    """Per repetition: CPU-seconds per GB (process, host, host in the stall and in the
    persist phase), cores busy while persisting, measured DRAM bytes per byte."""
    gb = df["total_bytes"].astype(float) / GB
    proc = _num(df, "cpu_user_s") + _num(df, "cpu_sys_s")
    host, stall_host = _num(df, "host_cpu_s"), _num(df, "stall_host_cpu_s")
    persist = _num(df, "persist_s")
    durable = persist.fillna(0) <= 0  # it persisted inside its stall
    # A save durable when save() returned has no persist phase: what the readings caught
    # between its return and the wait is their own rounding, not the path's work.
    stall_host = stall_host.where(~durable, host)
    out = pd.DataFrame(
        {
            "engine": df["engine"],
            "workload": df["workload"],
            "tensor_bytes": df["tensor_bytes"],
            "n_targets": df["n_targets"],
            "process_cpu_s_per_GB": proc / gb,
            "stall_cpu_s_per_GB": _num(df, "stall_cpu_s").where(~durable, proc) / gb,
            "host_cpu_s_per_GB": host / gb,
            "stall_host_cpu_s_per_GB": stall_host / gb,
            "persist_host_cpu_s_per_GB": (host - stall_host) / gb,
            # Cores busy while the bytes persist: the persist phase of a snapshot path; all of
            # the save for a path that persists inside its stall.
            "cores_persisting": np.where(
                durable, host / _num(df, "total_s"), (host - stall_host) / persist
            ),
            "dram_bytes_per_byte": _num(df, "dram_bytes") / df["total_bytes"].astype(float),
            "write_GBps": df["total_bytes"].astype(float) / _num(df, "total_s") / GB,
        },
        index=df.index,
    )
    return out


def table(run: Run) -> pd.DataFrame:
    """Per engine (house order): the medians of `per_row` over every timed repetition, DRAM
    bytes per byte measured or derived (for this run's device, and for a GPU server)."""
    rows = per_row(run.ok)
    out = []
    for e in order_engines(rows["engine"]):
        r = rows[rows["engine"] == e]
        t = run.traits(e)
        med = {c: float(r[c].median()) for c in r.columns if c not in ("engine", "workload")}
        measured = r["dram_bytes_per_byte"].notna().any()
        derived = sum(t.dram_per_byte(run.emulated)) if t is not None else np.nan
        out.append(
            {
                "engine": e,
                "n": len(r),
                **{k: med[k] for k in HOST_CSV if k in med},
                "dram_bytes_per_byte": med["dram_bytes_per_byte"] if measured else derived,
                "dram_source": "measured"
                if measured
                else ("derived (emulated)" if run.emulated else "derived"),
                "dram_bytes_per_byte_gpu": sum(t.dram_per_byte(False)) if t else np.nan,
            }
        )
    return pd.DataFrame(out, columns=HOST_CSV)


def kernel_beside(run: Run) -> tuple[list[str], list[str]]:
    """Engines whose host figure exceeds their process figure beyond the noise (the
    interquartile range of host_cpu_s - process CPU over their repetitions lies above zero:
    kernel threads and interrupts worked beside them), and those where it lies below (the
    baseline took away more than the kernel did for them)."""
    df = run.ok
    diff = _num(df, "host_cpu_s") - _num(df, "cpu_user_s") - _num(df, "cpu_sys_s")
    more, less = [], []
    for e in order_engines(df["engine"]):
        d = diff[df["engine"] == e].dropna()
        if len(d) < 2:
            continue
        if d.quantile(0.25) > 0:
            more.append(e)
        elif d.quantile(0.75) < 0:
            less.append(e)
    return more, less


def has_host(run: Run) -> bool:
    """Whether the run recorded the whole host's CPU (bench.measure.hostcost), not only the process's."""
    return bool(_num(run.ok, "host_cpu_s").notna().any())


def rows_md(t: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """The report's table of `table`."""

    def f(v: Any, fmt: str = "{:.2f}") -> str:
        return "-" if v is None or (isinstance(v, float) and np.isnan(v)) else fmt.format(v)

    headers = [
        "engine",
        "n",
        "CPU s/GB, process",
        "CPU s/GB, host",
        "host: stall",
        "host: persist",
        "cores busy persisting",
        "DRAM B/B",
        "DRAM B/B on a GPU (derived)",
        "write GB/s",
    ]
    rows = []
    for _, r in t.iterrows():
        rows.append(
            [
                r["engine"],
                str(int(r["n"])),
                f(r["process_cpu_s_per_GB"]),
                f(r["host_cpu_s_per_GB"]),
                f(r["stall_host_cpu_s_per_GB"]),
                f(r["persist_host_cpu_s_per_GB"]),
                f(r["cores_persisting"]),
                f(r["dram_bytes_per_byte"], "{:.1f}") + f" ({r['dram_source']})",
                f(r["dram_bytes_per_byte_gpu"], "{:.1f}"),
                f(r["write_GBps"]),
            ]
        )
    return headers, rows


def cpu_cost(run: Run) -> dict[str, tuple[float, float, str]]:
    """Per engine, CPU-seconds per GB durable for the model: (whole save, persist phase, what
    it is): the whole host's where the run measured it, else the process's."""
    t = table(run)
    host = has_host(run)
    out = {}
    for _, r in t.iterrows():
        if host and not np.isnan(r["host_cpu_s_per_GB"]):
            total, persist, what = (
                r["host_cpu_s_per_GB"],
                r["persist_host_cpu_s_per_GB"],
                "host",
            )
        else:
            total, persist, what = r["process_cpu_s_per_GB"], np.nan, "process"
        if not np.isnan(total):
            out[str(r["engine"])] = (float(total), float(persist), what)
    return out


# The floor's table (bench.measure.floor): each path's CPU per GB beside what its work must cost
FLOOR_HEADERS = ["engine", "CPU s/GB", "floor s/GB", "x floor", "floor =", "its own parts, s/GB"]
# The parts an engine times itself (its io_detail, and hash_s), as the table names them
OWN_PARTS: tuple[tuple[str, str], ...] = (
    ("copy_s", "copy"),
    ("hash_s", "hash"),
    ("post_s", "submit"),
    ("poll_s", "complete"),
    ("fsync_s", "fsync"),
)


def floor(run: Run) -> Floor | None:
    """The run's CPU floor (env.json `cpu_floor`), or None for a run without one."""
    d = run.env.get("cpu_floor")
    return Floor.from_json(d) if d else None


def floor_of(f: Floor, run: Run, engine: str, hashes: bool) -> tuple[float, str]:
    """Engine `engine`'s floor in CPU-s per GB and what it adds up: the O_DIRECT write, plus
    the copy for a snapshot path (host-emulated: on a GPU the snapshot is the device's DMA),
    the hash where it checksums, the serialisation where it serialises. NaN where the write
    was not measured (no fio, no built-in run)."""
    t = run.traits(engine)
    parts = [("write", "fio" if f.io_tool.startswith("fio") else "write")]
    if t is not None and t.stall == "snapshot" and run.emulated:
        parts.append(("copy", "copy"))
    if hashes:
        parts.append(("hash", "hash"))
    if t is not None and t.serializes:
        parts.append(("serialize", "serialise"))
    vals = [f.per_GB(p) for p, _ in parts]
    total = float("nan") if any(v is None for v in vals) else float(sum(v or 0.0 for v in vals))
    return total, " + ".join(name for _, name in parts)


def _own_parts(df: pd.DataFrame) -> str:
    """The parts of a save the engine timed itself (wall seconds per GB, medians), as a line."""
    import json

    gb = df["total_bytes"].astype(float) / GB
    got: dict[str, pd.Series] = {}
    details = [json.loads(x) if isinstance(x, str) and x else {} for x in df.get("io_detail", [])]
    for key, name in OWN_PARTS:
        if key == "hash_s":
            v = _num(df, "hash_s")
        else:
            v = pd.Series([d.get(key, np.nan) for d in details] or np.nan, index=df.index)
            v = pd.to_numeric(v, errors="coerce")
        per = v / gb
        if per.notna().any() and float(per.median()) > 0:
            got[name] = per
    return ", ".join(f"{k} {float(v.median()):.2f}" for k, v in got.items()) or "-"


def floor_table(run: Run) -> pd.DataFrame:
    """Per engine: its CPU per GB (the host's where measured, else the process's), its floor,
    the ratio, what the floor adds up, and the parts it timed itself."""
    f = floor(run)
    t = table(run).set_index("engine")
    host = has_host(run)
    out = []
    for e in t.index:
        rows = run.ok[run.ok["engine"] == e]
        hashes = bool(rows["checksums"].astype(str).str.lower().isin(["true", "1"]).any())
        cpu = float(t.loc[e, "host_cpu_s_per_GB" if host else "process_cpu_s_per_GB"])
        fl, what = floor_of(f, run, e, hashes) if f is not None else (float("nan"), "")
        out.append(
            {
                "engine": e,
                "cpu_s_per_GB": cpu,
                "floor_cpu_s_per_GB": fl,
                "x_floor": cpu / fl if fl and not np.isnan(fl) else float("nan"),
                "floor_is": what,
                "own_parts": _own_parts(rows),
            }
        )
    return pd.DataFrame(out)


def floor_rows(t: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """The report's table of `floor_table`."""

    def f(v: float) -> str:
        return "-" if np.isnan(v) else f"{v:.2f}"

    rows = [
        [
            r["engine"],
            f(r["cpu_s_per_GB"]),
            f(r["floor_cpu_s_per_GB"]),
            f(r["x_floor"]),
            r["floor_is"] or "-",
            r["own_parts"],
        ]
        for _, r in t.iterrows()
    ]
    return FLOOR_HEADERS, rows


def floor_sentence(run: Run) -> str:
    """How the floor was measured, its parts per GB, and the path furthest above it."""
    f = floor(run)
    if f is None:
        return "This run measured no CPU floor (its ceilings were off, or it predates the floor)."
    parts = ", ".join(
        f"{name} {v:.3f}"
        for name, v in (
            ("O_DIRECT write", f.per_GB("write")),
            ("read", f.per_GB("read")),
            ("copy into warm memory", f.per_GB("copy")),
            ("xxh3", f.per_GB("hash")),
            ("torch.save", f.per_GB("serialize")),
        )
        if v is not None
    )
    io = (
        f"{f.io_tool}: no I/O floor, so no ratio"
        if f.write_cpu_s is None
        else f"I/O by {f.io_tool}, {f.block_bytes >> 20} MiB blocks, depth {f.depth}"
    )
    text = (
        f"**The CPU floor** (CPU-s per GB, measured in this run on "
        f"{f.nbytes / GB:.2f} GB; {io}): {parts}. Each path's floor adds up the parts its work "
        "needs (a snapshot path: copy + hash + write; a direct path: hash + write; a peer that "
        "hashes nothing: write, plus its serialisation)."
    )
    t = floor_table(run).dropna(subset=["x_floor"])
    if not t.empty:
        top = t.loc[t["x_floor"].idxmax()]
        low = t.loc[t["x_floor"].idxmin()]
        text += (
            f" Furthest above its floor: {top['engine']}, {top['x_floor']:.1f}x; closest: "
            f"{low['engine']}, {low['x_floor']:.1f}x."
        )
        under = t[t["x_floor"] < 1]
        if not under.empty:
            names = ", ".join(f"{r['engine']} ({r['x_floor']:.2f}x)" for _, r in under.iterrows())
            text += (
                f" Below their floor: {names}. Their floor is no floor for them: the tools it "
                "times (fio's submission, a single-thread copy and hash) cost more than the way "
                "these paths do the same work, or the two measurements differ by their noise; "
                "read them as at their floor, not as beating it."
            )
    return text
