"""The GPU check rehearsed here (scripts/gpu_rehearsal.sh): its wheels fetched for this python,
a base that holds only what the GPU machine's image is documented to hold, the check run offline
over it end to end on a capped target, sized to it, table included. The GPU machine is lent
rarely and for minutes: a wheel the check needs and does not carry, a base package too old for
a wheel, a kvikio that does not load, a disk too slow for the planned state, must each show
here, not there."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parent.parent


LIMIT = 150  # the rehearsal's GPU_CHECK_LIMIT (scripts/gpu_rehearsal.sh)
CAP = 300_000_000  # and its target's write cap


def run(cmd: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        cmd, cwd=REPO, capture_output=True, text=True, timeout=600, env={**os.environ, **env}
    )


def copy_wheels(src: Path, dst: Path, drop: str = "", plant: tuple[str, str] | None = None):
    """The rehearsal's wheels in `dst`, without those whose name starts with `drop`, and with
    `plant` = (wheel name prefix, first line of its package's __init__.py) put in; the sums
    made again."""
    shutil.copytree(src, dst)
    for w in list(dst.glob("*.whl")):
        if drop and w.name.startswith(drop):
            w.unlink()
        elif plant and w.name.startswith(plant[0]):
            with zipfile.ZipFile(w) as z:
                entries = [(i, z.read(i)) for i in z.infolist()]
            with zipfile.ZipFile(w, "w", zipfile.ZIP_DEFLATED) as z:
                for info, data in entries:
                    if info.filename.endswith("/__init__.py") and info.filename.count("/") == 1:
                        data = plant[1].encode() + b"\n" + data
                    z.writestr(info, data)
    sums = subprocess.run(
        "sha256sum ./*.whl", shell=True, cwd=dst, capture_output=True, text=True, check=True
    )
    (dst / "SHA256SUMS").write_text(sums.stdout)
    return dst


def base_with_old_typing_extensions(tmp: Path, version: str = "4.0.0") -> Path:
    """The rehearsal's base with typing-extensions' metadata saying `version` (its code is the
    current one: what `pip check` and the install plan read is the metadata). Its python."""
    base = tmp / "base"
    p = run([sys.executable, "scripts/gpu_env.py", "base", str(base)])
    assert p.returncode == 0, p.stderr
    site = next((base / "lib").glob("python3*/site-packages"))
    (info,) = site.glob("typing_extensions-*.dist-info")
    real = info.resolve()
    info.unlink()
    old = site / f"typing_extensions-{version}.dist-info"
    shutil.copytree(real, old)
    meta = old / "METADATA"
    meta.write_text(re.sub(r"(?m)^Version: .*$", f"Version: {version}", meta.read_text()))
    return base / "bin" / "python"


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    d = tmp_path_factory.mktemp("rehearsal")
    p = run(
        ["bash", "scripts/gpu_rehearsal.sh", str(d)],
        REHEARSAL_PYTHON=sys.executable,
        REHEARSAL_LIMIT=str(LIMIT),
        REHEARSAL_CAP=f"{CAP // 1_000_000}MB/s",
    )
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


@pytest.mark.slow
def test_the_check_sizes_its_state_to_the_capped_target_and_ends_inside_its_limit(rehearsal):
    d, p = rehearsal
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out = d / "out"
    sizing = json.loads((out / "gpu_sizing.json").read_text())
    # the probe saw the cap the way the run paces it, and the sizing chose a smaller state
    assert sizing["disk"]["cap_Bps"] == CAP
    assert sizing["disk"]["write_Bps"] <= CAP * 1.1, sizing["disk"]
    assert sizing["total_bytes"] < sizing["config_total_bytes"] == 4 << 30
    assert sizing["estimate_s"] <= sizing["budget_s"]
    log = (out / "gpu_check.log").read_text()
    assert f"sizing: total_sizes=[{sizing['total_bytes'] >> 20}MiB] (config 4GiB): " in log
    # gds and cpu-single first, then the other engines, every row at the size chosen
    (first,) = out.glob("*-gpu-check-1-first-*")
    (second,) = out.glob("*-gpu-check-2-engines-*")
    a, b = (pd.read_csv(r / "results.csv") for r in (first, second))
    assert list(dict.fromkeys(a["engine"])) == ["gds", "cpu-single"]
    assert list(dict.fromkeys(b["engine"])) == ["cpu-double", "torch-save", "dcp", "safetensors"]
    assert set(a["total_bytes"]) == set(b["total_bytes"]) == {sizing["total_bytes"]}
    assert a["error"].isna().all() and b["error"].isna().all()
    # inside the limit, and the table says how it was sized
    took = int(re.search(r"gpu_check: exit 0 after (\d+) s", log)[1])
    assert took <= LIMIT, log[-2000:]
    table = (out / "gpu_table.txt").read_text().splitlines()
    assert any(ln.startswith("sizing: ") and "(capped 300 MB/s)" in ln for ln in table), table


@pytest.mark.slow
def test_a_base_too_old_for_a_wheel_gets_the_wheels_version_and_verifies(rehearsal, tmp_path):
    d, p = rehearsal
    assert p.returncode == 0
    py = str(base_with_old_typing_extensions(tmp_path))
    (te,) = (d / "wheels").glob("typing_extensions-*.whl")
    site = tmp_path / "site"
    q = run([py, "scripts/gpu_env.py", "install", str(d / "wheels"), str(site)])
    assert q.returncode == 0, q.stdout + q.stderr
    assert te.name in q.stdout.splitlines()[0]  # == install (offline) into ...: the wheels
    assert (
        "gpu_env: typing-extensions from the wheels too, first on PYTHONPATH: the base's "
        "typing-extensions 4.0.0 does not meet typing-extensions>="
    ) in q.stdout
    env = {"PYTHONPATH": f"{site}:{REPO}"}
    v = run([py, "scripts/gpu_env.py", "verify", "--site", str(site)], **env)
    assert v.returncode == 0, v.stdout + v.stderr
    seen = run([py, "-c", "import importlib.metadata as m; print(m.version('typing-extensions'))"])
    assert seen.stdout.strip() == "4.0.0"  # the base alone
    seen = run(
        [py, "-c", "import importlib.metadata as m; print(m.version('typing-extensions'))"], **env
    )
    assert seen.stdout.strip() == te.name.split("-")[1]  # as the run sees it


@pytest.mark.slow
def test_pip_check_names_the_package_whose_requirement_is_not_met(rehearsal, tmp_path):
    d, p = rehearsal
    assert p.returncode == 0
    py = str(base_with_old_typing_extensions(tmp_path))
    wheels = copy_wheels(d / "wheels", tmp_path / "wheels", drop="typing_extensions-")
    (pyd,) = wheels.glob("pydantic-*.whl")
    with zipfile.ZipFile(pyd) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith("METADATA"))).decode()
    need = re.search(r"(?m)^Requires-Dist: (typing-extensions\S*)$", meta)[1]
    site = tmp_path / "site"
    q = run([py, "scripts/gpu_env.py", "install", str(wheels), str(site)])
    assert q.returncode == 0 and "typing_extensions" not in q.stdout
    env = {"PYTHONPATH": f"{site}:{REPO}"}
    v = run([py, "scripts/gpu_env.py", "verify", "--site", str(site)], **env)
    assert v.returncode == 2, v.stdout + v.stderr
    line = (
        f"gpu_env: pip check: pydantic {pyd.name.split('-')[1]} has requirement {need}, "
        "but you have typing-extensions 4.0.0"
    )
    assert line in v.stderr.splitlines(), v.stderr


@pytest.mark.slow
def test_a_kvikio_that_does_not_load_leaves_the_cpu_rows_and_a_line_saying_why(rehearsal, tmp_path):
    d, p = rehearsal
    assert p.returncode == 0
    why = "planted: libcufile.so.0: cannot open shared object file"
    wheels = copy_wheels(
        d / "wheels", tmp_path / "wheels", plant=("kvikio_cu13-", f"raise ImportError({why!r})")
    )
    out = tmp_path / "out"
    # The state, the saves and the ceilings fixed and small: what this check proves is the rows
    # of the CPU paths and the line saying why gds did not run, not the sizing (the rehearsal
    # proves that). Its limit is room, not a size (the sizing cannot grow a fixed state): on a
    # busy host a tight one skips the second stage, whose rows the test reads.
    q = run(
        ["bash", "scripts/gpu_check.sh"]
        + ["--set", "device=host-emulated", "--set", "engine_options.gds.io=auto"]
        + ["--set", "total_sizes=[32MiB]", "--set", "tensor_sizes=[8MiB]", "--set", "models=[]"]
        + ["--set", "ceilings.enabled=false", "--set", "repetitions=1"],
        OUT=str(out),
        PYTHON=str(d / "base" / "bin" / "python"),
        WHEELS=str(wheels),
        GPU_CHECK_LIMIT="300",
    )
    assert q.returncode == 1, q.stdout[-3000:]
    assert "the CPU paths and the baselines run without gds" in q.stdout
    table = (out / "gpu_table.txt").read_text().splitlines()
    said = (
        f"kvikio failed (gds not run): kvikio and 2 more modules do not import (ImportError: {why})"
    )
    assert said in table, table
    rows = [ln.split() for ln in table if ln.startswith("synthetic-32MiB")]
    assert [r[1] for r in rows] == ["cpu-single", "cpu-double", "torch-save", "dcp", "safetensors"]
    got = pd.concat(pd.read_csv(f) for f in out.glob("*/results.csv"))
    assert "gds" not in set(got["engine"]) and len(got) == 5 * 2  # a warm-up and a save each
    assert got["verified"].all() and got["error"].isna().all()
