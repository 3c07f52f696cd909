"""Multi-rank runs (`bench.run.distributed`): how ranks that checkpoint at once contend for the host's
SSDs and memory, measured beside the model's fair share (`analysis.model.predict.predict_shared`).

One row per case = (workload, SSD count, mapping, ranks checkpointing at once k, engine), from the
aggregate rows: stall = the slowest rank's stall, aggregate write bandwidth = every rank's bytes /
the slowest rank's total_s (as MLPerf Storage reports it), both as medians over repetitions. A
case with one rank stands for every mapping (it runs once). g, the ranks sharing one host, is
the most active ranks on one node; the model gets the per-rank shard S_r = aggregate bytes / k.
Reads results files only.
"""

from __future__ import annotations

from typing import Any, SupportsInt, cast

import numpy as np
import pandas as pd

from analysis.model.predict import predict_shared
from analysis.model.profiles import Profile
from analysis.runs import Run, engine_traits, order_engines

KEY = ["workload", "n_targets", "target_map", "ranks_active", "engine"]
GB = 1e9


def present(run: Run) -> bool:
    """Whether the run has cases where more than one rank checkpointed at once."""
    r = run.ranked
    return not r.empty and bool((r["ranks_active"] > 1).any())


def _hosts_share(per_rank: pd.DataFrame) -> pd.Series:
    """g per case: the most ranks of one node in one repetition."""
    c = per_rank.groupby([*KEY, "rep", "node_rank"]).size()
    return c.groupby(level=list(range(len(KEY)))).max()


def table(run: Run, prof: Profile | None) -> pd.DataFrame:
    """Measured medians per case, with the model's per-rank stall and aggregate bandwidth."""
    r = run.ranked
    agg = r[r["aggregate"]].assign(agg_GBps=lambda d: d["total_bytes"] / d["total_s"] / GB)
    if agg.empty:
        return pd.DataFrame()
    g = agg.groupby(KEY, sort=False)
    out = g.agg(
        n=("rep", "size"),
        total_bytes=("total_bytes", "median"),
        stall_s=("stall_s", "median"),
        stall_q25=("stall_s", lambda s: s.quantile(0.25)),
        stall_q75=("stall_s", lambda s: s.quantile(0.75)),
        total_s=("total_s", "median"),
        agg_GBps=("agg_GBps", "median"),
        agg_q25=("agg_GBps", lambda s: s.quantile(0.25)),
        agg_q75=("agg_GBps", lambda s: s.quantile(0.75)),
        mode=("tag", lambda s: "/".join(sorted(set(s) - {""}))),
    ).reset_index()
    share = _hosts_share(r[~r["aggregate"]])
    out["g"] = [
        int(share.get(tuple(row[k] for k in KEY), row["ranks_active"])) for _, row in out.iterrows()
    ]
    out["shard_bytes"] = out["total_bytes"] / out["ranks_active"]
    pred_stall, pred_bw = [], []
    for _, row in out.iterrows():
        traits = engine_traits(run.env, row["engine"])
        if prof is None or traits is None:
            pred_stall.append(np.nan)
            pred_bw.append(np.nan)
            continue
        mapping = "shared" if row["target_map"] == "shared" else "dedicated"
        pr = predict_shared(
            prof,
            row["engine"],
            int(row["g"]),
            int(row["n_targets"]),
            float(row["shard_bytes"]),
            mapping,
            traits,
        )
        pred_stall.append(pr.stall_s)
        pred_bw.append(row["total_bytes"] / pr.durable_s / GB)
    out["model_stall_s"] = pred_stall
    out["model_GBps"] = pred_bw
    return out


def maps(t: pd.DataFrame) -> list[str]:
    """The mappings with more than one rank, in run order."""
    return list(dict.fromkeys(t.loc[t["ranks_active"] > 1, "target_map"]))


def series(t: pd.DataFrame, workload: str, n: int, engine: str, mapping: str) -> pd.DataFrame:
    """One line of the figure: the one-rank case (common to every mapping), then the mapping's."""
    sel = t[(t["workload"] == workload) & (t["n_targets"] == n) & (t["engine"] == engine)]
    one = sel[sel["ranks_active"] == 1].head(1)
    more = sel[(sel["ranks_active"] > 1) & (sel["target_map"] == mapping)]
    return pd.concat([one, more]).sort_values("ranks_active")


def notes(t: pd.DataFrame) -> list[str]:
    """'aggregate bandwidth of k ranks against one rank' per engine, workload and SSD count."""
    out: list[str] = []
    if t.empty:
        return out
    for (wl, n, e), grp in t.groupby(["workload", "n_targets", "engine"], sort=False):
        one = grp.loc[grp["ranks_active"] == 1, "agg_GBps"]
        base = float(one.iloc[0]) if len(one) else None
        parts = [f"1 rank {base:.2f} GB/s"] if base else []
        for _, r in grp[grp["ranks_active"] > 1].sort_values(["ranks_active"]).iterrows():
            rel = f" = {r['agg_GBps'] / base:.2f}x" if base else ""
            parts.append(
                f"{int(r['ranks_active'])} ranks {r['target_map']} {r['agg_GBps']:.2f} GB/s{rel}"
            )
        if len(parts) > 1:
            ssds = int(cast(SupportsInt, n))  # a group key: Hashable to mypy
            out.append(f"{e}, {wl}, {ssds} SSD(s): " + "; ".join(parts))
    return out


def rows(t: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """The report's table: measured beside the model, per case."""
    headers = [
        "workload",
        "SSDs",
        "mapping",
        "ranks",
        "engine",
        "n",
        "stall s (max over ranks)",
        "model",
        "aggregate GB/s",
        "model",
    ]
    out: list[list[str]] = []
    for e in order_engines(t["engine"]):
        for _, r in t[t["engine"] == e].sort_values(["n_targets", "ranks_active"]).iterrows():
            out.append(
                [
                    str(r["workload"]),
                    str(int(r["n_targets"])),
                    r["target_map"] if r["ranks_active"] > 1 else "(one rank)",
                    str(int(r["ranks_active"])),
                    e + (f" [{r['mode']}]" if r["mode"] else ""),
                    str(int(r["n"])),
                    _fmt(r["stall_s"]),
                    _fmt(r["model_stall_s"]),
                    _fmt(r["agg_GBps"]),
                    _fmt(r["model_GBps"]),
                ]
            )
    return headers, out


def _fmt(x: Any) -> str:
    return "-" if x is None or not np.isfinite(x) else f"{x:.3g}"
