"""The engine registry and contract: every registered engine declares what it is and keeps the
contract; a new engine is one module and one registration line; the config layer loads neither
torch nor any engine."""

from __future__ import annotations

import dataclasses
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ENGINES, QUICK_BASELINE_S, REPO

from bench import cli, engines
from bench.common import schema
from bench.common.traits import BUILTIN, Traits
from bench.engines import options as engine_options
from bench.engines.base import ENGINE_MEMBERS, Engine
from bench.measure import results
from bench.storage.verify import first_difference, first_tensor_difference

METHODS = ENGINE_MEMBERS


@pytest.mark.parametrize("name", ENGINES)
def test_every_registered_engine_keeps_the_contract(name, make_engine, targets):
    cls = engines.REGISTRY[name]
    assert cls.name == name
    assert isinstance(cls.traits, Traits) and cls.traits.summary
    if name in BUILTIN:
        assert cls.traits == BUILTIN[name]  # runs made before env.json recorded traits
    for m in METHODS:
        assert callable(getattr(cls, m, None)), f"{name} lacks {m}()"
    # the Protocol names every method the tuple lists, and the tuple every method it names
    declared = {n for n, v in vars(Engine).items() if callable(v) or isinstance(v, classmethod)}
    assert declared - {"__init__", "__subclasshook__"} >= set(METHODS)
    assert {n for n in declared if not n.startswith("_")} == set(METHODS)
    assert list(inspect.signature(cls.unavailable).parameters) == ["options"]
    model = engines.options_model(name)
    assert issubclass(model, schema.Strict)
    model()  # every option has a default
    if cls.unavailable({}) is not None:
        pytest.skip(f"{name}: {cls.unavailable({})}")
    eng = make_engine(name, targets(2 if cls.traits.stripes else 1))
    g = torch.Generator().manual_seed(3)
    state = {"a": torch.randn(1000, generator=g), "b": {"c": torch.arange(77), "n": [1.5, None]}}
    eng.warm(state)
    pending = eng.save(state, "x")
    # An engine whose stall lasts until durable has nothing left in flight when save() returns.
    if cls.traits.stall == "durable":
        assert pending.done()
    res = pending.wait()
    assert res.bytes == 4000 + 77 * 8
    if cls.traits.stall == "durable":
        assert res.persist_s == 0.0 and res.total_s == res.stall_s > 0
    if not torch.cuda.is_available():
        assert eng.pinned_bytes == _pinned_here(name, eng)
    loaded = eng.load("x")
    assert eng.restore_mode == "host"
    # The whole state, nested values included (a baseline whose library changes key types
    # is held to its tensors under their key paths).
    loose = cls.traits.loose_keys
    assert (first_tensor_difference if loose else first_difference)(state, loaded) is None
    assert eng.cached_files("x") and all(Path(p).is_file() for p in eng.cached_files("x"))
    eng.delete("x")
    assert not any(Path(p).exists() for p in eng.cached_files("x"))


def test_mypy_holds_every_registered_engine_to_the_contract():
    """bench/engines/contract.py lists each registered class, so that mypy checks its types
    against the Engine protocol (REGISTRY's own lookups are by name, which mypy cannot follow)."""
    from bench.engines import contract

    assert contract.CONTRACT == dict(engines.REGISTRY)


def _pinned_here(name: str, eng: object) -> int:
    """The host memory each engine holds after that save without a GPU, worked out by hand:
    the snapshot engines one staging buffer of the packed state ('a' at 0, 4000 bytes; 'c' at
    the next 64-byte boundary, 4032, 616 bytes: 4648 bytes, in 4 KiB pages), dcp's cached
    staging one copy of the tensors' 4616 bytes, FastPersist its own buffer; the rest none."""
    return {"cpu-single": 8192, "cpu-double": 8192, "dcp": 4616}.get(name) or (
        eng.options.buffer_bytes if name == "fastpersist" else 0  # type: ignore[attr-defined]
    )


def test_dtype_table_matches_torch():
    for name, size in schema.DTYPES.items():
        assert getattr(torch, name).itemsize == size, name


def test_the_config_layer_loads_neither_torch_nor_an_engine():
    code = (
        "import sys, bench.config.sweep, bench.common.schema, bench.engines\n"
        "bench.config.sweep.from_dict({'engines': ['gds', 'cpu-single'], 'total_sizes': ['1MiB'],"
        " 'tensor_sizes': ['1MiB'], 'engine_options': {'gds': {'io': 'emulated'}}})\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy', 'xxhash')"
        " or (m.startswith('bench.engines.') and m not in ('bench.engines.options',"
        " 'bench.engines.registry', 'bench.common.traits')))\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_an_engine_adds_to_the_environment_through_its_registry_line(
    copied_engine, monkeypatch, tmp_path
):
    """env.json's engine blocks come from hooks named in the registry, which the run calls
    (bench.measure.env imports no engine): gds's kvikio block, and one a new engine adds."""
    from bench.engines import gds, nixl_peer
    from bench.measure import env

    entry = engines.ENGINES[copied_engine]
    hooked = dataclasses.replace(entry, env_block=("copy_probe", "ckptbench_copy_engine:probe"))
    monkeypatch.setitem(engines.ENGINES, copied_engine, hooked)
    blocks = engines.environment_blocks()
    assert blocks == {
        "kvikio": gds.kvikio_info(),
        "nixl": nixl_peer.nixl_info(),
        "copy_probe": {"hooked": True},
    }
    envb = env.collect([str(tmp_path)], blocks)
    keys = list(envb)
    assert keys[keys.index("gpu") + 1 : keys.index("gpu") + 4] == ["kvikio", "nixl", "copy_probe"]
    assert envb["copy_probe"] == {"hooked": True}
    assert "kvikio" not in env.collect([str(tmp_path)])


@pytest.fixture
def copied_engine(tmp_path, monkeypatch) -> str:
    """A copy of cpu-single's module under a new name, registered with one line."""
    src = (REPO / "bench" / "engines" / "cpu_single.py").read_text()
    src = src.replace('name = "cpu-single"', 'name = "cpu-single-copy"')
    src = src.replace("class CpuSingle(", "class CpuSingleCopy(")
    src += '\n\ndef probe():\n    return {"hooked": True}\n'  # an environment hook
    (tmp_path / "ckptbench_copy_engine.py").write_text(src)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(
        engines.ENGINES,
        "cpu-single-copy",
        engines.Entry("ckptbench_copy_engine:CpuSingleCopy", engine_options.SnapshotOptions),
    )
    return "cpu-single-copy"


def test_a_copied_engine_runs_reports_and_is_modelled(copied_engine, scratch, capsys, monkeypatch):
    """One module and one registration line: it runs in a sweep, gets its efficiency, appears
    in the report and the model (which read its traits from env.json, not the registry)."""
    cfg = scratch / "c.yaml"
    cfg.write_text(
        "name: copy\nengines: [cpu-single, cpu-single-copy]\ntotal_sizes: [8MiB]\n"
        f"tensor_sizes: [1MiB]\nscratch: {scratch}/t\nrepetitions: 2\nwarmups: 0\n"
        f"host_baseline_s: {QUICK_BASELINE_S}\n"
        "ceilings: {tool: builtin, repetitions: 1, min_bytes: 8MiB, direct_search: [[2, 8]],"
        " buffered_jobs: [1]}\n"
        "engine_options: {cpu-single-copy: {chunk_bytes: 1MiB}, cpu-single: {chunk_bytes: 1MiB}}\n"
    )
    out = scratch / "out"
    assert cli.main(["run", str(cfg), "-q", "-o", str(out)]) == 0
    (run_dir,) = out.iterdir()
    rows = results.read_rows(str(run_dir))
    mine = rows[rows["engine"] == copied_engine]
    assert len(mine) == 2 and mine["verified"].all()
    assert mine["write_efficiency"].notna().all() and mine["snapshot_efficiency"].notna().all()
    env = json.loads((run_dir / "env.json").read_text())
    # judged again at the end against the run's best ceilings: the summary's own numbers
    from analysis import runs

    best = runs.add_efficiencies(mine, env)
    assert list(mine["write_efficiency"]) == pytest.approx(list(best["write_eff"]))
    assert list(mine["snapshot_efficiency"]) == pytest.approx(list(best["snapshot_eff"]))
    assert env["engines"][copied_engine]["traits"] == BUILTIN["cpu-single"].to_json()
    # Analysis knows the engine from env.json alone.
    monkeypatch.delitem(engines.ENGINES, copied_engine)
    capsys.readouterr()
    assert cli.main(["report", str(run_dir)]) == 0
    report = (run_dir / "report" / "report.md").read_text()
    model_part = report[report.index("model") :]
    assert copied_engine in model_part
    summary = (run_dir / "report" / "summary.csv").read_text()
    assert copied_engine in summary
    from analysis import runs
    from analysis.model.calibrate import from_run
    from analysis.model.predict import predict

    run = runs.load(str(run_dir))
    assert run.traits(copied_engine) == BUILTIN["cpu-single"]
    prof = from_run(run)
    pr = predict(prof, copied_engine, 1, 8 << 20, run.traits(copied_engine))
    assert pr.stall_s < pr.durable_s and pr.host_bytes == 8 << 20
