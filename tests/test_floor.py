"""The CPU floor (bench.measure.floor) measured for real, fio's job CPU read from its own JSON,
the fallback without fio labelled so, and the report's floor table worked out by hand from a
run's rows (analysis.cost)."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from analysis import cost, runs
from analysis.figures.host import host_cpu
from bench.measure import floor

MiB = 1 << 20
HOST = Path(__file__).parent / "fixtures" / "runs" / "20261205T113902Z-default-3518d9"
needs_fio = pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed")


@needs_fio
def test_fios_job_cpu_is_its_own_accounting_without_its_start_up(scratch: Path) -> None:
    """From fio's JSON: (usr_cpu + sys_cpu) / 100 x job_runtime; never more than the CPU the
    fio process spent in all (its start-up and buffer fill are the rest)."""
    path = scratch / "f"
    with open(path, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, 32 * MiB)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(
        ["fio", "--output-format=json", "--name=t", f"--filename={path}", "--size=32m",
         "--rw=write", "--bs=4m", "--direct=1", "--ioengine=io_uring", "--iodepth=4",
         "--end_fsync=1", "--fallocate=none"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    job = json.loads(out.stdout[out.stdout.index("{") :])["jobs"][0]
    got = floor.job_cpu_s(out.stdout)
    assert got == pytest.approx((job["usr_cpu"] + job["sys_cpu"]) / 100 * job["job_runtime"] / 1e3)
    whole = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    assert 0 < got <= whole + 0.01  # fio's accounting rounds to 0.01 %


@needs_fio
def test_the_floor_measures_every_part_with_fio(scratch: Path) -> None:
    f = floor.measure(str(scratch), 24 * MiB, block=4 * MiB, depth=4)
    assert f.nbytes == 24 * MiB and (f.block_bytes, f.depth) == (4 * MiB, 4)
    assert f.io_tool.startswith("fio") and "io_uring" in f.io_tool and f.why == ""
    for part in ("write", "read", "copy", "hash", "serialize"):
        v = f.per_GB(part)
        assert v is not None and 0 < v < 100, part
    assert f.per_GB("copy") == pytest.approx(f.copy_cpu_s / (24 * MiB / 1e9))
    assert floor.Floor.from_json(json.loads(json.dumps(f.to_json()))) == f
    assert not [p for p in os.listdir(scratch) if p.startswith(".ckptbench-floor")]


def test_without_fio_the_floor_says_so_and_takes_the_builtin_writer(scratch, monkeypatch):
    """No fio on PATH: the I/O part is the built-in O_DIRECT writer's and reader's process CPU,
    labelled so; never a number called fio's."""
    monkeypatch.setenv("PATH", str(scratch / "empty"))
    f = floor.measure(str(scratch), 8 * MiB, block=4 * MiB, depth=2)
    assert f.io_tool == f"built-in O_DIRECT writer and reader, process CPU ({floor.NO_FIO})"
    assert f.write_cpu_s is not None and f.write_cpu_s > 0 and f.read_cpu_s is not None


def test_an_io_part_that_cannot_run_is_none_with_its_reason(scratch, monkeypatch):
    monkeypatch.setenv("PATH", str(scratch / "empty"))
    missing = str(scratch / "no-such-dir")
    f = floor.measure(missing, 8 * MiB, block=4 * MiB, depth=2)
    assert (f.io_tool, f.write_cpu_s, f.read_cpu_s) == (floor.NO_FIO, None, None)
    assert f.why.startswith(("FileNotFoundError", "OSError")) and f.per_GB("write") is None
    assert f.per_GB("copy") is not None  # the memory parts still measured


def _with_floor(f: floor.Floor) -> runs.Run:
    run = runs.load(str(HOST))
    run.env["cpu_floor"] = f.to_json()
    return run


FLOOR = floor.Floor(int(1e9), 16 * MiB, 16, "fio-3.33 io_uring, job CPU", 0.1, 0.2, 0.15, 0.05, 1.0)


def test_each_paths_floor_adds_up_the_parts_its_work_needs() -> None:
    """The fixture run is host-emulated: a snapshot path copies; gds, cpu-single and cpu-double
    checksum; torch-save and dcp serialise; safetensors hashes nothing and writes."""
    run = _with_floor(FLOOR)
    t = cost.floor_table(run).set_index("engine")
    want = {
        "gds": (0.15, "fio + hash"),
        "cpu-single": (0.30, "fio + copy + hash"),
        "cpu-double": (0.30, "fio + copy + hash"),
        "torch-save": (1.10, "fio + serialise"),
        "dcp": (1.25, "fio + copy + serialise"),
        "safetensors": (0.10, "fio"),
    }
    for e, (fl, what) in want.items():
        assert t.loc[e, "floor_cpu_s_per_GB"] == pytest.approx(fl), e
        assert t.loc[e, "floor_is"] == what, e
        assert t.loc[e, "x_floor"] == pytest.approx(t.loc[e, "cpu_s_per_GB"] / fl), e
    host = cost.table(run).set_index("engine")["host_cpu_s_per_GB"]
    assert (t["cpu_s_per_GB"] == host.loc[t.index]).all()
    # the parts the engines timed themselves: the fixture's cpu-single its hash (its io_detail
    # predates copy_s), safetensors none
    rows = run.ok[run.ok["engine"] == "cpu-single"]
    hash_per_gb = (rows["hash_s"].astype(float) / (rows["total_bytes"] / 1e9)).median()
    assert t.loc["cpu-single", "own_parts"] == f"hash {hash_per_gb:.2f}"
    assert t.loc["safetensors", "own_parts"] == "-"
    headers, rows = cost.floor_rows(cost.floor_table(run))
    assert headers == cost.FLOOR_HEADERS and len(rows) == len(want)
    text = cost.floor_sentence(run)
    assert "O_DIRECT write 0.100, read 0.200, copy into warm memory 0.150, xxh3 0.050" in text
    top = t["x_floor"].idxmax()
    assert f"Furthest above its floor: {top}, {t.loc[top, 'x_floor']:.1f}x" in text
    under = t[t["x_floor"] < 1]
    if under.empty:
        assert "Below their floor" not in text
    else:
        assert "Below their floor" in text and "read them as at their floor" in text


def test_a_path_below_its_floor_is_said_not_to_beat_it() -> None:
    """A floor as large as a path's own CPU per GB and more: the ratio under 1 is named as
    a floor that is no floor for it, never as a win."""
    run = _with_floor(FLOOR)
    t = cost.floor_table(run).set_index("engine")
    cpu = t.loc["safetensors", "cpu_s_per_GB"]  # its floor is the write alone
    big = floor.Floor(int(1e9), 16 * MiB, 16, "fio", cpu * 2, 0.2, 0.15, 0.05, 1.0)
    run = _with_floor(big)
    t = cost.floor_table(run).set_index("engine")
    assert t.loc["safetensors", "x_floor"] == pytest.approx(0.5)
    text = cost.floor_sentence(run)
    assert "Below their floor: " in text and "safetensors (0.50x)" in text
    assert "not as beating it" in text


def test_without_a_measured_write_there_is_no_ratio_and_the_report_says_why() -> None:
    f = floor.Floor(int(1e9), 16 * MiB, 16, floor.NO_FIO, None, None, 0.15, 0.05, 1.0, "x")
    run = _with_floor(f)
    t = cost.floor_table(run)
    assert t["floor_cpu_s_per_GB"].isna().all() and t["x_floor"].isna().all()
    assert "fio not installed: no I/O floor, so no ratio" in cost.floor_sentence(run)
    assert cost.floor_sentence(runs.load(str(HOST))).startswith("This run measured no CPU floor")


def test_figure_9_marks_each_bar_with_its_floor() -> None:
    run = _with_floor(FLOOR)
    fig = host_cpu(run)
    bars = fig.get_axes()[2]
    marks = [ln for ln in bars.get_lines() if ln.get_color() == "black"]
    t = cost.floor_table(run).set_index("engine")
    assert len(bars.patches) == len(t) == len(marks)
    assert sorted(float(m.get_ydata()[0]) for m in marks) == pytest.approx(
        sorted(t["floor_cpu_s_per_GB"].to_numpy(dtype=float))
    )
    assert "floor" in bars.get_title()
    assert np.isfinite([p.get_height() for p in bars.patches]).all()


def test_the_parts_an_engine_times_itself_are_read_from_its_rows() -> None:
    """nixl's io_detail (copy, submission, completion, fsync) and hash_s, per GB, medians."""
    import pandas as pd

    from bench.measure import detail

    rows = pd.DataFrame(
        {
            "total_bytes": [2e9, 2e9, 2e9],
            "hash_s": [None, None, None],
            "io_detail": [
                detail.dumps(detail.NixlDetail(copy_s=c, post_s=0.02, poll_s=p, fsync_s=0.4))
                for c, p in ((0.2, 0.6), (0.4, 0.8), (0.3, 1.0))
            ],
        }
    )
    assert cost._own_parts(rows) == "copy 0.15, submit 0.01, complete 0.40, fsync 0.20"


@needs_fio
def test_a_fio_run_that_fails_leaves_no_file_and_no_number(scratch) -> None:
    """fio failing for real (O_DIRECT writes of 1000-byte blocks: EINVAL) is said in `why`, with
    no I/O number, and its file is gone: a full disk must not stay full for the run's saves."""
    f = floor.measure(str(scratch), 4 * MiB, block=1000, depth=2)
    assert (f.io_tool, f.write_cpu_s, f.read_cpu_s) == ("fio failed", None, None)
    assert f.why.startswith("CalledProcessError")
    assert not [p for p in os.listdir(scratch) if p.startswith(".ckptbench-floor")]
