"""Runs whose stalls the engines timed themselves (before ckptbench 0.2.0): the caveat that says
so, in the warnings, report.md and the notes, and none for a run the harness timed.

They read the committed default fixture run (a trimmed real default run, DEFAULT_RUN in
tests/conftest.py); its report is built once for the whole test run (`default_report`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import DEFAULT_RUN

from analysis import runs
from analysis.report.build import Report, build
from analysis.report.caveats import warnings_for


@pytest.fixture(scope="module")
def run() -> runs.Run:
    return runs.load(str(DEFAULT_RUN))


OLD_CLOCK = (
    "This run was made before ckptbench 0.2.0 (env.json has no `stall_clock: harness`): each "
    "engine stopped its own stall clock, which could miss work save() still did after it (up to "
    "38-89 % of the stall on states of 20,000 x 4 KiB tensors), so its stall_s may read short "
    "against newer runs."
)


def clock_copy(tmp_path: Path, stall_clock: str | None, src: Path = DEFAULT_RUN) -> str:
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
    run: runs.Run, default_report: Report, tmp_path: Path
) -> None:
    """The committed fixtures predate `stall_clock`: one loud line, in the caveats, report.md and
    the notes `report` prints; a run timed by the harness has none; another value is named."""
    assert "stall_clock" not in run.env and not run.harness_clock
    assert [w for w in warnings_for(run) if "0.2.0" in w] == [OLD_CLOCK]
    md = (Path(default_report.outdir) / "report.md").read_text()
    assert md.count("made before ckptbench 0.2.0") == 1
    assert f"> **{OLD_CLOCK}**" in md
    assert OLD_CLOCK in default_report.notes
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
