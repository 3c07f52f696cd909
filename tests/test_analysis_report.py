"""The report of a committed fixture run: every file written, report.md's content, summary.csv,
the model against the measurement and published figures, report.html, and `ckptbench report`.

They read the committed default fixture run (a trimmed real default run, DEFAULT_RUN in
tests/conftest.py); its report is built once for the whole test run (`default_report`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
import pytest
from conftest import DEFAULT_RUN

from analysis import runs, stats
from analysis.model import published
from analysis.model.calibrate import from_run
from analysis.report.build import Report
from analysis.report.captions import FIGURES
from analysis.report.caveats import warnings_for
from analysis.report.doc import Doc
from analysis.report.model import MODEL_CSV, model_errors, model_frame, model_vs_measured
from bench.cli import main

S = 1 << 30  # the fixture run's synthetic state


@pytest.fixture(scope="module")
def run() -> runs.Run:
    return runs.load(str(DEFAULT_RUN))


def test_report_writes_every_file(default_report: Report) -> None:
    out = Path(default_report.outdir)
    for stem in FIGURES:
        assert (out / f"{stem}.png").stat().st_size > 10_000
        assert (out / f"{stem}.pdf").read_bytes().startswith(b"%PDF")
    for name in ("summary.csv", "report.md", "report.html"):
        assert (out / name).is_file()
    # model_vs_measured.csv, Figure 8 (lost fraction), Figure 9 (host CPU), Figure 12
    # (restore) and host_cost.csv
    assert len(default_report.paths) == 21


@pytest.mark.alone  # a bound on wall time: with another test beside it, it would time both
def test_a_default_runs_report_builds_in_under_30_s(tmp_path: Path) -> None:
    from analysis.report.build import build

    report = build(str(DEFAULT_RUN), str(tmp_path))
    assert len(report.paths) == 21
    assert report.seconds < 30


def test_report_md_content(default_report: Report) -> None:
    md = (Path(default_report.outdir) / "report.md").read_text()
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
    html = (Path(default_report.outdir) / "report.html").read_text()
    assert "<table>" in html and '<img src="feasibility.png"' in html


def test_report_summary_csv_matches_table(default_report: Report, run: runs.Run) -> None:
    csv = pd.read_csv(Path(default_report.outdir) / "summary.csv")
    pd.testing.assert_frame_equal(
        csv[["workload", "n_targets", "engine", "n"]],
        stats.summary_table(run)[["workload", "n_targets", "engine", "n"]],
        check_dtype=False,
    )
    assert csv["stall_s"].tolist() == pytest.approx(default_report.summary["stall_s"].tolist())


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
    assert main(["report", str(DEFAULT_RUN), "-o", str(tmp_path), "--figures-only"]) == 0
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


def test_the_report_carries_the_model_against_published_measurements(
    default_report: Report,
) -> None:
    """Every report says how the model fares against published GPU-server measurements: the
    summary (median error, the worst point and why) and the table."""
    md = Path(default_report.outdir, "report.md").read_text()
    v = published.validate()
    assert "### Model against published measurements" in md
    assert published.summary(v) in md
    assert f"median error is {100 * v.median_error:.0f} %" in md
    assert v.worst.point.id in md
