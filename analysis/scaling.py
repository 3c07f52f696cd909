"""How the cost of a checkpoint grows with its size (configs/scaling.yaml, `make scaling`).

For each engine over the synthetic workloads of a run that sweeps the checkpoint size (at least
three sizes), the stall and the time to durability are fitted as a power law of the size,
log(t) = a + b log(S), by least squares over the per-size medians (scipy's linregress, with the
slope's standard error). A slope of 1 is linear: twice the bytes, twice the time. A slope above 1
by more than its noise says the engine's cost grows faster than its bytes (a copy made twice, a
cache that thrashes): that is a loud line of the report. Its figures are
analysis.figures.scaling (the times against size, log-log, with the fit and the model's line
beside the measured points; the host memory each path held against size: pinned staging,
page-cache peak, the process's RSS peak) and its section analysis.report.scaling.
"""

from __future__ import annotations

from typing import SupportsInt, cast

import numpy as np
import pandas as pd
from scipy import stats as sstats

from analysis.runs import Run
from bench.common.sizes import format_size

METRICS = {"stall_s": "stall", "total_s": "time to durability"}
MIN_SIZES = 3
# A slope counts as faster than linear when it is above 1 by this much and by twice its
# standard error: a fit over a handful of sizes on a VM whose disk drifts 2x has noise.
SUPERLINEAR = 0.1


def _synthetic(run: Run) -> pd.DataFrame:
    ok = run.ok
    return ok[ok["workload"].astype(str).str.startswith("synthetic-")]


def medians(run: Run) -> pd.DataFrame:
    """Per engine, SSD count and checkpoint size: the median of each metric and of the memory
    columns, over the timed repetitions of every tensor size."""
    df = _synthetic(run)
    cols = ["stall_s", "total_s", "pinned_bytes", "page_cache_peak_bytes", "rss_peak_bytes"]
    have = [c for c in cols if c in df]
    num = df[["engine", "n_targets", "total_bytes", *have]].copy()
    for c in have:
        num[c] = pd.to_numeric(num[c], errors="coerce")
    return num.groupby(["engine", "n_targets", "total_bytes"], as_index=False).median()


def present(run: Run) -> bool:
    """Whether the run sweeps the checkpoint size: some engine at MIN_SIZES sizes or more."""
    m = medians(run)
    return bool((m.groupby(["engine", "n_targets"])["total_bytes"].nunique() >= MIN_SIZES).any())


def fits(run: Run) -> pd.DataFrame:
    """One row per engine, SSD count and metric: slope, its standard error, intercept, the
    sizes fitted, and whether it grows faster than linear."""
    m = medians(run)
    out = []
    for (engine, n), g in m.groupby(["engine", "n_targets"], sort=False):
        g = g.dropna(subset=["stall_s", "total_s"])
        if g["total_bytes"].nunique() < MIN_SIZES:
            continue
        x = np.log(g["total_bytes"].astype(float))
        for metric in METRICS:
            y = np.log(g[metric].astype(float).clip(lower=1e-9))
            r = sstats.linregress(x, y)
            faster = r.slope > 1 + max(SUPERLINEAR, 2 * r.stderr)
            out.append(
                {
                    "engine": engine,
                    "n_targets": int(cast(SupportsInt, n)),  # a group key: Hashable to mypy
                    "metric": metric,
                    "slope": float(r.slope),
                    "stderr": float(r.stderr),
                    "intercept": float(r.intercept),
                    "sizes": int(g["total_bytes"].nunique()),
                    "smallest": int(g["total_bytes"].min()),
                    "largest": int(g["total_bytes"].max()),
                    "superlinear": bool(faster),
                }
            )
    return pd.DataFrame(out)


def loud_lines(table: pd.DataFrame) -> list[str]:
    """The report's loud lines: engines whose cost grows faster than their bytes."""
    if table.empty:
        return []
    return [
        f"{r['engine']}'s {METRICS[r['metric']]} grows faster than the checkpoint: slope "
        f"{r['slope']:.2f} +- {r['stderr']:.2f} (log-log, {format_size(r['smallest'])} to "
        f"{format_size(r['largest'])} over {r['n_targets']} target(s)); a linear cost has slope 1"
        for r in table.to_dict("records")
        if r["superlinear"]
    ]


def rows(table: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """The slopes as a report table."""
    headers = ["engine", "targets", "stall slope", "durable slope", "sizes", "faster than linear"]
    out = []
    for (engine, n), g in table.groupby(["engine", "n_targets"], sort=False):
        by = {r["metric"]: r for r in g.to_dict("records")}
        stall, total = by["stall_s"], by["total_s"]
        out.append(
            [
                str(engine),
                str(n),
                f"{stall['slope']:.2f} +- {stall['stderr']:.2f}",
                f"{total['slope']:.2f} +- {total['stderr']:.2f}",
                f"{stall['sizes']} ({format_size(stall['smallest'])}-"
                f"{format_size(stall['largest'])})",
                ", ".join(METRICS[m] for m, r in by.items() if r["superlinear"]) or "no",
            ]
        )
    return headers, out
