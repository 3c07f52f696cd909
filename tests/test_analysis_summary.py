"""Analysis of a committed fixture run: the summary table's numbers, its cost per tensor beside
the bandwidth, the efficiencies against the best ceilings, and the ratios' confidence intervals.

They read the committed default fixture run (a trimmed real default run, DEFAULT_RUN in
tests/conftest.py); its report is built once for the whole test run (`default_report`).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from conftest import DEFAULT_RUN

from analysis import runs, stats, summary
from analysis.model.calibrate import from_run
from bench.measure.ceilings import BUFFERED_WRITE, COPY, DIRECT_WRITE, RunCeilings

S = 1 << 30  # the fixture run's synthetic state


@pytest.fixture(scope="module")
def run() -> runs.Run:
    return runs.load(str(DEFAULT_RUN))


def test_summary_table_numbers(run: runs.Run) -> None:
    t = stats.summary_table(run)
    assert len(t) == 16  # 2 workloads x (5 engines at 1 SSD + 3 at 2 SSDs)
    row = t[
        (t["workload"] == "synthetic-1GiB-256MiB")
        & (t["n_targets"] == 1)
        & (t["engine"] == "cpu-single")
    ].iloc[0]
    # the three timed repetitions of that case in results.csv
    stalls = [0.084857, 0.098805, 0.091066]
    totals = [0.388869, 0.415854, 0.419593]
    assert row["n"] == 3
    assert row["mode"] == "emulated"
    assert row["stall_s"] == pytest.approx(0.091066, abs=1e-6)
    assert row["stall_iqr"] == pytest.approx(
        pd.Series(stalls).quantile(0.75) - pd.Series(stalls).quantile(0.25), abs=1e-6
    )
    assert row["total_s"] == pytest.approx(0.415854, abs=1e-6)
    assert row["write_GBps"] == pytest.approx(S / 0.415854 / 1e9, rel=1e-5)
    assert row["write_iqr"] == pytest.approx(
        (
            pd.Series([S / x / 1e9 for x in totals]).quantile(0.75)
            - pd.Series([S / x / 1e9 for x in totals]).quantile(0.25)
        ),
        rel=1e-5,
    )
    assert row["pinned_x"] == pytest.approx(1.0)
    # torch-save on that workload: median stall 2.263276 s (0.906677, 2.263276, 2.298649)
    assert row["speedup_stall"] == pytest.approx(2.263276 / 0.091066, rel=1e-5)
    assert row["speedup_total"] == pytest.approx(2.263506 / 0.415854, rel=1e-5)
    ts = t[(t["engine"] == "torch-save")]
    assert list(ts["speedup_stall"]) == [1.0, 1.0]
    assert "efficiency_pct" not in t  # no ceilings in env.json


def test_cost_per_tensor_next_to_bandwidth(run: runs.Run) -> None:
    """us per tensor (median stall_s and persist_s over n_tensors) beside GB/s, for every case,
    from results.csv read here with the csv module; three cases by hand."""
    import csv
    import statistics

    with open(DEFAULT_RUN / "results.csv", newline="") as f:
        timed = [r for r in csv.DictReader(f) if r["warmup"] == "False"]
    t = stats.summary_table(run)
    assert len(t) == 16
    for _, row in t.iterrows():
        reps = [
            r
            for r in timed
            if (r["workload"], int(r["n_targets"]), r["engine"])
            == (row["workload"], row["n_targets"], row["engine"])
        ]
        n = int(reps[0]["n_tensors"])
        assert (
            row["n_tensors"]
            == n
            == {"synthetic-1GiB-4MiB": 256, "synthetic-1GiB-256MiB": 4}[row["workload"]]
        )
        for col, us in (("stall_s", "stall_us_per_tensor"), ("persist_s", "persist_us_per_tensor")):
            want = statistics.median(float(r[col]) for r in reps) / n * 1e6
            assert row[us] == pytest.approx(want, rel=1e-9), (row["engine"], col)

    def case(workload: str, engine: str) -> pd.Series:
        return t[
            (t["workload"] == workload) & (t["n_targets"] == 1) & (t["engine"] == engine)
        ].iloc[0]

    # cpu-single, 4 x 256 MiB: stalls 0.084857, 0.098805, 0.091066 s; persists 0.304012,
    # 0.317049, 0.328527 s
    cs = case("synthetic-1GiB-256MiB", "cpu-single")
    assert cs["stall_us_per_tensor"] == pytest.approx(0.091065734 / 4 * 1e6)  # 22,766 us
    assert cs["persist_us_per_tensor"] == pytest.approx(0.317048919 / 4 * 1e6)  # 79,262 us
    # cpu-single, 256 x 4 MiB: median stall 0.806421 s, median persist 0.397135 s
    cs4 = case("synthetic-1GiB-4MiB", "cpu-single")
    assert cs4["stall_us_per_tensor"] == pytest.approx(0.806421412 / 256 * 1e6)  # 3,150 us
    assert cs4["persist_us_per_tensor"] == pytest.approx(0.397135495 / 256 * 1e6)  # 1,551 us
    # gds returns durable: its persist is the wait() alone, 6.3 us for 256 tensors
    g4 = case("synthetic-1GiB-4MiB", "gds")
    assert g4["persist_us_per_tensor"] == pytest.approx(6.34e-6 / 256 * 1e6, rel=1e-3)
    headers, rows = stats.summary_rows(t)
    at = headers.index("write GB/s")
    assert headers[at : at + 9] == [
        "write GB/s",
        "IQR",
        "stall s",
        "IQR",
        "durable s",
        "tensors",
        "stall us/tensor",
        "persist us/tensor",
        "restore GB/s",
    ]
    by_case = {tuple(r[:3]): r for r in rows}
    assert by_case[("synthetic-1GiB-256MiB", "1", "cpu-single")][at + 5 : at + 8] == [
        "4",
        "22766",
        "79262",
    ]
    assert by_case[("synthetic-1GiB-4MiB", "1", "cpu-single")][at + 5 : at + 8] == [
        "256",
        "3150",
        "1551",
    ]
    assert by_case[("synthetic-1GiB-4MiB", "1", "gds")][at + 5 : at + 8] == [
        "256",
        "2232",
        "0.0248",
    ]
    # the terminal's table (ckptbench run / report) carries them too, rounded to 0.1 us
    term = summary.table(run)
    assert term.loc[("synthetic-1GiB-4MiB", 1, "cpu-single"), "stall_us/tensor"] == 3150.1
    assert term.loc[("synthetic-1GiB-4MiB", 1, "cpu-single"), "persist_us/tensor"] == 1551.3
    assert term.loc[("synthetic-1GiB-4MiB", 1, "cpu-single"), "tensors"] == 256


def test_summary_rows_mark_every_row_emulated(run: runs.Run) -> None:
    headers, rows = stats.summary_rows(stats.summary_table(run))
    assert headers[:6] == ["workload", "SSDs", "engine", "mode", "n", "write GB/s"]
    assert {r[3] for r in rows} == {"EMULATED"}
    first = rows[0]
    assert first[:5] == ["synthetic-1GiB-4MiB", "1", "gds", "EMULATED", "3"]


def test_efficiencies_use_the_one_definition_and_the_best_ceilings(run: runs.Run) -> None:
    """write eff = bytes / total_s over the engine's kind of write for the targets it wrote;
    snapshot eff = bytes / stall over the copy ceiling; the best of before, after and the probes."""
    per_n = {
        "1": {"direct_write_Bps": 3.0e9, "buffered_write_Bps": 2.0e9},
        "2": {"direct_write_Bps": 3.5e9, "buffered_write_Bps": 2.5e9},
    }
    after = {
        "per_ssd_count": {"2": {"direct_write_Bps": 4.0e9, "buffered_write_Bps": 1.0e9}},
        "copy_Bps": 5e9,
    }
    env = dict(run.env, ceilings={"per_ssd_count": per_n, "copy_Bps": 10e9}, ceilings_after=after)
    ok = runs.add_efficiencies(run.ok, env)
    t = stats.summary_table(dataclasses.replace(run, env=env, ok=ok))
    wl = "synthetic-1GiB-4MiB"
    cs = ok[(ok["engine"] == "cpu-single") & (ok["n_targets"] == 2) & (ok["workload"] == wl)]
    r = t[(t["engine"] == "cpu-single") & (t["n_targets"] == 2) & (t["workload"] == wl)].iloc[0]
    want = np.median(cs["total_bytes"] / cs["total_s"] / 4.0e9)  # the better one: after
    assert r["write_eff"] == pytest.approx(want, rel=1e-3)
    assert r["snapshot_eff"] == pytest.approx(
        np.median(cs["total_bytes"] / cs["stall_s"] / 10e9), rel=1e-3
    )
    ts = ok[(ok["engine"] == "torch-save") & (ok["workload"] == wl)]
    d = t[(t["engine"] == "torch-save") & (t["workload"] == wl)].iloc[0]  # one target, buffered
    assert d["write_eff"] == pytest.approx(
        np.median(ts["total_bytes"] / ts["total_s"] / 2e9), rel=1e-3
    )
    assert np.isnan(d["snapshot_eff"])
    # A probe between workloads that beat both raises the ceiling too; one of 2 targets does not
    # touch the 1-target ceiling.
    probes = [
        {"n_targets": 1, "buffered_write_Bps": 4e9, "copy_Bps": 20e9},
        {"n_targets": 2, "buffered_write_Bps": 0.5e9},
    ]
    env2 = dict(env, ceilings_probes=probes)
    best = runs.ceilings(env2)
    assert best is not None
    assert [best.at(k, 1).Bps for k in (DIRECT_WRITE, BUFFERED_WRITE)] == [3.0e9, 4e9]
    assert [best.at(k, 2).Bps for k in (DIRECT_WRITE, BUFFERED_WRITE)] == [4.0e9, 2.5e9]
    assert best.at(COPY).Bps == 20e9
    ok2 = runs.add_efficiencies(run.ok, env2)
    t2 = stats.summary_table(dataclasses.replace(run, env=env2, ok=ok2))
    d2 = t2[(t2["engine"] == "torch-save") & (t2["workload"] == wl)].iloc[0]
    assert d2["write_eff"] == pytest.approx(d["write_eff"] / 2, rel=1e-3)
    headers, rows_ = stats.summary_rows(t)
    assert headers[-2:] == ["write eff", "snapshot eff"]
    # a median above 1.05 is a finding about the ceiling, not a score
    assert stats.fmt_eff(1.37) == "ceiling beaten" and stats.fmt_eff(0.91) == "0.91"
    assert stats.fmt_eff(float("nan")) == "-"


def test_ceilings_per_ssd_count() -> None:
    # the shape bench/measure/ceilings/ writes: aggregates measured with n targets at once
    env = {
        "ceilings": {
            "tool": "builtin",
            "copy_Bps": 9e9,
            "per_ssd_count": {
                "1": {"direct_write_Bps": 2e9, "buffered_write_Bps": 1e9},
                "2": {"direct_write_Bps": 2.5e9},
            },
        }
    }
    c = RunCeilings.from_env(env).before
    assert c is not None
    assert c.at(DIRECT_WRITE, 1).Bps == 2e9
    assert c.at(DIRECT_WRITE, 2).Bps == 2.5e9
    assert c.at(BUFFERED_WRITE, 2) is None
    assert c.at(DIRECT_WRITE, 4) is None
    assert c.at(COPY).Bps == 9e9  # one for the host
    assert RunCeilings.from_env({}).before is None
    run = runs.load(str(DEFAULT_RUN))
    p = from_run(dataclasses.replace(run, env=dict(run.env, **env)))
    assert (p.ssd_write_Bps, p.host_copy_Bps) == (2e9, 9e9)


def test_ratio_ci() -> None:
    a, b = [1.0, 1.1, 0.9, 1.05, 0.95], [2.0, 2.1, 1.9, 2.05, 1.95]
    r = stats.ratio_ci(a, b)
    assert r.ratio == pytest.approx(2.0)
    assert 1 < r.low <= r.ratio <= r.high
    assert r.significant
    assert r.p_value == pytest.approx(0.0079, abs=1e-4)  # exact two-sided U test, 5 vs 5
    same = stats.ratio_ci(a, a)
    assert same.ratio == 1 and not same.significant
    # 3 against 3, all of B above all of A: the bootstrap interval excludes 1, but a rank test
    # cannot go below p = 0.1 with so few values, so the difference is not called significant
    three = stats.ratio_ci([1.0, 1.1, 0.9], [2.0, 2.1, 1.9])
    assert three.low > 1 and three.p_value == pytest.approx(0.1) and not three.significant
    one = stats.ratio_ci([1.0], [2.0, 2.1])
    assert one.ratio == pytest.approx(2.05) and not one.significant
