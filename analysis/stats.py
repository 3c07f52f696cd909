"""Statistics over repetitions: median and IQR per case, the run's summary table, and the
ratio of two samples' medians with a bootstrap confidence interval.

A case is (workload, n_targets, engine); every statistic is over the timed repetitions that
succeeded (analysis.runs.Run.ok).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as sps

from analysis.runs import Run, order_engines
from bench.common.traits import Traits
from bench.measure.efficiency import BEATEN, best_ceilings

CASE = ["workload", "n_targets", "engine"]


def ordered(df: pd.DataFrame) -> pd.DataFrame:
    """Rows in run order of workloads, then SSD count, then the house order of engines."""
    wl = {w: i for i, w in enumerate(dict.fromkeys(df["workload"]))}
    eng = {e: i for i, e in enumerate(order_engines(df["engine"]))}
    key = df["workload"].map(wl) * 10**6 + df["n_targets"] * 100 + df["engine"].map(eng)
    return df.iloc[np.argsort(key.to_numpy(), kind="stable")]


def case_stats(df: pd.DataFrame, metric: str, keys: list[str] | None = None) -> pd.DataFrame:
    """Median, 25th and 75th percentiles, IQR and n of `metric` per case."""
    keys = keys or CASE
    g = df.groupby(keys, sort=False)[metric]
    out = pd.DataFrame(
        {
            "median": g.median(),
            "q25": g.quantile(0.25),
            "q75": g.quantile(0.75),
            "n": g.size(),
        }
    )
    out["iqr"] = out["q75"] - out["q25"]
    return out.reset_index()


def median_row(g: pd.DataFrame, metric: str = "total_s") -> pd.Series:
    """The repetition whose `metric` is the median (the lower middle one for an even count)."""
    s = g.sort_values(metric, kind="stable")
    return s.iloc[(len(s) - 1) // 2]


def summary_table(run: Run) -> pd.DataFrame:
    """One row per case: medians, IQRs, n, the cost per tensor (median stall and persist over the
    state's tensors, us), host memory, speed-up over torch-save and, when the run has device
    ceilings, efficiency. Numbers are not rounded here."""
    ok = run.ok.assign(
        # the page cache a restore left behind: NaN for runs made before it was recorded
        _cached=pd.to_numeric(
            run.ok.get("restore_cached_bytes", pd.Series(np.nan, index=run.ok.index)),
            errors="coerce",
        ),
        _restore_eff=run.ok.get("restore_eff", pd.Series(np.nan, index=run.ok.index)),
    )
    g = ok.groupby(CASE, sort=False)
    out = g.agg(
        mode=("tag", lambda s: "/".join(sorted(set(s) - {""}))),
        n=("rep", "size"),
        total_bytes=("total_bytes", "median"),
        write_GBps=("write_GBps", "median"),
        write_q25=("write_GBps", lambda s: s.quantile(0.25)),
        write_q75=("write_GBps", lambda s: s.quantile(0.75)),
        stall_s=("stall_s", "median"),
        stall_q25=("stall_s", lambda s: s.quantile(0.25)),
        stall_q75=("stall_s", lambda s: s.quantile(0.75)),
        total_s=("total_s", "median"),
        n_tensors=("n_tensors", "median"),
        stall_us_per_tensor=("stall_us_per_tensor", "median"),
        persist_us_per_tensor=("persist_us_per_tensor", "median"),
        restore_GBps=("restore_GBps", "median"),
        restore_q25=("restore_GBps", lambda s: s.quantile(0.25)),
        restore_q75=("restore_GBps", lambda s: s.quantile(0.75)),
        restore_s=("restore_s", "median"),
        restore_cached_bytes=("_cached", "median"),
        restore_eff=("_restore_eff", "median"),
        pinned_x=("pinned_x", "median"),
        page_cache_x=("page_cache_x", "median"),
        write_eff=("write_eff", "median"),
        snapshot_eff=("snapshot_eff", "median"),
        beaten_rows=("write_eff", lambda s: 0),
    ).reset_index()
    # rows above the ceiling (any efficiency), per case
    over = ok.assign(
        _b=(ok["write_eff"] > BEATEN)
        | (ok["snapshot_eff"] > BEATEN)
        | (ok["_restore_eff"] > BEATEN)
    )
    out["beaten_rows"] = over.groupby(CASE, sort=False)["_b"].sum().to_numpy()
    out["write_iqr"] = out["write_q75"] - out["write_q25"]
    out["stall_iqr"] = out["stall_q75"] - out["stall_q25"]
    # Speed-up over torch-save on the same workload: torch-save runs at the smallest SSD count
    # and writes one file, so its median there is the reference for every SSD count.
    plain = run.first_with(baseline=True, stall="durable")  # torch.save: what users do today
    ts = out[out["engine"] == plain].sort_values("n_targets").drop_duplicates("workload")
    ref = ts.set_index("workload")
    out["speedup_stall"] = out["workload"].map(ref["stall_s"]) / out["stall_s"]
    out["speedup_total"] = out["workload"].map(ref["total_s"]) / out["total_s"]
    # Against the best of the libraries users would otherwise pick, per workload: the shortest
    # baseline stall and the shortest baseline time to durability (x > 1: this engine is ahead).
    base = [e for e in out["engine"].unique() if (t := run.traits(e)) is not None and t.baseline]
    b = out[out["engine"].isin(base)].groupby("workload")
    out["best_baseline_stall"] = out["workload"].map(b["stall_s"].min())
    out["best_baseline_total"] = out["workload"].map(b["total_s"].min())
    out["x_best_baseline_stall"] = out["best_baseline_stall"] / out["stall_s"]
    out["x_best_baseline_durable"] = out["best_baseline_total"] / out["total_s"]
    # The same for restores: the shortest baseline restore of the workload over this one's.
    out["best_baseline_restore"] = out["workload"].map(b["restore_s"].min())
    out["x_best_baseline_restore"] = out["best_baseline_restore"] / out["restore_s"]
    return ordered(out).reset_index(drop=True)


def read_ceiling_Bps(env: dict[str, Any], traits: Traits | None, n_targets: int) -> float | None:
    """The read ceiling (B/s) a restore of an engine with `traits` over `n_targets` targets is
    judged against (the run's best: bench.measure.efficiency): the O_DIRECT read, or the
    buffered read of a cold file for a page-cache path, of the targets it read (one unless it
    stripes); None where the run did not measure it."""
    c = best_ceilings(env)
    if c is None or traits is None:
        return None
    return c.bound("restore", traits, n_targets if traits.stripes else 1)


def case(r: pd.Series) -> str:
    """A summary row's case in words: `synthetic-1GiB-16MiB x 4 SSDs`."""
    n = int(r["n_targets"])
    return f"{r['workload']} x {n} SSD" + ("s" if n != 1 else "")


def fmt_eff(x: float) -> str:
    """An efficiency for tables: '-' when there is none, 'ceiling beaten' above BEATEN (a finding
    about the ceiling, not a score)."""
    if x is None or not math.isfinite(x):
        return "-"
    return "ceiling beaten" if x > BEATEN else f"{x:.2f}"


def fmt(x: float, digits: int = 3) -> str:
    """Numbers for tables: 3 significant digits, '-' for missing."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:.{digits}g}"


def fmt_us(x: float) -> str:
    """Microseconds for tables: whole ones from 100 up (22767, not 2.28e+04), else 3 significant
    digits; '-' for missing."""
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"


def summary_rows(table: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Headers and formatted rows of the summary table (report.md and the terminal)."""
    headers = [
        "workload",
        "SSDs",
        "engine",
        "mode",
        "n",
        "write GB/s",
        "IQR",
        "stall s",
        "IQR",
        "durable s",
        "tensors",
        "stall us/tensor",
        "persist us/tensor",
        "restore GB/s",
        "pinned xS",
        "page cache xS",
        "x torch-save stall",
        "x torch-save durable",
        "x best baseline stall",
        "x best baseline durable",
    ]
    eff = bool(table["write_eff"].notna().any())
    if eff:
        headers += ["write eff", "snapshot eff"]
    rows = []
    for _, r in table.iterrows():
        row = [
            r["workload"],
            str(int(r["n_targets"])),
            r["engine"],
            (r["mode"] or "").upper() or "-",
            str(int(r["n"])),
            f"{r['write_GBps']:.2f}",
            f"{r['write_iqr']:.2f}",
            fmt(r["stall_s"]),
            fmt(r["stall_iqr"], 2),
            fmt(r["total_s"]),
            str(int(r["n_tensors"])),
            fmt_us(r["stall_us_per_tensor"]),
            fmt_us(r["persist_us_per_tensor"]),
            f"{r['restore_GBps']:.2f}",
            f"{r['pinned_x']:.2f}",
            f"{r['page_cache_x']:.2f}",
            fmt(r["speedup_stall"]),
            fmt(r["speedup_total"]),
            fmt(r["x_best_baseline_stall"]),
            fmt(r["x_best_baseline_durable"]),
        ]
        if eff:
            row += [fmt_eff(r["write_eff"]), fmt_eff(r["snapshot_eff"])]
        rows.append(row)
    return headers, rows


@dataclass(frozen=True)
class RatioCI:
    """Median(b) / median(a) with a percentile-bootstrap confidence interval and a rank test."""

    ratio: float
    low: float
    high: float
    p_value: float
    n_a: int
    n_b: int
    alpha: float = 0.05  # 1 - the interval's confidence level

    @property
    def significant(self) -> bool:
        """True when the interval excludes 1 and the rank test agrees (p < alpha): the
        difference is outside the noise. A percentile bootstrap of 3 values a side gives an
        interval far too narrow to trust alone (with 3 vs 3, p cannot fall below 0.1)."""
        outside = math.isfinite(self.low) and (self.low > 1 or self.high < 1)
        return outside and self.p_value < self.alpha


def _median_ratio(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.median(b, axis=axis) / np.median(a, axis=axis)


def ratio_ci(
    a: Any, b: Any, confidence: float = 0.95, n_resamples: int = 4000, seed: int = 0
) -> RatioCI:
    """B/A ratio of medians; CI from scipy's percentile bootstrap (independent samples),
    p from a two-sided Mann-Whitney U test. With fewer than 2 values a side there is no CI."""
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    ratio = float(np.median(b) / np.median(a))
    if len(a) < 2 or len(b) < 2:
        return RatioCI(ratio, math.nan, math.nan, math.nan, len(a), len(b))
    with warnings.catch_warnings():
        # Identical resamples (tiny n) make scipy warn about a degenerate distribution; the
        # percentile interval is still the right answer (a point).
        warnings.simplefilter("ignore")
        res = sps.bootstrap(
            (a, b),
            _median_ratio,
            vectorized=True,
            paired=False,
            confidence_level=confidence,
            n_resamples=n_resamples,
            method="percentile",
            rng=np.random.default_rng(seed),
        )
        p = float(sps.mannwhitneyu(b, a, alternative="two-sided").pvalue)
    ci = res.confidence_interval
    return RatioCI(ratio, float(ci.low), float(ci.high), p, len(a), len(b), 1 - confidence)
