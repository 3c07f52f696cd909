"""Analysis of a committed fixture run (a trimmed real default run): loading, the summary table's
numbers, the figures' axes and lines, report.md, and `ckptbench report`."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import runs, stats, summary
from analysis.figures.bandwidth import bandwidth_vs_tensor_size
from analysis.figures.feasibility import feasibility
from analysis.figures.host import host_memory
from analysis.figures.planning import lost_fraction
from analysis.figures.restore import restore_figure
from analysis.figures.stall import stall_vs_ssds
from analysis.figures.timeline import timeline
from analysis.model import published
from analysis.model.calibrate import from_run
from analysis.model.planning import measured_restores, plan
from analysis.model.predict import stall_ratio
from analysis.model.profiles import load_profile, load_profiles
from analysis.report.build import Report, build
from analysis.report.captions import FIGURES
from analysis.report.caveats import warnings_for
from analysis.report.doc import Doc
from analysis.report.model import MODEL_CSV, model_errors, model_frame, model_vs_measured
from analysis.report.restore import restore_rows
from bench.cli import main
from bench.common.errors import UserError
from bench.measure.ceilings import BUFFERED_WRITE, COPY, DIRECT_WRITE, RunCeilings

FIX = Path(__file__).parent / "fixtures" / "runs"
DEFAULT = FIX / "20261202T160516Z-default-b10c3b"
S = 1 << 30
ENGINES = ["gds", "cpu-single", "cpu-double", "torch-save", "dcp"]


@pytest.fixture(scope="module")
def run() -> runs.Run:
    return runs.load(str(DEFAULT))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Report:
    return build(str(DEFAULT), str(tmp_path_factory.mktemp("report")))


def labelled(ax) -> list:  # a matplotlib Axes
    return [ln for ln in ax.get_lines() if not ln.get_label().startswith("_")]


def compat_copy(tmp_path: Path) -> str:
    """The fixture as if measured on a GPU with kvikio in compat mode."""
    out = tmp_path / "compat-run"
    shutil.copytree(DEFAULT, out)
    df = pd.read_csv(out / "results.csv", keep_default_na=False, dtype=str)
    df["device"] = "cuda"
    df["emulated"] = "False"
    df.loc[df["engine"] == "gds", "gds_mode"] = "compat"
    df.to_csv(out / "results.csv", index=False)
    env = json.loads((out / "env.json").read_text())
    env["device"] = {"kind": "cuda", "emulated": False}
    (out / "env.json").write_text(json.dumps(env))
    return str(out)


# --- loading -------------------------------------------------------------------------------


def test_load_sets_aside_warmups(run: runs.Run) -> None:
    assert len(run.rows) == 64
    assert run.excluded == {"warm-up": 16, "error": 0, "not verified": 0}
    assert len(run.ok) == 48
    assert not run.ok["warmup"].any()
    assert run.engines == ENGINES
    assert run.emulated and run.shared_device
    assert set(run.ok["label"]) == {f"{e} [emulated]" for e in ENGINES}
    assert run.gds_modes() == {
        "gds": "emulated",
        "cpu-double": "none",
        "cpu-single": "none",
        "torch-save": "none",
        "dcp": "none",
    }


def test_load_sets_aside_errors_and_unverified(tmp_path: Path) -> None:
    out = tmp_path / "r"
    shutil.copytree(DEFAULT, out)
    df = pd.read_csv(out / "results.csv", keep_default_na=False, dtype=str)
    timed = df.index[df["warmup"] == "False"]
    df.loc[timed[0], "error"] = "OSError: boom"
    df.loc[timed[1], "verified"] = "False"
    df.loc[:, "gds_mode"] = df["gds_mode"].where(df["engine"] == "gds", "")  # older runs
    df.to_csv(out / "results.csv", index=False)
    r = runs.load(str(out))
    assert r.excluded == {"warm-up": 16, "error": 1, "not verified": 1}
    assert len(r.ok) == 46
    assert set(r.rows.loc[r.rows["engine"] != "gds", "gds_mode"]) == {"none"}
    assert "Rows left out of the statistics: 1 with error, 1 with not verified." in warnings_for(r)


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no such run directory"):
        runs.load(str(tmp_path / "missing"))
    with pytest.raises(UserError, match="no results.csv here"):
        runs.load(str(tmp_path))
    (tmp_path / "results.csv").write_text("run_id,engine\nx,gds\n")
    with pytest.raises(UserError, match="results.csv: lacks columns case_id, device"):
        runs.load(str(tmp_path))


# --- the summary table ---------------------------------------------------------------------


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

    with open(DEFAULT / "results.csv", newline="") as f:
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
    run = runs.load(str(DEFAULT))
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


# --- figures -------------------------------------------------------------------------------


def test_bandwidth_figure(run: runs.Run) -> None:
    fig = bandwidth_vs_tensor_size(run)
    axes = fig.get_axes()
    assert len(axes) == 2
    assert [ax.get_ylabel() for ax in axes] == [
        "write bandwidth to durability (GB/s)",
        "restore bandwidth (GB/s)",
    ]
    for ax in axes:
        assert ax.get_xlabel() == "tensor size (log scale)"
        assert ax.get_xscale() == "log"
        lines = labelled(ax)
        assert [ln.get_label() for ln in lines] == [f"{e} [emulated]" for e in ENGINES]
        assert all(list(ln.get_xdata()) == [4 << 20, 256 << 20] for ln in lines)
        assert [t.get_text() for t in ax.get_xticklabels()] == ["4MiB", "256MiB"]
    # cpu-single write GB/s at 256 MiB tensors = S / median total_s
    cs = labelled(axes[0])[1]
    assert cs.get_ydata()[1] == pytest.approx(S / 0.415854 / 1e9, rel=1e-5)
    assert "HOST-EMULATED" in fig.get_supxlabel()
    assert fig.get_suptitle() == "1GiB checkpoint, 1 target(s)"


def test_stall_figure_has_model_beside_measurement(run: runs.Run) -> None:
    fig = stall_vs_ssds(run, from_run(run))
    axes = [ax for ax in fig.get_axes() if ax.get_visible()]
    assert [ax.get_title() for ax in axes] == [
        "synthetic-1GiB-4MiB (1GiB)",
        "synthetic-1GiB-256MiB (1GiB)",
    ]
    for ax in axes:
        assert ax.get_xlabel() == "SSDs (targets)"
        assert ax.get_yscale() == "log"
        measured = labelled(ax)
        assert [ln.get_label() for ln in measured] == [f"{e} [emulated]" for e in ENGINES]
        assert len([ln for ln in ax.get_lines() if ln.get_gid() == "model"]) == 5
        # baselines only at 1 SSD, the striped engines at 1 and 2
        assert [len(ln.get_xdata()) for ln in measured] == [2, 2, 2, 1, 1]
    assert axes[0].get_ylabel() == "stall (s, log scale)"
    assert "ALL TARGETS ON ONE DEVICE" in fig.get_supxlabel()


def test_stall_figure_titles_of_long_workload_names_do_not_overlap(run: runs.Run) -> None:
    """Three panels a row with long workload names: each title wrapped to lines of at most
    TITLE_CHARS[3] characters, and no title's drawn box overlaps another's."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from analysis.figures.stall import TITLE_CHARS, panel_title

    long = {
        "synthetic-1GiB-4MiB": "olmoe-1b-7b-0924-expert-shard-of-rank-0-with-optimizer",
        "synthetic-1GiB-256MiB": "llama3_70b_tensor_parallel_shard_with_adam_moments",
    }
    ok = run.ok.assign(workload=run.ok["workload"].map(long))
    third = ok[ok["workload"] == long["synthetic-1GiB-4MiB"]].assign(
        workload="averyveryverylongworkloadnamewithoutanyplacetobreakitatall"
    )
    fig = stall_vs_ssds(dataclasses.replace(run, ok=pd.concat([ok, third])), None)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    axes = [ax for ax in fig.get_axes() if ax.get_visible()]
    assert len(axes) == 3
    titles = [ax.get_title() for ax in axes]
    for t in titles:
        assert all(0 < len(line) <= TITLE_CHARS[3] for line in t.split("\n")), t
    # the words are all there, in order, cut only at their hyphens and underscores
    assert titles[0].replace("\n", " ").replace("- ", "-") == (
        "olmoe-1b-7b-0924-expert-shard-of-rank-0-with-optimizer (1GiB)"
    )
    assert (
        titles[1].replace("\n", "") == "llama3_70b_tensor_parallel_shard_with_adam_moments (1GiB)"
    )
    assert panel_title("synthetic-1GiB-4MiB", 1 << 30, 2) == "synthetic-1GiB-4MiB (1GiB)"
    boxes = [ax.title.get_window_extent(canvas.get_renderer()) for ax in axes]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert a.x1 <= b.x0 or b.x1 <= a.x0 or a.y1 <= b.y0 or b.y1 <= a.y0, (a, b)


def test_host_memory_figure(run: runs.Run) -> None:
    fig = host_memory(run)
    ax = fig.get_axes()[0]
    assert ax.get_ylabel() == "host memory / checkpoint size (x S)"
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks == [f"{e}\n[emulated]" for e in ENGINES]
    pinned = [p.get_height() for p in ax.containers[0]]
    cache = [p.get_height() for p in ax.containers[1]]
    assert pinned == pytest.approx([0, 1, 1, 0, 0])
    assert cache[2] == pytest.approx(1.0, abs=0.05)  # cpu-double: the page-cache copy
    assert cache[1] == pytest.approx(0.0, abs=0.01)  # cpu-single: O_DIRECT
    model_line = next(ln for ln in ax.get_lines() if ln.get_label() == "model")
    assert list(model_line.get_ydata()) == [0, 1, 2, 1, 2]


def test_feasibility_figure(run: runs.Run) -> None:
    profs = [*load_profiles(), from_run(run)]
    fig = feasibility(profs, run)
    ax = fig.get_axes()[0]
    assert ax.get_xlabel() == "SSDs per GPU, n"
    assert ax.get_ylabel() == "GDS stall / CPU-centric stall (log scale)"
    lines = labelled(ax)
    assert [ln.get_label() for ln in lines] == [
        "a100-gen4",
        "dgx-h100-gen4",
        "dgx-h100-gen5",
        "nd-h200-v5",
        "this-machine (one shared device)",
    ]
    h100 = lines[1]
    # the same function as the headline: all 8 GPUs at once, d = min(52.77, 100 / 8)
    assert h100.get_ydata()[0] == pytest.approx(12.5 / 3.8)
    assert h100.get_ydata()[0] == pytest.approx(stall_ratio(load_profile("dgx-h100-gen4"), 1))
    # break-even annotations, one per profile that breaks even within 20 SSDs
    assert sorted(t.get_text() for t in ax.texts) == ["2", "4", "4", "4"]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "today's 8-GPU servers: ~1 data SSD per GPU" in legend
    # (b) loading: CPU-centric restore / GDS restore from the profiles' read figures
    bx = fig.get_axes()[1]
    assert bx.get_ylabel() == "CPU-centric restore / GDS restore"
    rl = labelled(bx)
    assert [ln.get_label() for ln in rl] == [
        "a100-gen4 (read figures assumed)",  # its h2d: a measured figure of unstated direction
        "dgx-h100-gen4",
        "dgx-h100-gen5",
        "nd-h200-v5",
        "this-machine: no read figure, not modelled",  # a run without read ceilings
    ]
    # dgx-h100-gen4, 8 GPUs at once: h_g = min(35, 100 / 8) = 12.5 GB/s, r = 6.4 GB/s a SSD;
    # n = 1: min(6.4, 35) / min(6.4, 12.5) = 1; n = 2: 12.8 / 12.5; n = 4: min(25.6, 35) / 12.5
    assert list(rl[1].get_ydata()[[0, 1, 3]]) == pytest.approx([1.0, 12.8 / 12.5, 25.6 / 12.5])
    # n >= 6: min(6 x 6.4, 35) / 12.5 = 2.8; dgx-h100-gen5 (r = 13) from n = 1: 13 / 12.5
    assert rl[1].get_ydata()[-1] == pytest.approx(35 / 12.5)
    assert rl[2].get_ydata()[0] == pytest.approx(13 / 12.5)
    assert np.isnan(rl[4].get_ydata()).all()
    # dots where GDS starts to load faster: n = h_g / r (12.5 / 6.4, 12.5 / 13, 12.5 / 6)
    dots = sorted(ln.get_xdata()[0] for ln in bx.get_lines() if ln.get_marker() == "o")
    assert dots == pytest.approx(sorted([12.5 / 13, 12.5 / 6.4, 12.5 / 6.4, 12.5 / 6.0]))


def test_lost_fraction_figure_of_a_run_says_it_is_emulated(run: runs.Run) -> None:
    this = from_run(run)
    fig = lost_fraction(this, run=run)
    ax = fig.get_axes()[0]
    assert ax.get_xlabel() == "mean time between failures (hours, log scale)"
    assert [ln.get_label() for ln in labelled(ax)] == [pl.engine for pl in plan(this, 3600)]
    assert f"run {run.run_id}" in fig.get_supxlabel()
    assert "HOST-EMULATED" in fig.get_supxlabel()
    # A profile alone (`ckptbench model`) is a model, not a run: no run footer.
    assert fig.get_supxlabel() != lost_fraction(this).get_supxlabel()


def test_restore_figure(run: runs.Run) -> None:
    fig = restore_figure(run)
    ax, bx = fig.get_axes()
    assert ax.get_ylabel() == bx.get_ylabel() == "restore bandwidth (GB/s)"
    assert ax.get_xlabel() == "tensor size (log scale)" and bx.get_xlabel() == "SSDs (targets)"
    for a in (ax, bx):
        assert [ln.get_label() for ln in labelled(a)] == [f"{e} [emulated]" for e in ENGINES]
    # (a) cpu-single at 256 MiB tensors: S / its median restore_s (0.644652, 0.682635, 0.881378)
    assert labelled(ax)[1].get_ydata()[1] == pytest.approx(S / 0.682635 / 1e9, rel=1e-5)
    # (b) the workload of the largest tensors, across SSD counts: gds at 1 and 2 targets,
    # torch-save at its one (median restore 1.386694 of 1.386694, 0.536673, 1.430686)
    assert bx.get_title() == "(b) synthetic-1GiB-256MiB (1GiB)"
    assert list(labelled(bx)[0].get_xdata()) == [1, 2]
    assert labelled(bx)[3].get_ydata()[0] == pytest.approx(S / 1.386694 / 1e9, rel=1e-5)
    # no read ceilings in this run: no dashed ceiling, and the footer says so
    assert not [ln for a in (ax, bx) for ln in a.get_lines() if ln.get_gid() == "ceiling"]
    assert "this run measured no read ceilings" in fig.get_supxlabel()


def test_restore_rows_best_baseline_and_cache_left(run: runs.Run) -> None:
    table = stats.summary_table(run)
    headers, rows = restore_rows(run, table)
    assert headers[5:] == [
        "restore s",
        "restore GB/s",
        "IQR",
        "read ceiling GB/s",
        "restore eff",
        "x best baseline restore",
        "page cache left xS",
    ]
    at = {(r[0], r[1], r[2]): r for r in rows}
    # synthetic-1GiB-256MiB: the baselines' median restores, torch-save 1.386694 and dcp
    # 2.335415: the best is torch-save's; gds's median 0.494077, cpu-single's 0.682635
    gds = at[("synthetic-1GiB-256MiB", "1", "gds")]
    assert gds[5] == "0.494"
    assert gds[10] == stats.fmt(1.386694 / 0.494077)  # 2.81
    assert at[("synthetic-1GiB-256MiB", "1", "cpu-single")][10] == stats.fmt(1.386694 / 0.682635)
    assert at[("synthetic-1GiB-256MiB", "1", "torch-save")][10] == "1"
    assert at[("synthetic-1GiB-256MiB", "1", "dcp")][10] == stats.fmt(1.386694 / 2.335415)
    # a run before restore_cached_bytes: n/a; no read ceilings: no ceiling, no efficiency
    assert {r[11] for r in rows} == {"n/a"} and {(r[8], r[9]) for r in rows} == {("-", "-")}
    # with the column: the median left behind over S (cpu-double's rows half the checkpoint)
    ok = run.ok.assign(restore_cached_bytes=0)
    ok.loc[ok["engine"] == "cpu-double", "restore_cached_bytes"] = S // 2
    cached = dataclasses.replace(run, ok=ok)
    _, rows = restore_rows(cached, stats.summary_table(cached))
    assert {r[11] for r in rows if r[2] == "cpu-double"} == {"0.50"}
    assert {r[11] for r in rows if r[2] != "cpu-double"} == {"0.00"}


def test_the_lost_time_plan_restarts_with_the_measured_restore(run: runs.Run) -> None:
    """Each path's restart reads the checkpoint back as the run measured it: the median
    restore_s of its rows of the largest checkpoint at the fewest targets (both workloads)."""
    got = measured_restores(run)
    # gds at 1 target: 0.373774, 0.406707, 0.494077, 0.512507, 0.693401, 1.022328
    assert got["gds"] == pytest.approx((0.494077 + 0.512507) / 2)
    # torch-save: 0.536673, 0.616327, 0.815432, 1.386694, 1.430686, 3.898793
    assert got["torch-save"] == pytest.approx((0.815432 + 1.386694) / 2)
    this = from_run(run)
    plans = {pl.engine: pl for pl in plan(this, 3600, restores=got)}
    assert plans["gds"].restore_s == pytest.approx(got["gds"])
    assert {pl.restore_from for pl in plans.values()} == {"measured"}
    fig = lost_fraction(this, run=run, restores=got)
    assert "restart: 0 s + each path's measured restore" in fig.get_supxlabel().replace("\n", " ")


# Read ceilings planted in a copy of the fixture (the run predates them), as env.json keeps them:
# before the sweep only, host-emulated (no host-to-device link). B/s.
R1, R2 = 2.5e9, 3.0e9  # O_DIRECT read of 1 and 2 targets
Q1_ONE, Q1, Q2 = 1.0e9, 1.5e9, 2.5e9  # buffered read: one reader, 1 target (2 readers), 2
COPY_BPS = 5.0e9


@pytest.fixture(scope="module")
def read_run(tmp_path_factory: pytest.TempPathFactory) -> runs.Run:
    from bench.measure.ceilings import (
        BUFFERED_READ,
        DIRECT_READ,
        Ceilings,
        Count,
        Measured,
        Tried,
        Writers,
    )

    out = tmp_path_factory.mktemp("read-run") / DEFAULT.name
    shutil.copytree(DEFAULT, out)
    buffered_1 = Measured(Q1, (Q1,), Writers(2), (Tried(Writers(1), Q1_ONE), Tried(Writers(2), Q1)))
    before = Ceilings(
        {
            1: Count(
                S,
                {
                    DIRECT_WRITE: Measured(1.0e9, (1.0e9,)),
                    BUFFERED_WRITE: Measured(0.8e9, (0.8e9,)),
                    DIRECT_READ: Measured(R1, (R1,)),
                    BUFFERED_READ: buffered_1,
                },
            ),
            2: Count(
                S // 2,
                {
                    DIRECT_WRITE: Measured(1.2e9, (1.2e9,)),
                    BUFFERED_WRITE: Measured(0.9e9, (0.9e9,)),
                    DIRECT_READ: Measured(R2, (R2,)),
                    BUFFERED_READ: Measured(Q2, (Q2,), Writers(2)),
                },
            ),
        },
        {COPY: Measured(COPY_BPS, (COPY_BPS,))},
    )
    env = json.loads((out / "env.json").read_text())
    env["ceilings"] = before.to_json()
    (out / "env.json").write_text(json.dumps(env))
    return runs.load(str(out))


def test_the_model_predicts_restores_from_the_read_ceilings(read_run: runs.Run) -> None:
    this = from_run(read_run)
    assert this.h2d_Bps is None  # host-emulated: restores land in host memory
    frame = model_frame(read_run, this).set_index(["workload", "n_targets", "engine"])
    wl = "synthetic-1GiB-256MiB"
    # O_DIRECT paths: S / R(n), no link to bound them
    assert frame.loc[(wl, 1, "gds"), "restore_model_s"] == pytest.approx(S / R1)
    assert frame.loc[(wl, 2, "cpu-single"), "restore_model_s"] == pytest.approx(S / R2)
    # cpu-double: S / min(Q(n), C)
    assert frame.loc[(wl, 2, "cpu-double"), "restore_model_s"] == pytest.approx(S / Q2)
    # torch-save and dcp read their file(s) on the first target: Q(1), the search's best (its
    # slower run of one reader is no term of its own: readahead keeps one reader as fast)
    assert frame.loc[(wl, 1, "torch-save"), "restore_model_s"] == pytest.approx(S / Q1)
    assert frame.loc[(wl, 1, "dcp"), "restore_model_s"] == pytest.approx(S / Q1)
    # measured: gds's median restore_s of that case (0.373774, 0.494077, 0.693401)
    assert frame.loc[(wl, 1, "gds"), "restore_measured_s"] == pytest.approx(0.494077)
    headers, rows = model_vs_measured(frame.reset_index())
    assert headers[10:] == ["restore s: model", "measured", "error %"]
    gds = next(r for r in rows if r[:3] == [wl, "1", "gds"])
    assert gds[10:] == [
        stats.fmt(S / R1),
        stats.fmt(0.494077),
        f"{100 * (S / R1 / 0.494077 - 1):+.0f}",  # -13
    ]
    errs = model_errors(frame.reset_index())
    assert errs["restore_err"].notna().all()
    # the restore's yardstick: restore GB/s over the read ceiling of its kind and targets
    eff = read_run.ok.set_index(["workload", "n_targets", "engine", "rep"])["restore_eff"]
    assert eff[(wl, 1, "gds", 1)] == pytest.approx(S / 0.494077 / R1, abs=1e-4)
    assert eff[(wl, 1, "torch-save", 0)] == pytest.approx(S / 1.386694 / Q1, abs=1e-4)


def test_restore_figure_and_rows_draw_the_read_ceilings(read_run: runs.Run) -> None:
    fig = restore_figure(read_run)
    ax, bx = fig.get_axes()
    ceilings = {a: [ln for ln in a.get_lines() if ln.get_gid() == "ceiling"] for a in (ax, bx)}
    # (a) at one target: O_DIRECT 2.5 GB/s (gds, cpu-single), buffered 1.5 GB/s (the rest)
    assert {ln.get_label(): list(ln.get_ydata()) for ln in ceilings[ax]} == {
        "read ceiling: gds, cpu-single": [R1 / 1e9] * 2,
        "read ceiling: cpu-double, torch-save, dcp": [Q1 / 1e9] * 2,
    }
    assert [ln.get_linestyle() for ln in ceilings[ax]] == ["--", ":"]
    # (b) against SSDs: the O_DIRECT read of 1 and 2 targets, the buffered one, and the
    # baselines' one point (a short dash) at their one target
    assert {ln.get_label(): list(ln.get_ydata()) for ln in ceilings[bx]} == {
        "read ceiling: gds, cpu-single": [R1 / 1e9, R2 / 1e9],
        "read ceiling: cpu-double": [Q1 / 1e9, Q2 / 1e9],
        "read ceiling: torch-save, dcp": [Q1 / 1e9],
    }
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend[5:] == [  # after the engines: (a)'s ceilings, then those (b) adds
        "read ceiling: gds, cpu-single",
        "read ceiling: cpu-double, torch-save, dcp",
        "read ceiling: cpu-double",
        "read ceiling: torch-save, dcp",
    ]
    _, rows = restore_rows(read_run, stats.summary_table(read_run))
    gds = next(r for r in rows if r[:3] == ["synthetic-1GiB-256MiB", "1", "gds"])
    assert gds[8:10] == ["2.50", f"{S / 0.494077 / R1:.2f}"]
    cd = next(r for r in rows if r[:3] == ["synthetic-1GiB-256MiB", "2", "cpu-double"])
    assert cd[8] == "2.50"  # Q(2)


def test_timeline_figure(run: runs.Run) -> None:
    fig = timeline(run)
    ax = fig.get_axes()[0]
    assert ax.get_xlabel() == "time from save() (s)"
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        f"{e} [emulated]" for e in reversed(ENGINES)
    ]
    assert "synthetic-1GiB-256MiB, 1 target(s)" in ax.get_title()

    def row(y: int) -> list:  # the full-height bars of one engine, left to right
        return sorted(
            (
                p
                for p in ax.patches
                if abs(p.get_y() + p.get_height() / 2 - y) < 1e-9
                and p.get_height() == pytest.approx(0.6)
            ),
            key=lambda p: p.get_x(),
        )

    # cpu-single (row 3 from the bottom): its median repetition by total_s has total_s
    # 0.415854 and stall_s 0.098805; persist runs from the stall to the total
    stall_bar, persist_bar = row(3)
    assert (stall_bar.get_x(), stall_bar.get_width()) == pytest.approx((0, 0.098805), abs=1e-6)
    assert persist_bar.get_x() == pytest.approx(0.098805, abs=1e-6)
    assert persist_bar.get_x() + persist_bar.get_width() == pytest.approx(0.415854, abs=1e-6)
    # gds (top row): one bar, all of it stall (median of 0.388271, 0.454621, 0.459139)
    (gds,) = row(4)
    assert gds.get_width() == pytest.approx(0.454621, abs=1e-6)
    # checksum time: a thin bar inside cpu-single's persist phase
    thin = [p for p in ax.patches if p.get_height() == pytest.approx(0.18)]
    assert len(thin) == 2  # cpu-single and cpu-double
    assert thin[0].get_x() == pytest.approx(0.098805, abs=1e-6)


def test_compat_rows_are_labelled(tmp_path: Path) -> None:
    r = runs.load(compat_copy(tmp_path))
    assert not r.emulated
    fig = bandwidth_vs_tensor_size(r)
    got = [ln.get_label() for ln in labelled(fig.get_axes()[0])]
    assert got == ["gds [compat]", "cpu-single", "cpu-double", "torch-save", "dcp"]
    assert "NOT GPUDirect Storage" in fig.get_supxlabel()
    _, rows = stats.summary_rows(stats.summary_table(r))
    assert {row[3] for row in rows if row[2] == "gds"} == {"COMPAT"}
    assert {row[3] for row in rows if row[2] != "gds"} == {"-"}
    assert (
        "gds rows marked compat ran in kvikio compat mode: NOT GPUDirect Storage."
        in warnings_for(r)
    )


# --- stalls timed by the engines (runs before ckptbench 0.2.0) ---------------------------------

OLD_CLOCK = (
    "This run was made before ckptbench 0.2.0 (env.json has no `stall_clock: harness`): each "
    "engine stopped its own stall clock, which could miss work save() still did after it (up to "
    "38-89 % of the stall on states of 20,000 x 4 KiB tensors), so its stall_s may read short "
    "against newer runs."
)


def clock_copy(tmp_path: Path, stall_clock: str | None, src: Path = DEFAULT) -> str:
    """A copy of a fixture run whose env.json says `stall_clock` (None: the key removed)."""
    out = tmp_path / f"clock-{stall_clock}"
    shutil.copytree(src, out)
    env = json.loads((out / "env.json").read_text())
    env.pop("stall_clock", None)
    if stall_clock is not None:
        env["stall_clock"] = stall_clock
    (out / "env.json").write_text(json.dumps(env))
    return str(out)


def test_a_run_before_the_harness_clock_is_marked(
    run: runs.Run, built: Report, tmp_path: Path
) -> None:
    """The committed fixtures predate `stall_clock`: one loud line, in the caveats, report.md and
    the notes `report` prints; a run timed by the harness has none; another value is named."""
    assert "stall_clock" not in run.env and not run.harness_clock
    assert [w for w in warnings_for(run) if "0.2.0" in w] == [OLD_CLOCK]
    md = (Path(built.outdir) / "report.md").read_text()
    assert md.count("made before ckptbench 0.2.0") == 1
    assert f"> **{OLD_CLOCK}**" in md
    assert OLD_CLOCK in built.notes
    new = runs.load(clock_copy(tmp_path, "harness"))
    assert new.harness_clock
    assert not [w for w in warnings_for(new) if "0.2.0" in w]
    assert warnings_for(new) == [w for w in warnings_for(run) if w != OLD_CLOCK]
    other = runs.load(clock_copy(tmp_path, "engine"))
    (said,) = [w for w in warnings_for(other) if "0.2.0" in w]
    assert said.startswith("This run was made before ckptbench 0.2.0 (stall_clock 'engine'): ")


def test_report_of_a_harness_clock_run_has_no_such_line(tmp_path: Path) -> None:
    new = clock_copy(tmp_path, "harness")
    rep = build(new, str(tmp_path / "rep"))
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "0.2.0" not in md and "stall_clock" not in md
    assert not any("0.2.0" in n for n in rep.notes)
    assert "> **HOST-EMULATED run (no GPU)" in md  # the other caveats stay


# --- the report ----------------------------------------------------------------------------


def test_report_writes_every_file(built: Report) -> None:
    out = Path(built.outdir)
    for stem in FIGURES:
        assert (out / f"{stem}.png").stat().st_size > 10_000
        assert (out / f"{stem}.pdf").read_bytes().startswith(b"%PDF")
    for name in ("summary.csv", "report.md", "report.html"):
        assert (out / name).is_file()
    # model_vs_measured.csv, Figure 8 (lost fraction), Figure 9 (host CPU), Figure 12
    # (restore) and host_cost.csv
    assert len(built.paths) == 21
    assert built.seconds < 30


def test_report_md_content(built: Report) -> None:
    md = (Path(built.outdir) / "report.md").read_text()
    assert md.startswith("# ckptbench report: 20261202T160516Z-default-b10c3b\n")
    assert "> **HOST-EMULATED run (no GPU)" in md
    assert (
        "> **gds rows are a host emulation (O_DIRECT from host memory), NOT GPUDirect Storage.**"
        in md
    )
    assert "All targets share one device: SSD-count scaling on this run is not real scaling." in md
    assert "## Is GDS worth it here?" in md
    assert "Figure 4 (feasibility) answers the question" in md
    assert "| dgx-h100-gen4 | 52.77 | 3.80 | 1 | 3.29 | 4 (3.29) |" in md
    assert "| this-machine | 8.61 | 3.02 | 1 | 2.85 | never (one shared device) |" in md
    # the restore columns: dgx-h100-gen4 reads 6.4 GB/s a SSD, min(6.4, 35) / min(6.4, 12.5) =
    # 1 at its one SSD per GPU; Gen5's 13 GB/s: 13 / 12.5
    assert "| 4 (3.29) | 6.40 | 1.00 |" in md and "| 2 (1.89) | 13.00 | 1.04 |" in md
    assert "| - | not modelled (no read figure) |" in md  # this run measured no reads
    assert "GDS is 1.00-1.04x as fast as the CPU-centric O_DIRECT path" in md
    assert "No device ceilings in env.json: no efficiency column." in md
    # the summary row checked number by number in test_summary_table_numbers
    assert (
        "| synthetic-1GiB-256MiB | 1 | cpu-single | EMULATED | 3 | 2.58 | 0.10 | 0.0911 | "
        "0.007 | 0.416 | 4 | 22766 | 79262 | 1.57 | 1.00 | 0.00 | 24.9 | 5.44 |"
    ) in md
    assert "| durable s | tensors | stall us/tensor | persist us/tensor | restore GB/s |" in md
    for stem in FIGURES:
        assert f"({stem}.png)" in md
    assert "| gds (from device) | W_g | S / min(L, r) | = stall | 0 |" in md
    assert "### Model against measurement" in md
    assert "## Restores" in md and "(restore.png)" in md
    assert "This run measured no read ceilings: no ceiling or efficiency." in md
    assert "| synthetic-1GiB-256MiB | 1 | gds | EMULATED | 3 | 0.494 | 2.17 |" in md
    assert "Restores are not modelled: the run measured no read ceilings." in md
    assert "| target 0 | scratch/bench/target-0: ext4 on /dev/vda" in md
    html = (Path(built.outdir) / "report.html").read_text()
    assert "<table>" in html and '<img src="feasibility.png"' in html


def test_report_summary_csv_matches_table(built: Report, run: runs.Run) -> None:
    csv = pd.read_csv(Path(built.outdir) / "summary.csv")
    pd.testing.assert_frame_equal(
        csv[["workload", "n_targets", "engine", "n"]],
        stats.summary_table(run)[["workload", "n_targets", "engine", "n"]],
        check_dtype=False,
    )
    assert csv["stall_s"].tolist() == pytest.approx(built.summary["stall_s"].tolist())


def test_model_vs_measured_rows(run: runs.Run) -> None:
    this = from_run(run)
    frame = model_frame(run, this)
    assert list(frame[MODEL_CSV].columns) == [
        "workload",
        "n_targets",
        "engine",
        "stall_model_s",
        "stall_measured_s",
        "durable_model_s",
        "durable_measured_s",
        "restore_model_s",
        "restore_measured_s",
    ]
    headers, rows = model_vs_measured(frame)
    assert headers[4:7] == ["stall s: model", "measured", "error %"]
    assert len(rows) == 16
    cs = next(r for r in rows if r[:3] == ["synthetic-1GiB-256MiB", "1", "cpu-single"])
    predicted = S / this.d2h_Bps
    assert cs[4] == stats.fmt(predicted)
    assert cs[6] == f"{100 * (predicted - 0.091066) / 0.091066:+.0f}"
    # A restore that found its checkpoint partly cached is said, loudly.
    assert not any("page cache" in w for w in warnings_for(run))
    resident = run.ok.copy()
    resident.loc[resident.index[:2], "restore_resident_bytes"] = [4096, 3 << 20]
    said = warnings_for(dataclasses.replace(run, ok=resident))
    assert "1 restore(s) began with more than 0.1 % of the checkpoint still in the page " in (
        " ".join(said)
    )  # one page of a 1 GiB checkpoint is not worth a word; 3 MiB is
    assert "3.0 MiB" in " ".join(said)
    # No engine the model knows: an empty table with the same columns, not a KeyError.
    unknown = dataclasses.replace(run, ok=run.ok.assign(engine="mystery"))
    empty = model_frame(unknown, this)
    assert empty.empty and list(empty[MODEL_CSV].columns) == MODEL_CSV
    assert model_errors(empty).empty


def test_cli_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(DEFAULT), "-o", str(tmp_path), "--figures-only"]) == 0
    out = capsys.readouterr().out
    assert "wrote 16 files" in out  # the five figures, Figures 8, 9 and 12, PNG and PDF
    assert "note: HOST-EMULATED run" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f"{s}.{e}"
        for s in (*FIGURES, "lost_fraction", "host_cpu", "restore")
        for e in ("png", "pdf")
    )
    assert main(["report", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ckptbench: error: ") and "no such run directory" in err
    assert err.count("\n") == 1


# --- the layout -----------------------------------------------------------------------------

# analysis' modules from the ground up: each may import only those of an earlier layer (every
# import counts, a function's own included), so that a reader finds each job by its name and
# nothing imports in circles. A new module joins the layer its imports put it in.
LAYERS = [
    ["tables", "runs", "external"],
    ["stats", "cost", "scaling", "mlperf"],
    ["training", "model.profiles"],
    ["model.predict"],
    ["model.host", "model.planning", "model.calibrate", "model.published"],
    ["model.render", "contention"],
    ["summary", "figures.common"],
    ["figures.*", "report.doc", "report.captions"],
    ["report.host", "report.caveats", "report.summary", "report.model", "report.environment"]
    + ["report.training", "report.contention", "report.scaling", "report.restore", "report.mlperf"],
    ["report.answer", "compare"],
    ["report.build"],
]


def _analysis_imports() -> dict[str, set[str]]:
    """Every module of analysis/ (dotted, without `analysis.`) and the analysis modules it
    imports anywhere in its file."""
    import ast

    root = Path(__file__).parent.parent / "analysis"
    out: dict[str, set[str]] = {}
    for f in sorted(root.rglob("*.py")):
        parts = f.relative_to(root).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        deps: set[str] = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("analysis"):
                if node.module == "analysis":
                    deps |= {a.name for a in node.names}
                else:
                    deps.add(node.module.removeprefix("analysis."))
            elif isinstance(node, ast.Import):
                deps |= {
                    a.name.removeprefix("analysis").removeprefix(".")
                    for a in node.names
                    if a.name == "analysis" or a.name.startswith("analysis.")
                }
        out[name] = deps - {name}
    return out


def test_analysis_imports_run_one_way() -> None:
    imports = _analysis_imports()

    def layer(module: str) -> int:
        for i, names in enumerate(LAYERS):
            if module in names or (module.startswith("figures.") and "figures.*" in names):
                return i
        raise AssertionError(f"analysis.{module} is in no layer of LAYERS: add it")

    packages = {"", "model", "figures", "report"}  # their __init__ holds a docstring only
    upward = [
        f"analysis.{m} imports analysis.{d}"
        for m, deps in imports.items()
        if m not in packages
        for d in deps
        if d in packages or layer(d) >= layer(m)
    ]
    assert upward == []
    assert all(not imports[p] for p in packages if p in imports)


def test_doc_html_is_its_markdown_rendered() -> None:
    """report.html is report.md rendered: inline code, emphasis, a pipe inside a cell and text
    that looks like a tag come out as the Markdown means them."""
    d = Doc()
    d.h(2, "Stall of `cpu-single`")
    d.warn("EMULATED: not GDS")
    d.table(["engine", "note"], [["gds", "a|b <script>"]])
    d.img("fig.png", "Figure 1. Stall against SSDs.")
    md, page = d.markdown(), d.html("t")
    assert "| gds | a\\|b <script> |" in md
    assert "<h2>Stall of <code>cpu-single</code></h2>" in page
    assert "<blockquote>\n<p><strong>EMULATED: not GDS</strong></p>" in page
    assert "<td>a|b &lt;script&gt;</td>" in page
    assert '<img src="fig.png" alt="Figure 1" />' in page
    assert "<em>Figure 1. Stall against SSDs.</em>" in page


def test_the_report_carries_the_model_against_published_measurements(built: Report) -> None:
    """Every report says how the model fares against published GPU-server measurements: the
    summary (median error, the worst point and why) and the table."""
    md = Path(built.outdir, "report.md").read_text()
    v = published.validate()
    assert "### Model against published measurements" in md
    assert published.summary(v) in md
    assert f"median error is {100 * v.median_error:.0f} %" in md
    assert v.worst.point.id in md
