"""analysis.contention, Figure 7 and the sharing model, on a committed multi-rank run.

The fixture is a run of configs/multirank.yaml (4 ranks, 1/2/4 checkpointing at once, shared
targets and dedicated subfolders; tests/fixtures/README.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import assert_answers_first, assert_glossary_complete, report_sections

from analysis import contention, runs
from analysis.figures.contention import contention as contention_figure
from analysis.model.calibrate import from_run
from analysis.model.predict import predict_shared
from analysis.model.profiles import Profile
from analysis.report.build import build

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "runs"
MULTI = FIXTURES / "20261202T173015Z-multirank-dfbdb1"
DEFAULT = FIXTURES / "20261202T160516Z-default-b10c3b"


@pytest.fixture(scope="module")
def run() -> runs.Run:
    return runs.load(str(MULTI))


def test_single_rank_rows_and_ranked_rows_are_kept_apart(run: runs.Run) -> None:
    # one-rank cases (per-rank rows) feed Figures 1-5; everything else is `ranked`
    assert set(run.ok["ranks_active"]) == {1} and not run.ok["aggregate"].any()
    assert set(run.ok["rank"]) == {0} and len(run.ok) == 2 * 3  # 2 engines x 3 repetitions
    r = run.ranked
    assert set(r["ranks_active"]) == {1, 2, 4}
    assert set(r["target_map"]) == {"shared", "dedicated-subfolders"}
    agg = r[r["aggregate"]]
    assert len(agg) == 2 * 5 * 3  # engines x (1 + 2 mappings x 2 counts) x repetitions
    assert set(agg["rank"]) == {-1} and set(agg["world_size"]) == {4}


def test_runs_without_rank_columns_read_as_rank_0_of_1() -> None:
    old = runs.load(str(DEFAULT))
    assert set(old.rows["rank"]) == {0} and set(old.rows["world_size"]) == {1}
    assert not old.rows["aggregate"].any() and set(old.rows["ranks_active"]) == {1}
    assert old.ranked.empty and not contention.present(old)


def test_table_medians_from_aggregate_rows(run: runs.Run) -> None:
    prof = from_run(run)
    t = contention.table(run, prof)
    assert len(t) == 2 * 5
    row = t[
        (t["engine"] == "cpu-single") & (t["target_map"] == "shared") & (t["ranks_active"] == 4)
    ].iloc[0]
    agg = run.ranked[
        run.ranked["aggregate"]
        & (run.ranked["engine"] == "cpu-single")
        & (run.ranked["target_map"] == "shared")
        & (run.ranked["ranks_active"] == 4)
    ]
    assert row["stall_s"] == pytest.approx(agg["stall_s"].median())
    assert row["agg_GBps"] == pytest.approx((agg["total_bytes"] / agg["total_s"]).median() / 1e9)
    assert row["g"] == 4 and row["shard_bytes"] == 128 * 2**20
    # The model's formulas worked out here for cpu-single, 4 ranks sharing 2 SSDs, 128 MiB
    # each: the snapshot at d = min(b, C / 4), then the write at a quarter of what the run
    # measured for 2 SSDs at once.
    s = 128 * 2**20
    snap = s / min(prof.d2h_Bps, prof.host_copy_Bps / 4)
    w2 = dict(prof.direct_by_n)[2]
    assert row["model_stall_s"] == pytest.approx(snap)
    assert row["model_GBps"] == pytest.approx(4 * s / (snap + s / (w2 / 4)) / 1e9)


def test_notes_give_aggregate_bandwidth_against_one_rank(run: runs.Run) -> None:
    t = contention.table(run, None)
    notes = contention.notes(t)
    assert len(notes) == 2
    one = t[(t["engine"] == "gds") & (t["ranks_active"] == 1)]["agg_GBps"].iloc[0]
    four = t[(t["engine"] == "gds") & (t["ranks_active"] == 4) & (t["target_map"] == "shared")][
        "agg_GBps"
    ].iloc[0]
    gds = next(n for n in notes if n.startswith("gds, synthetic-512MiB-16MiB, 2 SSD(s): "))
    assert f"1 rank {one:.2f} GB/s" in gds
    assert f"4 ranks shared {four:.2f} GB/s = {four / one:.2f}x" in gds
    assert "4 ranks dedicated-subfolders" in gds


def test_contention_figure(run: runs.Run) -> None:
    fig = contention_figure(run, from_run(run))
    (ax, bx) = fig.axes[:2]
    assert ax.get_xlabel() == bx.get_xlabel() == "ranks checkpointing at once"
    assert bx.get_ylabel() == "aggregate write (GB/s)"
    assert list(ax.get_xticks()) == [1, 2, 4]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend[:2] == ["gds [emulated]", "cpu-single [emulated]"]
    assert "shared targets" in legend and "dedicated-subfolders targets" in legend
    assert "O_DIRECT ceiling, 2 target(s), 1 process" in legend
    # the measured aggregate bandwidth is drawn as measured: cpu-single shared, k = 1, 2, 4
    t = contention.table(run, None)
    want = contention.series(t, "synthetic-512MiB-16MiB", 2, "cpu-single", "shared")["agg_GBps"]
    drawn = [ln.get_ydata() for ln in bx.get_lines() if len(ln.get_ydata()) == 3]
    assert any(np.allclose(d, want.to_numpy()) for d in drawn)


def test_report_has_the_contention_section(run: runs.Run, tmp_path: Path) -> None:
    rep = build(str(MULTI), str(tmp_path))
    names = {Path(p).name for p in rep.paths}
    assert {"contention.png", "contention.pdf", "report.md"} <= names
    md = (tmp_path / "report.md").read_text()
    assert "## Many ranks at once" in md and "![Figure 7](contention.png)" in md
    assert "**Measured aggregate write bandwidth against one rank alone:**" in md
    assert_answers_first(md)
    assert_glossary_complete(md)
    many = report_sections(md)["Many ranks at once"][0]
    assert many.startswith("4 ranks at once write ") and "x one rank alone" in many
    assert any(n.startswith("aggregate write bandwidth, gds, ") for n in rep.notes)


def test_predict_shared_by_hand() -> None:
    # b 10, C 20 GB/s; w 2 GB/s, 4 SSDs on the host; shard 8 GB
    p = Profile(
        "t",
        "",
        d2h_Bps=10e9,
        ssd_write_Bps=2e9,
        ssds_per_gpu=1,
        gpus_sharing_host=4,
        host_copy_Bps=20e9,
        size_bytes=8 * 10**9,
    )
    assert (p.host_gpus, p.host_ssds) == (4, 4)
    one = predict_shared(p, "gds", 1, 4)
    assert one.stall_s == pytest.approx(8 / 8)  # S / min(L, 4 w)
    four = predict_shared(p, "gds", 4, 4)
    assert four.stall_s == pytest.approx(8 / 2)  # W_r = 8 / 4
    cs = predict_shared(p, "cpu-single", 4, 4)
    assert cs.stall_s == pytest.approx(8 / 5)  # min(b, C / 4) = 5
    assert cs.durable_s == pytest.approx(8 / 5 + 8 / 2)
    cd = predict_shared(p, "cpu-double", 4, 4)
    assert cd.durable_s == pytest.approx(8 / 5 + 8 / min(5, 2))
    ts = predict_shared(p, "torch-save", 4, 4)  # every first target is SSD 0: w / 4
    assert ts.stall_s == pytest.approx(8 / 5 + 8 / 0.5)
    td = predict_shared(p, "torch-save", 4, 4, mapping="dedicated")  # one SSD each
    assert td.stall_s == pytest.approx(8 / 5 + 8 / 2)
    shared_dev = Profile("t", "", 10e9, 2e9, 1, 4, 20e9, 8 * 10**9, shared_device=True)
    assert predict_shared(shared_dev, "gds", 4, 4).stall_s == pytest.approx(8 / 0.5)
    with pytest.raises(Exception, match="ranks must be at least 1"):
        predict_shared(p, "gds", 0)


def test_cli_model_prints_the_sharing_table(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.cli import main

    assert main(["model", "dgx-h100-gen4"]) == 0
    out = capsys.readouterr().out
    assert "g GPUs of one host saving their 80 GB shards at once over its 8 SSD(s)" in out
    lines = {ln.split()[0]: ln.split() for ln in out.splitlines() if ln[:2] in ("1 ", "8 ")}
    assert lines["8"][1:3] == ["21.1", "(30.4)"]  # gds: 80 GB / (8 x 3.8 / 8); 8 x 80 / 21.1
    assert lines["8"][3] == "6.4"  # cpu-single: 80 / min(52.77, 100 / 8)
