"""Stragglers: how far apart the ranks of a multi-rank run finish, and which rank is last.

For every case (workload, SSD count, mapping, ranks at once, engine) and each of a rank's times
(stall, time to durability, restore), the spread of every rank's value over every timed
repetition (the per-rank rows, never the aggregate): p50, p99 and max / p50. The slowest rank is
the one whose median over the repetitions is the largest; it is named, with its host, when that
median is more than `SLOW` times the case's p50 (the median over every rank's values), i.e. when
one rank (a slower disk, a busier host) and not the group sets the aggregate time. Reads
results files only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.runs import Run, order_engines

KEY = ["workload", "n_targets", "target_map", "ranks_active", "engine"]
TIMES = {"stall_s": "stall", "total_s": "durable", "restore_s": "restore"}
SLOW = 1.5  # a rank whose median is more than this times the case's p50 is named


@dataclass(frozen=True)
class Spread:
    """One case's spread of one time over its ranks, and its slowest rank."""

    case: tuple[object, ...]  # KEY's values
    time: str  # stall, durable or restore
    n: int  # values: ranks x repetitions
    p50_s: float
    p99_s: float
    max_over_p50: float
    slowest_rank: int
    slowest_host: str
    slowest_over_p50: float  # the slowest rank's median over the case's p50

    @property
    def named(self) -> bool:
        return self.slowest_over_p50 > SLOW


def present(run: Run) -> bool:
    """Whether the run has per-rank rows of cases with more than one rank at once."""
    r = run.ranked
    return not r.empty and bool(((~r["aggregate"]) & (r["ranks_active"] > 1)).any())


def spreads(run: Run) -> list[Spread]:
    """Every case's spread of each time over its ranks (engines in the report's order)."""
    r = run.ranked
    per = r[~r["aggregate"] & (r["ranks_active"] > 1)]
    out: list[Spread] = []
    for case, g in per.groupby(KEY, sort=False):
        for col, name in TIMES.items():
            v = g[["rank", "node", col]].dropna()
            if v.empty or not (v[col] > 0).any():
                continue
            p50 = float(np.percentile(v[col], 50))
            by_rank = v.groupby("rank")[col].median()
            slow = int(by_rank.idxmax())
            host = str(v.loc[v["rank"] == slow, "node"].iloc[0])
            out.append(
                Spread(
                    case=tuple(case),
                    time=name,
                    n=len(v),
                    p50_s=p50,
                    p99_s=float(np.percentile(v[col], 99)),
                    max_over_p50=float(v[col].max()) / p50 if p50 else float("nan"),
                    slowest_rank=slow,
                    slowest_host=host,
                    slowest_over_p50=float(by_rank.max()) / p50 if p50 else float("nan"),
                )
            )
    rank = {e: i for i, e in enumerate(order_engines({str(s.case[-1]) for s in out}))}
    return sorted(out, key=lambda s: rank[str(s.case[-1])])


def table(ss: list[Spread]) -> pd.DataFrame:
    """The spreads as a table (one row per case and time)."""
    return pd.DataFrame(
        [
            dict(
                zip(KEY, s.case, strict=True),
                time=s.time,
                n=s.n,
                p50_s=s.p50_s,
                p99_s=s.p99_s,
                max_over_p50=s.max_over_p50,
                slowest_rank=s.slowest_rank,
                slowest_host=s.slowest_host,
                slowest_over_p50=s.slowest_over_p50,
                named=s.named,
            )
            for s in ss
        ]
    )


def stragglers(ss: list[Spread]) -> list[str]:
    """One line per case and time whose slowest rank is named."""
    return [
        f"{s.case[-1]}, {s.case[0]}, {s.case[3]} ranks {s.case[2]}: rank {s.slowest_rank} on "
        f"{s.slowest_host} is the straggler, its {s.time} {s.slowest_over_p50:.2f}x the p50 "
        f"({s.p50_s:.3f} s)"
        for s in ss
        if s.named
    ]
