"""Storage faults and interruptions during a sweep, injected for real: a full filesystem on a
loop device, SIGINT to a running `ckptbench run`, `--resume`, and two runs sharing targets."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import QUICK_BASELINE_S, QUICK_CEILINGS

from analysis import runs
from analysis.report.caveats import warnings_for
from bench.common import devices
from bench.common.errors import UserError
from bench.config import sweep as config
from bench.engines import create
from bench.measure.efficiency import JUDGED
from bench.run import plan
from bench.run.sweep import Sweep
from bench.storage import generations, manifest
from bench.storage.verify import first_difference
from bench.workloads import synthetic_state

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is")

MiB = 1 << 20


def _write_config(path: Path, **over: object) -> Path:
    raw = {
        "name": "faults",
        "host_baseline_s": QUICK_BASELINE_S,
        "engines": ["cpu-single", "cpu-double", "gds"],
        "total_sizes": ["16MiB"],
        "tensor_sizes": ["1MiB"],
        "ssd_counts": [1],
        "repetitions": 1,
        "warmups": 0,
        "ceilings": dict(QUICK_CEILINGS),
        "scratch": str(path.parent / "tg"),
        "engine_options": {e: {"chunk_bytes": "1MiB"} for e in ("cpu-single", "cpu-double", "gds")},
    }
    raw.update(over)
    path.write_text(yaml.safe_dump(raw))
    return path


# -- a full filesystem ----------------------------------------------------------------------


@pytest.fixture
def small_fs(scratch: Path) -> Iterator[Path]:
    """A 96 MiB ext4 filesystem on a loop device (needs root and mkfs.ext4)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a loop filesystem")
    if not shutil.which("mkfs.ext4"):
        pytest.skip("mkfs.ext4 is not installed")
    img, mnt = scratch / "fs.img", scratch / "mnt"
    mnt.mkdir()
    with open(img, "wb") as f:
        f.truncate(96 * MiB)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(img)], check=True)
    r = subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a loop filesystem here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def _fill(fs: Path, leave: int) -> None:
    """Take all but `leave` bytes of the filesystem with a filler file."""
    free = shutil.disk_usage(fs).free
    with open(fs / "filler", "wb") as f:
        os.posix_fallocate(f.fileno(), 0, max(0, free - leave))


@pytest.mark.root
@pytest.mark.parametrize("fallocate", [False, True], ids=["mid-write", "at-preallocation"])
@pytest.mark.parametrize("engine", ["cpu-single", "cpu-double", "gds"])
def test_enospc_mid_write_removes_partial_files_and_keeps_the_old_checkpoint(
    small_fs, engine, fallocate
):
    """Without preallocation the disk fills while the data is written; with it, when the file
    is reserved. Either way: ENOSPC, no partial files, the old checkpoint intact."""
    t = small_fs / "t0"
    t.mkdir()
    eng = create(engine, [str(t)], chunk_bytes="1MiB", fallocate=fallocate)
    try:
        old = synthetic_state(8 * MiB, MiB, seed=1)
        eng.save(old, "x").wait()
        _fill(small_fs, leave=12 * MiB)
        with pytest.raises(OSError) as err:
            eng.save(synthetic_state(32 * MiB, MiB, seed=2), "x").wait()
        assert err.value.errno == 28  # ENOSPC
        assert first_difference(old, eng.load("x")) is None
        assert generations.leftovers([str(t)], "x") == []
        files = sorted(os.listdir(t / "x"))
        assert [f for f in files if f.startswith("data-")] == [
            manifest.data_file_name(0, manifest.committed([str(t)], "x").save_id)
        ]
    finally:
        eng.close()


@pytest.mark.root
def test_preflight_refuses_a_sweep_that_does_not_fit(small_fs, scratch):
    cfg = config.from_dict(
        {
            "engines": ["cpu-single"],
            "total_sizes": ["256MiB"],
            "tensor_sizes": ["1MiB"],
            "targets": [str(small_fs)],
        }
    )
    with pytest.raises(UserError) as err:
        Sweep(cfg, devices.detect("host-emulated"), str(scratch / "results"), quiet=True).run()
    msg = str(err.value)
    assert str(small_fs) in msg and "free" in msg and "needs" in msg and "256MiB" in msg
    assert not (scratch / "results").exists() or not os.listdir(scratch / "results")


@pytest.mark.root
@pytest.mark.parametrize("on_error", ["continue", "stop"])
def test_full_disk_mid_sweep_is_an_error_row(small_fs, scratch, monkeypatch, on_error):
    """A case that fills the disk becomes an error row with its files removed; earlier rows stay,
    and the sweep goes on or stops as `on_error` says."""
    monkeypatch.setattr(plan, "check_space", lambda *a: None)  # let it run into the full disk
    _fill(small_fs, leave=40 * MiB)
    cfg = config.from_dict(
        {
            "engines": ["cpu-single"],
            "total_sizes": ["8MiB", "64MiB", "16MiB"],
            "tensor_sizes": ["1MiB"],
            "targets": [str(small_fs)],
            "repetitions": 1,
            "warmups": 0,
            "on_error": on_error,
        }
    )
    r = Sweep(cfg, devices.detect("host-emulated"), str(scratch / "results"), quiet=True)
    if on_error == "stop":
        with pytest.raises(UserError, match="stopped after a failed case"):
            r.run()
    else:
        r.run()
    rows = pd.read_csv(Path(r.run_dir) / "results.csv").fillna({"error": ""})
    assert list(rows["workload"]) == (
        ["synthetic-8MiB-1MiB", "synthetic-64MiB-1MiB"]
        + (["synthetic-16MiB-1MiB"] if on_error == "continue" else [])
    )
    assert rows["verified"].tolist() == [True, False] + ([True] if on_error == "continue" else [])
    assert "No space left on device" in rows["error"][1]
    assert [p for p in small_fs.rglob("*") if p.is_file() and p.name != "filler"] == []
    # The ceiling probe (64 MiB into 40 MiB free) hit the full disk first: said, not fatal.
    env = json.loads((Path(r.run_dir) / "env.json").read_text())
    assert "ceilings" not in env
    assert "No space left on device" in env["ceilings_error"]
    assert any(n.startswith("device ceilings not measured") for n in env["notes"])


# -- interruption and resume -----------------------------------------------------------------


RUN_DEADLINE_S = 300  # generous: only a hang runs into it, not a busy machine


def test_sigint_keeps_rows_removes_the_case_and_resume_finishes(scratch):
    """The interrupt comes once 3 rows are on disk; the run cannot have finished by then
    whatever the machine's speed: each save is capped at 64 MB/s (its 32 MiB cannot be durable
    in less than ~0.5 s, a token bucket never goes faster), so the 15 saves left take 7 s at
    the very least."""
    cfg_path = _write_config(
        scratch / "c.yaml",
        total_sizes=["32MiB"],
        tensor_sizes=["1MiB", "4MiB"],
        repetitions=3,
        max_write_bw="64MB/s",
    )
    out = scratch / "results"
    # As a terminal would start it: SIGINT at its default disposition. A test run started in
    # the background of a non-interactive shell (nohup ... &) ignores SIGINT, its children
    # inherit that, and Python then installs no KeyboardInterrupt handler at all.
    p = subprocess.Popen(
        [sys.executable, "-m", "bench", "run", str(cfg_path), "-q", "-o", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    csv = None
    deadline = time.monotonic() + RUN_DEADLINE_S
    while time.monotonic() < deadline:  # interrupt once a few rows are on disk
        found = list(out.glob("*/results.csv"))
        if found and len(found[0].read_text().splitlines()) >= 4:
            csv = found[0]
            break
        time.sleep(0.05)
    assert csv is not None, f"the run recorded no rows in {RUN_DEADLINE_S} s"
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=RUN_DEADLINE_S)
    assert p.returncode == 130, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err
    assert f"--resume {csv.parent}" in lines[0]
    kept = pd.read_csv(csv)
    assert 3 <= len(kept) < 18 and kept["verified"].all()
    # Its report says loudly that it is a part of a run.
    said = warnings_for(runs.load(str(csv.parent)))
    assert f"This run did not finish: {len(kept)} of 18 saves recorded" in said[0]
    # The case in flight left nothing behind on the targets.
    assert [f for f in (scratch / "tg").rglob("*") if f.is_file()] == []

    # A changed config is refused; the same config finishes the run without redoing rows.
    changed = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "run",
            str(cfg_path),
            "-q",
            "--resume",
            str(csv.parent),
            "--set",
            "repetitions=4",
        ],
        capture_output=True,
        text=True,
        timeout=RUN_DEADLINE_S,
    )
    assert changed.returncode == 2
    assert "the config changed since that run (repetitions: 3 then, 4 now)" in changed.stderr
    done = subprocess.run(
        [sys.executable, "-m", "bench", "run", str(cfg_path), "-q", "--resume", str(csv.parent)],
        capture_output=True,
        text=True,
        timeout=RUN_DEADLINE_S,
    )
    assert done.returncode == 0, done.stderr
    rows = pd.read_csv(csv)
    assert len(rows) == 18 and rows["verified"].all()
    assert rows.groupby(["case_id", "warmup", "rep"]).size().max() == 1
    assert runs.load(str(csv.parent)).unfinished is None
    # The rows from before keep what they measured; only their judgement against the run's
    # best ceilings (which the resumed part may have raised) is written again.
    measured = [c for c in kept.columns if c not in JUDGED]
    assert rows.iloc[: len(kept)][measured].equals(kept[measured])


def test_resume_of_something_that_is_not_a_run(scratch):
    cfg = config.from_dict(
        {
            "engines": ["cpu-single"],
            "total_sizes": ["8MiB"],
            "tensor_sizes": ["1MiB"],
            "scratch": str(scratch / "tg"),
        }
    )
    with pytest.raises(UserError, match=r"--resume .*: not a run directory"):
        Sweep(
            cfg, devices.detect("host-emulated"), str(scratch), quiet=True, resume=str(scratch)
        ).run()


def test_two_runs_on_the_same_targets_do_not_clobber_each_other(scratch):
    cfg_path = _write_config(scratch / "c.yaml", total_sizes=["32MiB"], repetitions=4)
    cmd = [sys.executable, "-m", "bench", "run", str(cfg_path), "-q", "-o", str(scratch / "r")]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in "ab"]
    for p in procs:
        p.communicate(timeout=RUN_DEADLINE_S)
        assert p.returncode == 0
    runs = sorted((scratch / "r").iterdir())
    assert len(runs) == 2
    for run in runs:
        rows = pd.read_csv(run / "results.csv")
        assert len(rows) == 12 and rows["verified"].all()
