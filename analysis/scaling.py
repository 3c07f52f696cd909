"""How the cost of a checkpoint grows with its size (configs/scaling.yaml, `make scaling`).

For each engine over the synthetic workloads of a run that sweeps the checkpoint size (at least
three sizes), the stall and the time to durability are fitted as a power law of the size,
log(t) = a + b log(S), by least squares over the per-size medians (scipy's linregress, with the
slope's standard error). A slope of 1 is linear: twice the bytes, twice the time. A slope above 1
by more than its noise says the engine's cost grows faster than its bytes (a copy made twice, a
cache that thrashes): that is a loud line of the report. Two figures: the times against size,
log-log, with the fit and the model's line beside the measured points; and the host memory each
path held against size (pinned staging, page-cache peak, the process's RSS peak).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from scipy import stats as sstats

from analysis.model.predict import predict
from analysis.model.profiles import Profile
from analysis.runs import Run, order_engines
from bench.sizes import format_size

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
                    "n_targets": int(n),
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
        f"{r.engine}'s {METRICS[r.metric]} grows faster than the checkpoint: slope "
        f"{r.slope:.2f} +- {r.stderr:.2f} (log-log, {format_size(r.smallest)} to "
        f"{format_size(r.largest)} over {r.n_targets} target(s)); a linear cost has slope 1"
        for r in table.itertuples()
        if r.superlinear
    ]


def rows(table: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """The slopes as a report table."""
    headers = ["engine", "targets", "stall slope", "durable slope", "sizes", "faster than linear"]
    out = []
    for (engine, n), g in table.groupby(["engine", "n_targets"], sort=False):
        by = {r.metric: r for r in g.itertuples()}
        out.append(
            [
                engine,
                str(n),
                f"{by['stall_s'].slope:.2f} +- {by['stall_s'].stderr:.2f}",
                f"{by['total_s'].slope:.2f} +- {by['total_s'].stderr:.2f}",
                f"{by['stall_s'].sizes} ({format_size(by['stall_s'].smallest)}-"
                f"{format_size(by['stall_s'].largest)})",
                ", ".join(METRICS[m] for m, r in by.items() if r.superlinear) or "no",
            ]
        )
    return headers, out


def times_figure(run: Run, prof: Profile | None) -> Figure:
    """Stall and time to durability against checkpoint size, log-log, per engine: medians
    (markers), the fitted power law (solid) and the model calibrated from the run (dashed)."""
    from analysis import figures as F

    with F.plt.rc_context(F.STYLE):
        fig, axes = F._new(F.COL2, 2.8, ncols=2)
        m = medians(run)
        table = fits(run)
        n = int(m["n_targets"].min()) if not m.empty else 1
        m = m[m["n_targets"] == n]
        sizes = sorted(int(s) for s in m["total_bytes"].unique())
        xs = np.geomspace(min(sizes), max(sizes), 40) if sizes else np.array([])
        for ax, metric in zip(axes[0], METRICS, strict=True):
            for e in order_engines(m["engine"]):
                g = m[m["engine"] == e].sort_values("total_bytes")
                fit = table[
                    (table["engine"] == e) & (table["metric"] == metric) & (table["n_targets"] == n)
                ]
                lab = F._engine_label(run.ok, e)
                if not fit.empty:
                    f = fit.iloc[0]
                    lab += f" (slope {f['slope']:.2f})"
                    ax.plot(xs, np.exp(f["intercept"]) * xs ** f["slope"], color=F.color(e))
                ax.plot(
                    g["total_bytes"],
                    g[metric],
                    linestyle="none",
                    marker=F.marker(e),
                    color=F.color(e),
                    label=lab,
                )
                if prof is not None and run.traits(e) is not None:
                    key = "stall_s" if metric == "stall_s" else "durable_s"
                    ys = [getattr(predict(prof, e, n, x, run.traits(e)), key) for x in xs]
                    ax.plot(xs, ys, color=F.color(e), linestyle="--", linewidth=0.9, alpha=0.7)
            ax.set_yscale("log")
            if sizes:
                F._size_ticks(ax, sizes)
            ax.set_xlabel("checkpoint size")
            ax.set_ylabel(f"{METRICS[metric]} (s, log scale)")
            ax.set_title(f"{METRICS[metric]} against size, {n} target(s)")
            ax.legend(loc="lower right", fontsize=5.5)
        _finish(
            fig,
            axes,
            run,
            "markers: measured medians; solid: power-law fit (slope in the legend; 1 = linear); "
            "dashed: model calibrated from this run",
        )
    return fig


def memory_figure(run: Run) -> Figure:
    """What each path held in host memory against checkpoint size: pinned staging, the
    page-cache peak and the process's RSS peak (which holds the state when emulated)."""
    from analysis import figures as F

    cols = {
        "pinned_bytes": "staging held (pinned on CUDA)",
        "page_cache_peak_bytes": "page-cache peak",
        "rss_peak_bytes": "RSS peak (the state included)",
    }
    with F.plt.rc_context(F.STYLE):
        fig, axes = F._new(F.COL2, 2.6, ncols=3, sharey=True)
        m = medians(run)
        n = int(m["n_targets"].min()) if not m.empty else 1
        m = m[m["n_targets"] == n]
        sizes = sorted(int(s) for s in m["total_bytes"].unique())
        for ax, (col, title) in zip(axes[0], cols.items(), strict=True):
            for e in order_engines(m["engine"]):
                g = m[m["engine"] == e].sort_values("total_bytes")
                if col not in g:
                    continue
                held = g[col].where(g[col] > 0)  # none held: not drawn on a log scale
                if held.isna().all():
                    continue
                ax.plot(
                    g["total_bytes"],
                    held / 2**30,
                    marker=F.marker(e),
                    color=F.color(e),
                    label=F._engine_label(run.ok, e),
                )
            if sizes:
                ax.plot(
                    sizes, [s / 2**30 for s in sizes], color="black", linestyle=":", label="1x S"
                )
            ax.set_yscale("log")
            if sizes:
                F._size_ticks(ax, sizes)
            ax.set_xlabel("checkpoint size")
            ax.set_title(title)
        axes[0][0].set_ylabel("GiB (log scale)")
        axes[0][-1].legend(loc="upper left")
        _finish(
            fig,
            axes,
            run,
            "medians over repetitions (an engine that held none is not drawn); RSS is the "
            "process's during the save: the state and the staging of every engine warmed on it; "
            "dotted: the checkpoint's own size",
        )
    return fig


def _finish(fig: Figure, axes: Any, run: Run, text: str) -> None:
    """Size labels turned so that neighbours do not run together, and the run's footer."""
    from analysis import figures as F

    for ax in axes[0]:
        ax.tick_params(axis="x", labelrotation=45)
    F.footer(fig, run, text)


def section(d: Any, run: Run) -> None:
    """The report's section on how the cost grows."""
    table = fits(run)
    d.h(2, "How the cost grows with the checkpoint")
    d.p(
        "Stall and time to durability fitted as a power law of the checkpoint size (log-log "
        "least squares over the per-size medians; slope +- its standard error). Slope 1 is a "
        "linear cost; above 1 by more than 0.1 and twice its error is said in the loud lines "
        "at the top."
    )
    if not table.empty:
        d.table(*rows(table))
    d.img("scaling.png", "Figure 10: stall and time to durability against checkpoint size.")
    d.img("scaling_memory.png", "Figure 11: host memory held against checkpoint size.")
