"""The GPU check's sizing (scripts/gpu_sizing.py), its environment's verdicts (scripts/gpu_env.py)
and its table (scripts/gpu_table.py), held here without a GPU and without running the check:
the plan for a disk of a given speed, the probe that measures it, the sorting of `pip check`'s
lines, the modules the check imports, and the table's notes and environment lines."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from bench.config import sweep as config_mod

REPO = Path(__file__).resolve().parent.parent


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


sizing = _script("gpu_sizing")
gpu_env = _script("gpu_env")
gpu_table = _script("gpu_table")

CHECK = ["device=host-emulated", "engine_options.gds.io=auto"]


def cfg(*sets: str) -> config_mod.Config:
    return config_mod.load(str(REPO / sizing.CONFIG), [*CHECK, *sets])


def disk(write_Bps: float, memory_Bps: float = 10e9, cap: int | None = None):
    """A target writing at `write_Bps` (through the page cache too), a host copying at
    `memory_Bps`, and the per-byte costs of a 16-core host."""
    return sizing.Disk(
        "/t", write_Bps, "O_DIRECT", None, cap, 3.0, write_Bps, memory_Bps, 1e9, 4e9, 2e9
    )


def test_a_fast_disk_with_time_gets_the_whole_config_in_three_stages_most_valuable_first():
    # 370 s: the whole config, nixl's GDS_MT rows in the first stage included (at 350 s the
    # ceilings drop to one configuration each)
    sz = sizing.size(cfg(), disk(3e9), 370)
    assert sz.total_bytes == 4 << 30 and sz.repetitions == 2 and sz.model
    assert sz.ceilings == "the config's search"
    assert [s.name for s in sz.stages] == ["first", "engines", "model"]
    first, engines, model = sz.stages
    assert first.engines == ["gds", "nixl", "cpu-single"]
    assert "ceilings.enabled=false" in first.sets and "total_sizes=[4GiB]" in first.sets
    assert engines.engines == ["cpu-double", "torch-save", "dcp", "safetensors"]
    assert "ceilings.enabled=true" in engines.sets
    assert "ceilings.direct_search=[[1,32],[4,32]]" in engines.sets
    assert model.engines == first.engines + engines.engines
    assert "total_sizes=[]" in model.sets and model.workload == "gpt2-small"
    assert all("ceilings.probes=false" in s.sets for s in sz.stages)
    assert sz.estimate_s <= sz.budget_s == pytest.approx(370 * (1 - sizing.MARGIN), abs=0.1)


def test_a_capped_target_gets_a_smaller_state_that_fits_and_says_why():
    fast = sizing.size(cfg(), disk(3e9), 300)
    capped = sizing.size(cfg(), disk(300e6, cap=300_000_000), 150)
    assert capped.total_bytes < fast.total_bytes
    assert capped.estimate_s <= capped.budget_s
    assert not capped.model and any(
        w.startswith("model stage dropped: gpt2-small") for w in capped.why
    )
    assert any(w.startswith("total_sizes=[") and "(config 4GiB)" in w for w in capped.why)
    # the next size up would not have fitted
    bigger = sizing.size(cfg(f"total_sizes=[{capped.total_bytes * 2}]"), disk(300e6), 150)
    assert bigger.total_bytes == capped.total_bytes


def test_with_too_little_time_the_first_stage_still_runs_at_the_smallest_size():
    sz = sizing.size(cfg(), disk(50e6, memory_Bps=1e9), 20)
    assert sz.total_bytes == sizing.MIN_TOTAL and sz.repetitions == 1
    assert sz.ceilings == "none" and not sz.model
    assert [s.name for s in sz.stages] == ["first", "engines"]
    assert any(w.startswith("even 64MiB at one repetition") for w in sz.why)
    assert any(w.startswith("ceilings dropped") for w in sz.why)


def test_without_gds_no_stage_runs_it():
    sz = sizing.size(cfg(), disk(3e9), 350, without=("gds",))
    assert sz.stages[0].engines == ["nixl", "cpu-single"]
    assert not any("gds" in s.engines for s in sz.stages)
    assert not any("gds" in a for s in sz.stages for a in s.sets if a.startswith("engines="))


def test_ceilings_off_in_the_config_stay_off():
    sz = sizing.size(cfg("ceilings.enabled=false"), disk(3e9), 350)
    assert sz.ceilings == "off in the config"
    assert all("ceilings.enabled=false" in s.sets for s in sz.stages)


def test_the_probe_sees_the_targets_cap_as_the_run_paces_it(tmp_path):
    c = cfg(f"scratch={tmp_path}", "max_write_bw=50MB/s")
    d = sizing.measure(c, seconds=1.0)
    assert d.cap_Bps == 50_000_000
    assert d.target == str(tmp_path / "target-0")
    assert d.write_Bps <= 50e6 * 1.15, d
    assert d.write_mode in ("O_DIRECT", "buffered+fsync")
    assert not list((tmp_path / "target-0").iterdir())  # the probe's file is gone


def test_the_stages_file_is_what_the_check_reads(tmp_path):
    c = tmp_path / "c.yaml"
    c.write_text((REPO / sizing.CONFIG).read_text().replace("scratch/gpu-check", str(tmp_path)))
    out = tmp_path / "out"
    argv = ["gpu_sizing", "--seconds", "60", "--out", str(out), "--config", str(c)]
    argv += [a for s in CHECK + ["max_write_bw=100MB/s"] for a in ("--set", s)]
    old = sys.argv
    sys.argv = argv
    try:
        assert sizing.main() == 0
    finally:
        sys.argv = old
    lines = (out / "gpu_stages.tsv").read_text().splitlines()
    name, est, sets = lines[0].split("\t")
    assert name == "first" and int(est) > 0
    doc = json.loads((out / "gpu_sizing.json").read_text())
    assert doc["disk"]["cap_Bps"] == 100_000_000 and doc["total_bytes"] < doc["config_total_bytes"]
    notes = (out / "gpu_notes.txt").read_text()
    assert notes.startswith("sizing: ")
    # an engine that cannot run here is planned no time, and the notes say why (nixl's GDS_MT
    # without CUDA or without its wheel; on a GPU with NIXL it is in the first stage)
    from bench.engines import unavailable

    why = unavailable("nixl", {"backend": "gds-mt", "threads": 8})
    if why:
        assert f"nixl not run: {why}\n" in notes and "nixl" not in sets
    else:
        assert "engines=[gds,nixl,cpu-single]" in sets.split()


# -- gpu_env ----------------------------------------------------------------------------------

CORE = {"pydantic", "typing-extensions", "numpy", "pandas", "torch"}
KV = {"kvikio-cu13", "libkvikio-cu13", "rapids-logger"}
OWN = {"torch", "cupy-cuda13x", "cuda-toolkit"}


def test_pip_check_lines_are_sorted_by_whom_they_concern():
    lines = [
        "pydantic 2.14.4 has requirement typing-extensions>=4.16.0, but you have "
        "typing-extensions 4.15.0.",
        "kvikio-cu13 26.10.0 requires cupy-cuda13x, which is not installed.",
        "libkvikio-cu13 26.10.0 has requirement rapids-logger==0.3.*, but you have "
        "rapids-logger 0.2.0.",
        "torch 2.9.0 has requirement nvidia-nccl-cu13==2.27.3, but you have nvidia-nccl-cu13 2.28.",
        "torch 2.9.0 has requirement typing-extensions<4.16, but you have typing-extensions 4.16.0.",
        "jupyterlab 4.0 requires notebook-shim, which is not installed.",
    ]
    f = gpu_env.classify_pip_check(lines, CORE, KV, {"pydantic", "typing-extensions"}, OWN)
    assert f.fatal == [
        "pip check: pydantic 2.14.4 has requirement typing-extensions>=4.16.0, but you have "
        "typing-extensions 4.15.0",
        # the check's own typing-extensions upset the machine's torch
        "pip check: torch 2.9.0 has requirement typing-extensions<4.16, but you have "
        "typing-extensions 4.16.0",
    ]
    assert f.kvikio == [
        "pip check: libkvikio-cu13 26.10.0 has requirement rapids-logger==0.3.*, but you have "
        "rapids-logger 0.2.0"
    ]
    assert [n.split(" (")[-1] for n in f.noted] == [
        "the machine's own torch/CUDA: the imports decide)",
        "the machine's own torch/CUDA: the imports decide)",
        "not loaded by the check)",
    ]


def test_the_modules_verify_imports_are_found_in_the_projects_source():
    run, kv = gpu_env.modules()
    # imported inside functions, not at module level
    assert {"safetensors.torch", "torch.distributed.checkpoint", "matplotlib.pyplot"} <= set(run)
    assert {"bitmath", "pydantic", "xxhash", "yaml", "psutil", "tqdm", "scipy", "pandas"} <= set(
        run
    )
    assert {"bench.engines.gds", "bench.run.sweep", "analysis.report.build"} <= set(run)
    assert "bench.__main__" not in run  # it would run the CLI
    assert not {"os", "json", "__future__", "importlib"} & set(run)
    # kvikio's side, after torch, with the submodules the gds engine imports
    assert kv[0] == "torch" and {"kvikio", "kvikio.cufile_driver", "kvikio.defaults"} <= set(kv)
    assert not any(m.startswith("kvikio") for m in run)


def test_a_module_that_does_not_import_is_one_line_per_cause():
    problems, absent = gpu_env.try_imports(["json", "no_such_module_x", "bench.no_such_module"])
    assert absent == ["no_such_module_x"]
    assert problems == [
        "bench.no_such_module does not import (ModuleNotFoundError: No module named "
        "'bench.no_such_module')"
    ]


# -- gpu_table --------------------------------------------------------------------------------


def test_the_table_prints_cuda_sync_where_env_json_has_it():
    env = {"cuda_sync": {"asked": "auto", "in_force": "blocking-sync", "why": "x"}}
    assert "cuda_sync in force: blocking-sync" in gpu_table.env_lines(env)
    assert not any("cuda_sync" in ln for ln in gpu_table.env_lines({}))


def test_the_table_takes_the_ceilings_from_the_stage_that_measured_them(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    for d, env in ((a, {"device": {"kind": "cuda"}}), (b, {"ceilings_error": "no fio"})):
        d.mkdir()
        (d / "env.json").write_text(json.dumps(env))
    notes = tmp_path / "notes.txt"
    notes.write_text("kvikio failed (gds not run): kvikio does not import (ImportError: x)\n")
    assert gpu_table.main([str(a), str(b), "--notes", str(notes)]) == 1  # no rows
    out = capsys.readouterr().out.splitlines()
    assert "ceilings not measured: no fio" in out
    assert "kvikio failed (gds not run): kvikio does not import (ImportError: x)" in out
    assert out[-1] == "no rows"
