"""The terminal summary of a sweep, computed by the code the report uses (analysis.runs for which
rows count, analysis.stats for the table, analysis.contention for multi-rank cases), so that
`ckptbench run` and `ckptbench report` can never disagree."""

from __future__ import annotations

import json
import os
from typing import Any

import pandas as pd

from analysis import contention, runs, stats
from bench.common import sizes
from bench.common.errors import UserError
from bench.measure import results
from bench.measure.ceilings import Ceilings, Kind, RunCeilings

COLUMNS = {  # summary_table column -> terminal header
    "mode": "mode",
    "n": "n",
    "write_GBps": "write_GBps",
    "stall_s": "stall_s",
    "total_s": "total_s",
    "n_tensors": "tensors",
    "stall_us_per_tensor": "stall_us/tensor",
    "persist_us_per_tensor": "persist_us/tensor",
    "restore_GBps": "restore_GBps",
    "page_cache_x": "cache_x",
    "pinned_x": "pinned_x",
    "write_eff": "write_eff",
    "snapshot_eff": "snapshot_eff",
    "x_best_baseline_stall": "x_base_stall",
    "x_best_baseline_durable": "x_base_durable",
    "x_best_baseline_restore": "x_base_restore",
}


def table(run: runs.Run) -> pd.DataFrame:
    """The report's summary table, in the terminal's columns and rounding; an efficiency above
    1.05 reads 'ceiling beaten', as in the report."""
    t = stats.summary_table(run).set_index(stats.CASE)
    t = t[[c for c in COLUMNS if c in t.columns]].rename(columns=COLUMNS)
    t = t.round(
        {
            "write_GBps": 2,
            "stall_s": 3,
            "total_s": 3,
            "stall_us/tensor": 1,
            "persist_us/tensor": 1,
            "restore_GBps": 2,
            "cache_x": 2,
            "pinned_x": 2,
            "x_base_stall": 2,
            "x_base_durable": 2,
            "x_base_restore": 2,
        }
    )
    if t["write_eff"].notna().any():
        for c in ("write_eff", "snapshot_eff"):
            t[c] = [stats.fmt_eff(x) for x in t[c]]
    else:
        t = t.drop(columns=["write_eff", "snapshot_eff"])
    return t


def ceiling_lines(env: dict[str, Any]) -> list[str]:
    """The run's device ceilings (before and, when measured, after the sweep)."""
    measured = RunCeilings.from_env(env)
    c = measured.before
    if c is None:
        return []
    after = measured.after or Ceilings()
    how = c.method
    host = [f"{kind.label} {_gb(c, after, kind)}" for kind, n, _ in c.measured() if n is None]
    head = (
        f"ceilings ({how.tool or '?'}"
        + (f" writing from {how.fio_buffers}" if how.fio_buffers else "")
        + (f", {sizes.format_size(how.block_bytes)} writes" if how.block_bytes else "")
        + f", best of {how.repetitions or 1} runs after a search, copies by "
        f"{how.copy_threads or 1} thread(s); before"
        + (" / after the sweep" if measured.after else "")
        + "): "
        + ", ".join(host)
    )
    lines = [head]
    for n in sorted(c.counts):
        parts = [
            f"{kind.label} {_gb(c, after, kind, n)}"
            + (f" ({kind.describe(m)})" if m.writers else "")
            for kind, at, m in c.measured()
            if at == n
        ]
        lines.append(f"  {n} target(s): " + ", ".join(parts))
    lines.append(
        "  write_eff: bytes / (save() until durable) over the ceiling of the engine's "
        "kind of write; snapshot_eff: bytes / stall over the copy ceiling; against the "
        "best of before, after and the probes between workloads"
    )
    return lines


def _gb(before: Ceilings, after: Ceilings, kind: Kind, n: int | None = None) -> str:
    b, a = before.at(kind, n), after.at(kind, n)
    out = f"{b.Bps / 1e9:.2f}" if b and b.Bps else "-"
    if a and a.Bps:
        out += f" / {a.Bps / 1e9:.2f}"
    return out + " GB/s"


def mode_notes(rows: pd.DataFrame) -> list[str]:
    """Loud labels for rows that must not be read as GPU or GDS numbers."""
    notes = []
    compat = sorted(set(rows.loc[rows["gds_mode"] == "compat", "engine"]))
    if compat:
        notes.append(
            f"kvikio ran in compat mode: {', '.join(compat)} rows marked compat are "
            "NOT GPUDirect Storage"
        )
    emulated = sorted(set(rows.loc[rows["gds_mode"] == "emulated", "engine"]))
    if emulated:
        notes.append(
            f"{', '.join(emulated)} rows are a host emulation (O_DIRECT from host "
            "memory), not GPUDirect Storage"
        )
    if rows["emulated"].astype(bool).any():
        notes.append("device=host-emulated: host memory stands in for GPU memory in every row")
    return notes


def bandwidth_notes(t: pd.DataFrame) -> list[str]:
    """'aggregate write bandwidth of k ranks against one rank' lines (multi-rank runs)."""
    notes = []
    for (wl, n, e), grp in t.groupby(["workload", "n_targets", "engine"], sort=False):
        one = grp[grp["ranks_active"] == 1]["agg_GBps"]
        base = float(one.iloc[0]) if len(one) else None
        parts = [f"1 rank {base:.2f} GB/s"] if base else []
        for _, r in grp[grp["ranks_active"] > 1].iterrows():
            x = f" ({r['agg_GBps'] / base:.2f}x)" if base else ""
            parts.append(f"{r['ranks_active']} ranks {r['target_map']} {r['agg_GBps']:.2f} GB/s{x}")
        if parts:
            notes.append(f"aggregate write bandwidth, {e}, {wl}, {n} SSD(s): " + "; ".join(parts))
    return notes


def terminal(run_dir: str, notes: list[str]) -> list[str]:
    """Every line `ckptbench run` prints after a sweep."""
    out: list[str] = []
    try:
        run = runs.load(run_dir)
    except UserError as e:
        run = None
        out.append(f"no summary: {e}")
    if run is not None:
        with pd.option_context("display.width", 200, "display.max_columns", 30):
            out.append(table(run).to_string())
            if contention.present(run):
                c = contention.table(run, None)
                cols = [
                    "workload",
                    "n_targets",
                    "target_map",
                    "ranks_active",
                    "engine",
                    "n",
                    "stall_s",
                    "total_s",
                    "agg_GBps",
                ]
                out.append(
                    "aggregate rows (stall: the slowest rank; GB/s: all ranks' bytes / "
                    "the slowest rank's total_s):"
                )
                out.append(c[cols].round(3).to_string(index=False))
                notes = notes + bandwidth_notes(c)
    with open(os.path.join(run_dir, "env.json")) as f:
        env = json.load(f)
    out += ceiling_lines(env)
    rows = runs.normalise(results.read_rows(run_dir))
    for note in notes + mode_notes(rows) + runs.witness_lines(rows):
        out.append(f"note: {note}")
    out.append(f"results: {run_dir}/results.csv, environment: {run_dir}/env.json")
    return out
