"""The terminal summary of a sweep, computed by the code the report uses (analysis.runs for which
rows count, analysis.stats for the table, analysis.contention for multi-rank cases), so that
`ckptbench run` and `ckptbench report` can never disagree."""

from __future__ import annotations

import json
import os
from typing import Any

import pandas as pd

from analysis import contention, runs, stats
from bench import sizes
from bench.errors import UserError

COLUMNS = {  # summary_table column -> terminal header
    "mode": "mode",
    "n": "n",
    "write_GBps": "write_GBps",
    "stall_s": "stall_s",
    "total_s": "total_s",
    "restore_GBps": "restore_GBps",
    "page_cache_x": "cache_x",
    "pinned_x": "pinned_x",
    "persist_eff": "persist_eff",
    "snapshot_eff": "snapshot_eff",
}


def table(run: runs.Run) -> pd.DataFrame:
    """The report's summary table, in the terminal's columns and rounding."""
    t = stats.summary_table(run).set_index(stats.CASE)
    t = t[[c for c in COLUMNS if c in t.columns]].rename(columns=COLUMNS)
    return t.round(
        {
            "write_GBps": 2,
            "stall_s": 3,
            "total_s": 3,
            "restore_GBps": 2,
            "cache_x": 2,
            "pinned_x": 2,
            "persist_eff": 2,
            "snapshot_eff": 2,
        }
    )


def ceiling_lines(env: dict[str, Any]) -> list[str]:
    """The run's device ceilings, one line per SSD count."""
    c = env.get("ceilings")
    if not c:
        return []
    reps = f", median of {c['repetitions']}" if c.get("repetitions", 1) > 1 else ""
    head = (
        f"ceilings ({c['tool']}, {sizes.format_size(c['block_bytes'])} writes, queue depth "
        f"{c['queue_depth']}{reps}): copy into a warm buffer {c['copy_Bps'] / 1e9:.2f} GB/s"
    )
    if c.get("d2h_Bps"):
        head += f", device-to-host {c['d2h_Bps'] / 1e9:.2f} GB/s"
    lines = [head]
    for n, v in c["per_ssd_count"].items():
        lines.append(
            f"  {n} target(s): O_DIRECT {_bw(v, 'direct_write')}, "
            f"buffered + fsync {_bw(v, 'buffered_write')}"
        )
    lines.append(
        "  persist_eff: persist GB/s / the ceiling of the engine's write (O_DIRECT, or "
        "buffered for page-cache paths); snapshot_eff: snapshot GB/s / copy ceiling"
    )
    return lines


def _bw(v: dict[str, Any], mode: str) -> str:
    """A ceiling in GB/s, with its runs when there were several."""
    out = f"{v[mode + '_Bps'] / 1e9:.2f} GB/s"
    runs_ = v.get(mode + "_runs", [])
    if len(runs_) > 1:
        out += " (runs " + " ".join(f"{r / 1e9:.2f}" for r in runs_) + ")"
    return out


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
    rows = runs.normalise(pd.read_csv(os.path.join(run_dir, "results.csv")))
    for note in notes + mode_notes(rows):
        out.append(f"note: {note}")
    out.append(f"results: {run_dir}/results.csv, environment: {run_dir}/env.json")
    return out
