"""`ckptbench compare` on two committed fixture runs: the same sweep on the virtio disk (A) and
on a RAM-backed loop device (B); refusals when the essential environment differs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import compare
from analysis.figures.compare import compare_bandwidth
from bench.cli import main
from bench.common.errors import UserError

FIX = Path(__file__).parent / "fixtures" / "runs"
A = FIX / "20261202T161542Z-cmpa-0ead53"
B = FIX / "20261202T161559Z-cmpb-52ec19"


@pytest.fixture(scope="module")
def ab() -> compare.Comparison:
    return compare.compare([str(A), str(B)])


def timed(run: Path) -> pd.DataFrame:
    df = pd.read_csv(run / "results.csv")
    return df[~df["warmup"]]


def edited_copy(
    tmp_path: Path,
    rows: dict[str, str] | None = None,
    gds_mode: str | None = None,
    device: dict | None = None,
) -> str:
    out = tmp_path / "edited"
    shutil.copytree(B, out)
    df = pd.read_csv(out / "results.csv", keep_default_na=False, dtype=str)
    for k, v in (rows or {}).items():
        df[k] = v
    if gds_mode:
        df.loc[df["engine"] == "gds", "gds_mode"] = gds_mode
    df.to_csv(out / "results.csv", index=False)
    if device:
        env = json.loads((out / "env.json").read_text())
        env["device"] = device
        (out / "env.json").write_text(json.dumps(env))
    return str(out)


def test_shared_cases_and_numbers(ab: compare.Comparison) -> None:
    t = ab.table
    assert len(t) == 6  # 3 engines x 2 workloads at 1 SSD
    assert list(t["engine"]) == ["gds", "cpu-single", "cpu-double"] * 2
    assert set(t["run"]) == {"B"}
    assert set(t["n_a"]) == set(t["n_b"]) == {5}
    a, b = timed(A), timed(B)
    for r in t.itertuples():
        sa = a[(a["engine"] == r.engine) & (a["workload"] == r.workload)]
        sb = b[(b["engine"] == r.engine) & (b["workload"] == r.workload)]
        ma = float(np.median(sa["total_bytes"] / sa["total_s"] / 1e9))
        mb = float(np.median(sb["total_bytes"] / sb["total_s"] / 1e9))
        assert r.median_a == pytest.approx(ma)
        assert r.median_b == pytest.approx(mb)
        assert r.ratio == pytest.approx(mb / ma)
        assert r.ci_low <= r.ratio <= r.ci_high
        assert r.significant == ((r.ci_low > 1 or r.ci_high < 1) and r.p_value < 0.05)
        if not r.significant:
            assert r.verdict == "not significant"
        else:
            assert r.verdict == ("B better" if r.ratio > 1 else "B worse")
    gds16 = t[(t["engine"] == "gds") & (t["workload"] == "synthetic-64MiB-16MiB")].iloc[0]
    assert gds16["verdict"] == "B better"  # the RAM disk: 3.18 vs 1.36 GB/s
    assert set(t["mode_a"]) == set(t["mode_b"]) == {"EMULATED"}


def test_a_run_against_itself_is_not_significant() -> None:
    c = compare.compare([str(A), str(A)], metric="stall")
    assert (c.table["ratio"] == 1).all()
    assert (c.table["verdict"] == "not significant").all()
    assert c.refusals == [] and c.warnings == []


def test_differences_are_warned(ab: compare.Comparison) -> None:
    assert ab.refusals == []
    assert any(w.startswith("storage differs") and "vda" in w and "loop0" in w for w in ab.warnings)


def _with_clock(tmp_path: Path, run: Path, stall_clock: str) -> str:
    out = tmp_path / f"{run.name}-{stall_clock}"
    shutil.copytree(run, out)
    env = json.loads((out / "env.json").read_text())
    env["stall_clock"] = stall_clock
    (out / "env.json").write_text(json.dumps(env))
    return str(out)


def test_runs_before_the_harness_clock_are_named_once(
    ab: compare.Comparison, tmp_path: Path
) -> None:
    """Both fixtures predate `stall_clock: harness`: one note naming both, no warning (the same
    clock); an older run against a newer one: the note names the older, and a warning says the
    clocks differ; two newer runs: nothing."""
    (note,) = ab.notes
    assert note.startswith(
        "Runs A and B were made before ckptbench 0.2.0 (env.json has no `stall_clock: harness`):"
    )
    assert note.endswith("so their stall_s may read short against newer runs.")
    assert not any("clock" in w for w in ab.warnings)
    text = compare.text(ab)
    assert text.count("ckptbench 0.2.0") == 1 and f"note: {note}" in text
    newer_b = _with_clock(tmp_path, B, "harness")
    mixed = compare.compare([str(A), newer_b], metric="stall")
    (note,) = mixed.notes
    assert note.startswith("Run A was made before ckptbench 0.2.0 (env.json has no ")
    assert note.endswith("so its stall_s may read short against newer runs.")
    clock = [w for w in mixed.warnings if w.startswith("stall clock differs")]
    assert clock == [
        "stall clock differs: A predates ckptbench 0.2.0 (each engine timed its own stall, which "
        "could read short), B was timed by the harness around save(): a stall ratio between "
        "them mixes the two clocks"
    ]
    assert f"warning: {clock[0]}" in compare.text(mixed)
    # the other way round: the older run second
    flipped = compare.compare([_with_clock(tmp_path, A, "harness"), str(B)])
    assert flipped.notes[0].startswith("Run B was made before ckptbench 0.2.0")
    assert any(w.startswith("stall clock differs: B predates") for w in flipped.warnings)
    newer_a = str(tmp_path / "20261202T161542Z-cmpa-0ead53-harness")
    both_new = compare.compare([newer_a, newer_b])
    assert both_new.notes == [] and not any("clock" in w for w in both_new.warnings)
    assert "0.2.0" not in compare.text(both_new)
    # compare.md says it too
    paths = compare.write(mixed, str(tmp_path / "out"))
    md = Path(next(p for p in paths if p.endswith("compare.md"))).read_text()
    assert f"> **{mixed.notes[0]}**" in md and clock[0] in md


def test_refuses_emulated_against_real(tmp_path: Path) -> None:
    real = edited_copy(
        tmp_path,
        rows={"device": "cuda", "emulated": "False"},
        device={"kind": "cuda", "emulated": False},
    )
    with pytest.raises(UserError) as e:
        compare.compare([str(A), real])
    msg = str(e.value)
    assert msg.startswith("runs not comparable: device kind differs: A host-emulated, B cuda")
    assert "A is emulated, B is real" in msg
    assert msg.endswith("(use --force to compare anyway)")
    forced = compare.compare([str(A), real], force=True)
    assert forced.forced and len(forced.refusals) == 2
    assert (
        "WARNING: NOT COMPARABLE, compared because of --force: A is emulated, B is real"
        in compare.text(forced)
    )


def test_refuses_another_gds_mode(tmp_path: Path) -> None:
    compat = edited_copy(tmp_path, gds_mode="compat")
    with pytest.raises(UserError, match="engine gds ran in another mode: A emulated, B compat"):
        compare.compare([str(A), compat])


def test_no_shared_case_and_bad_args(tmp_path: Path) -> None:
    other = edited_copy(tmp_path, rows={"workload": "other"})
    with pytest.raises(UserError, match="share no case"):
        compare.compare([str(A), other])
    with pytest.raises(UserError, match="at least two"):
        compare.compare([str(A)])
    with pytest.raises(UserError, match="unknown metric"):
        compare.compare([str(A), str(B)], metric="speed")


def test_write_files_and_figure(ab: compare.Comparison, tmp_path: Path) -> None:
    paths = compare.write(ab, str(tmp_path))
    assert sorted(Path(p).name for p in paths) == [
        "compare.csv",
        "compare.md",
        "compare_bandwidth.pdf",
        "compare_bandwidth.png",
    ]
    md = (tmp_path / "compare.md").read_text()
    assert "Host-emulated rows (no GPU)" in md
    assert "| B | gds | synthetic-64MiB-16MiB | 1 | EMULATED | EMULATED | 5 | 5 |" in md
    assert "not significant" in md
    fig = compare_bandwidth(ab.runs, ab.table, ab.metric, "write GB/s: run / A")
    ax, bx = fig.get_axes()
    assert ax.get_ylabel() == "write bandwidth to durability (GB/s)"
    labels = [ln.get_label() for ln in ax.get_lines() if not ln.get_label().startswith("_")]
    assert labels == [
        f"{r}: {e} [emulated]" for r in "AB" for e in ("gds", "cpu-single", "cpu-double")
    ]
    assert bx.get_xlabel() == "write GB/s: run / A"
    assert len(bx.get_yticklabels()) == 6


def test_cli_compare(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", str(A), str(B), "-o", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "B better" in out and "not significant" in out
    assert "differences are outside the noise" in out
    real = edited_copy(
        tmp_path,
        device={"kind": "cuda", "emulated": False},
        rows={"device": "cuda", "emulated": "False"},
    )
    assert main(["compare", str(A), real, "-o", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ckptbench: error: runs not comparable: ") and err.count("\n") == 1
    assert main(["compare", str(A), real, "--force", "-o", str(tmp_path / "y")]) == 0
    captured = capsys.readouterr()
    assert "WARNING: NOT COMPARABLE" in captured.out
    assert "compared because of --force" in captured.err
    assert (
        "NOT COMPARABLE (compared because of --force)"
        in (tmp_path / "y" / "compare.md").read_text()
    )


def test_the_too_few_repetitions_line_names_only_cases_that_cannot_reach_p_005():
    """5 a side (the committed pair) can be significant: no line. 3 a side cannot (the smallest
    two-sided Mann-Whitney p is 2 / C(6, 3) = 0.1), nor 4 against 2 (2 / 15); 4 a side can."""
    import pandas as pd

    from analysis.compare import _too_few

    assert _too_few(pd.DataFrame({"n_a": [5, 5, 4], "n_b": [5, 5, 4]})) == ""
    line = _too_few(pd.DataFrame({"n_a": [5, 3, 4], "n_b": [5, 3, 2]}))
    assert "2 of 3 cases" in line and "as few as 3 and 3" in line
