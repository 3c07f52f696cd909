"""Analysis of a committed fixture run: loading a run, its warm-ups, errors and unverified rows
set aside, and the runs it refuses.

They read the committed default fixture run (a trimmed real default run, DEFAULT_RUN in
tests/conftest.py); its report is built once for the whole test run (`default_report`).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
from conftest import DEFAULT_RUN

from analysis import runs
from analysis.report.caveats import warnings_for
from bench.common.errors import UserError

ENGINES = ["gds", "cpu-single", "cpu-double", "torch-save", "dcp"]  # the fixture run's engines


@pytest.fixture(scope="module")
def run() -> runs.Run:
    return runs.load(str(DEFAULT_RUN))


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
    shutil.copytree(DEFAULT_RUN, out)
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
