"""The `ckptbench` command, run as a real subprocess: what it prints, exit codes, what it creates."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import QUICK_BASELINE_S, QUICK_CEILINGS

from bench.storage import odirect

REPO = Path(__file__).resolve().parent.parent
ENGINES = ["gds", "cpu-double", "cpu-single", "torch-save", "dcp"]


def ckptbench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def write_config(scratch: Path, **changes: object) -> Path:
    """The tiny sweep: all five engines, 8 MiB of 1 MiB or 8 MiB tensors (16 MiB is skipped)."""
    targets = []
    for i in range(2):
        d = scratch / f"target-{i}"
        d.mkdir(exist_ok=True)
        targets.append(str(d))
    raw = {
        "name": "tiny",
        "host_baseline_s": QUICK_BASELINE_S,
        "engines": ENGINES,
        "total_sizes": ["8MiB"],
        "tensor_sizes": ["1MiB", "8MiB", "16MiB"],
        "ssd_counts": [1, 2],
        "targets": targets,
        "repetitions": 1,
        "warmups": 1,
        "ceilings": dict(QUICK_CEILINGS),
        **changes,
    }
    path = scratch / "tiny.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def assert_one_line_error(p: subprocess.CompletedProcess[str], *says: str) -> str:
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr + p.stdout
    lines = p.stderr.splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("ckptbench: error: "), lines[0]
    for s in says:
        assert s in lines[0], lines[0]
    return lines[0]


def test_engines_lists_every_registered_engine() -> None:
    from bench import engines

    p = ckptbench("engines")
    assert p.returncode == 0, p.stderr
    out = p.stdout.splitlines()
    assert out[0] == f"device: {'cuda' if torch.cuda.is_available() else 'host-emulated'}"
    # an engine with several backends (nixl) lists each, indented under its own line
    lines = [line for line in out if not line.startswith("  ")]
    variants = [line.split(maxsplit=1) for line in out if line.startswith("  ")]
    nixl = engines.REGISTRY["nixl"]
    assert variants == [
        [v, "available" if why is None else f"unavailable: {why}"]
        for v, why in nixl.variants().items()  # type: ignore[attr-defined]
    ]
    assert out[out.index(next(x for x in out if x.startswith("nixl "))) + 1].startswith("  posix")
    assert [line.split()[0] for line in lines[1:]] == engines.names()
    for line in lines[1:]:
        why = engines.unavailable(line.split()[0])
        if why is None:
            assert line.split()[1] == "available", line
        else:  # says exactly why, and how to get it
            assert line.split(maxsplit=1)[1] == f"unavailable: {why}", line
    assert all(line.split()[1] == "available" for line in lines[1:] if line.split()[0] in ENGINES)
    if not torch.cuda.is_available():
        (gds,) = [line for line in lines if line.startswith("gds ")]
        assert "host emulation, gds_mode=emulated" in gds
        assert "no CUDA device" in gds


def test_run_bad_config_one_line_exit_2(scratch: Path) -> None:
    path = write_config(scratch, repetitons=3)
    out = scratch / "results"
    line = assert_one_line_error(ckptbench("run", str(path), "-o", str(out)))
    assert line.startswith(
        f"ckptbench: error: config {path}: repetitons: unknown key (known: name, engines, "
    )
    assert not out.exists()


def test_run_bad_set_one_line_exit_2(scratch: Path) -> None:
    path = write_config(scratch)
    out = scratch / "results"
    p = ckptbench("run", str(path), "-o", str(out), "--set", "engine_options.gds.chunk_bytes=1000")
    assert_one_line_error(p, "engine_options.gds.chunk_bytes: must be a multiple of 4096")
    p = ckptbench("run", str(path), "-o", str(out), "--set", "nokey")
    assert_one_line_error(p, "--set 'nokey': expected key=value")
    assert not out.exists()


def test_run_missing_target_one_line_exit_2(scratch: Path) -> None:
    missing = scratch / "no-such-disk"
    path = write_config(scratch, targets=[str(scratch / "target-0"), str(missing)])
    out = scratch / "results"
    line = assert_one_line_error(ckptbench("run", str(path), "-o", str(out)))
    assert line == (
        f"ckptbench: error: target {missing}: does not exist or is not a directory "
        "(create it or fix targets)"
    )
    assert not out.exists()


def test_run_missing_config_one_line_exit_2(scratch: Path) -> None:
    missing = scratch / "nope.yaml"
    line = assert_one_line_error(ckptbench("run", str(missing), "-o", str(scratch / "r")))
    assert line == f"ckptbench: error: config {missing}: no such file"


def test_run_tiny_sweep(scratch: Path) -> None:
    path = write_config(scratch)
    for t in ("target-0", "target-1"):
        reason = odirect.probe(str(scratch / t))
        if reason:
            pytest.skip(f"scratch refuses O_DIRECT, needed by cpu-single and gds: {reason}")
    out = scratch / "results"
    p = ckptbench("run", str(path), "-o", str(out))  # with the progress bar
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr + p.stdout
    (run_id,) = os.listdir(out)
    run_dir = out / run_id
    assert sorted(os.listdir(run_dir)) == ["env.json", "results.csv"]
    lines = p.stdout.splitlines()
    kind = "cuda" if torch.cuda.is_available() else "host-emulated, emulated"
    assert f"run {run_id} ({kind})" in lines
    assert "skipped (tensor larger than total): 8388608B/16777216B" in lines
    assert f"results: {run_dir}/results.csv, environment: {run_dir}/env.json" in lines
    assert (
        "note: all targets share one device: SSD-count scaling on this run is not real scaling"
        in lines
    )
    table = p.stdout[p.stdout.index("write_GBps") :]
    for e in ENGINES:
        assert e in table
    assert "synthetic-8MiB-1MiB" in table and "synthetic-8MiB-8MiB" in table
    assert "synthetic-8MiB-16MiB" not in p.stdout  # the skipped case has no row
    # the device ceilings measured in the same run, and what the efficiency columns mean
    assert any(line.startswith("ceilings (") for line in lines)
    assert "write_eff" in table and "snapshot_eff" in table
    with open(run_dir / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 32
    assert {r["verified"] for r in rows} == {"True"}
    assert {r["error"] for r in rows} == {""}
    # every save and restore as the block device saw it (bench.measure.witness)
    if os.major(os.stat(scratch).st_dev) != 0:
        assert {r["durable_witness"] for r in rows} == {"yes"}
        assert {r["restore_witness"] for r in rows} == {"yes"}
        assert all(int(r["device_written_bytes"]) >= int(r["total_bytes"]) for r in rows)
    # Whether torch's CPU allocations were on huge pages (bench/PERF.md) is part of the record.
    env = json.loads((run_dir / "env.json").read_text())
    # the CPU floor measured in the same run, of the largest checkpoint (bench.measure.floor)
    fl = env["cpu_floor"]
    assert fl["nbytes"] == 8 << 20 and fl["block_bytes"] == 8 << 20
    assert fl["copy_cpu_s"] > 0 and fl["hash_cpu_s"] > 0 and fl["serialize_cpu_s"] > 0
    assert fl["write_cpu_s"] is not None or fl["io_tool"] == "fio not installed"
    assert env["vm"]["torch_thp_alloc"] == os.environ.get("THP_MEM_ALLOC_ENABLE")
    # the bracketed word of the kernel's THP setting, read here on its own
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    want = re.search(r"\[(\w+)\]", thp.read_text()).group(1) if thp.exists() else None  # type: ignore[union-attr]
    assert env["vm"]["thp"] == want


def test_run_report_builds_the_report_of_the_run_it_made(scratch: Path) -> None:
    """`run --report` reports the run it made, wherever -o put it: never a run found by a glob
    (make scaling, make many-tensors and make mlperf rely on it)."""
    path = write_config(
        scratch,
        engines=["torch-save"],
        tensor_sizes=["8MiB"],
        ssd_counts=[1],
        warmups=0,
        ceilings={"enabled": False},
    )
    out = scratch / "elsewhere"
    p = ckptbench("run", str(path), "-o", str(out), "-q", "--report")
    assert p.returncode == 0, p.stderr
    (run_id,) = os.listdir(out)
    assert (out / run_id / "report" / "report.md").is_file()
    assert "wrote " in p.stdout and str(out / run_id / "report") in p.stdout


@pytest.mark.parametrize("target", ["scaling", "many-tensors", "mlperf"])
def test_the_make_targets_report_the_run_they_made(target: str) -> None:
    got = subprocess.run(
        ["make", "-n", target, "ARGS=-o /some/where"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert got.returncode == 0, got.stderr
    line = next(x for x in got.stdout.splitlines() if "ckptbench run" in x)
    assert line.endswith(f"run configs/{target}.yaml --report -o /some/where")
    assert "results/" not in got.stdout  # no glob for "its" run
