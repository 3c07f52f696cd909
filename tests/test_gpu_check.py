"""The GPU check rehearsed here (scripts/gpu_rehearsal.sh): its wheels fetched for this python,
a base that holds only what the GPU machine's image is documented to hold, the check run offline
over it end to end, table included. The GPU machine is lent rarely and for minutes: a wheel the
check needs and does not carry must fail here, not there."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def run(cmd: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        cmd, cwd=REPO, capture_output=True, text=True, timeout=600, env={**os.environ, **env}
    )


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    d = tmp_path_factory.mktemp("rehearsal")
    p = run(["bash", "scripts/gpu_rehearsal.sh", str(d)], REHEARSAL_PYTHON=sys.executable)
    return d, p


@pytest.mark.slow
def test_the_gpu_check_runs_from_its_wheels_and_the_images_base(rehearsal):
    d, p = rehearsal
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out = d / "out"
    table = (out / "gpu_table.txt").read_text()
    for engine in ("gds", "cpu-single", "cpu-double", "torch-save", "dcp", "safetensors"):
        assert f" {engine} " in table, table
    assert "False" not in table.split("verified", 1)[1]  # every row verified
    log = (out / "gpu_check.log").read_text()
    # What the check installed is exactly what the base lacks: kvikio and the project's extras.
    installed = log.split("== install (offline) into", 1)[1].splitlines()[0]
    for wheel in ("kvikio_cu13-", "libkvikio_cu13-", "rapids_logger-0.3", "pydantic-", "bitmath-"):
        assert wheel in installed, installed
    for base in ("torch-", "numpy-", "pandas-", "scipy-"):
        assert base not in installed, installed
    assert "gpu_check: exit 0" in log
    # kvikio's pin comes from libkvikio's own metadata
    reqs = (d / "wheels" / "requirements.txt").read_text().split()
    assert "rapids-logger==0.3.*" in reqs and "bitmath>=1.3" in reqs


@pytest.mark.slow
def test_a_wheel_the_check_needs_and_lacks_fails_it_before_the_run(rehearsal, tmp_path):
    d, p = rehearsal
    assert p.returncode == 0
    wheels = tmp_path / "wheels"
    shutil.copytree(d / "wheels", wheels)
    for w in wheels.glob("bitmath-*.whl"):
        w.unlink()
    sums = (wheels / "SHA256SUMS").read_text().splitlines()
    (wheels / "SHA256SUMS").write_text("\n".join(s for s in sums if "bitmath" not in s) + "\n")
    out = tmp_path / "out"
    q = run(
        ["bash", "scripts/gpu_check.sh"],
        OUT=str(out),
        PYTHON=str(d / "base" / "bin" / "python"),
        WHEELS=str(wheels),
    )
    assert q.returncode == 2, q.stdout[-2000:]
    assert "gpu_env: bitmath is missing (needed: bitmath>=1.3)" in q.stdout
    assert not list(out.glob("*/results.csv"))  # stopped before the run
