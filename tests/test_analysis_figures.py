"""Analysis of a committed fixture run: the figures' axes and lines (bandwidth, stall, host memory,
feasibility, lost fraction, restore, timeline), the restore rows, and the read ceilings the
model predicts restores from.

They read the committed default fixture run (a trimmed real default run, DEFAULT_RUN in
tests/conftest.py); its report is built once for the whole test run (`default_report`).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import DEFAULT_RUN

from analysis import runs, stats
from analysis.figures.bandwidth import bandwidth_vs_tensor_size
from analysis.figures.feasibility import feasibility
from analysis.figures.host import host_memory
from analysis.figures.planning import lost_fraction
from analysis.figures.restore import restore_figure
from analysis.figures.stall import stall_vs_ssds
from analysis.figures.timeline import timeline
from analysis.model.calibrate import from_run
from analysis.model.planning import measured_restores, plan
from analysis.model.predict import stall_ratio
from analysis.model.profiles import load_profile, load_profiles
from analysis.report.caveats import warnings_for
from analysis.report.model import model_errors, model_frame, model_vs_measured
from analysis.report.restore import restore_rows
from bench.measure.ceilings import BUFFERED_WRITE, COPY, DIRECT_WRITE

S = 1 << 30  # the fixture run's synthetic state
ENGINES = ["gds", "cpu-single", "cpu-double", "torch-save", "dcp"]  # the fixture run's engines


@pytest.fixture(scope="module")
def run() -> runs.Run:
    return runs.load(str(DEFAULT_RUN))


def labelled(ax) -> list:  # a matplotlib Axes
    return [ln for ln in ax.get_lines() if not ln.get_label().startswith("_")]


def compat_copy(tmp_path: Path) -> str:
    """The fixture as if measured on a GPU with kvikio in compat mode."""
    out = tmp_path / "compat-run"
    shutil.copytree(DEFAULT_RUN, out)
    df = pd.read_csv(out / "results.csv", keep_default_na=False, dtype=str)
    df["device"] = "cuda"
    df["emulated"] = "False"
    df.loc[df["engine"] == "gds", "gds_mode"] = "compat"
    df.to_csv(out / "results.csv", index=False)
    env = json.loads((out / "env.json").read_text())
    env["device"] = {"kind": "cuda", "emulated": False}
    (out / "env.json").write_text(json.dumps(env))
    return str(out)


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

    out = tmp_path_factory.mktemp("read-run") / DEFAULT_RUN.name
    shutil.copytree(DEFAULT_RUN, out)
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
