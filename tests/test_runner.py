"""bench.runner: a sweep's rows (columns, counts, values), its env.json, and failed cases.

The tiny sweep (all five engines, 8 MiB states, 1 and 2 targets) runs once for the module; the
failure tests run smaller sweeps with a fault injected through monkeypatch.
"""

from __future__ import annotations

import csv
import dataclasses
import errno
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import QUICK_BASELINE_S, QUICK_CEILINGS, scratch_base

from analysis import runs
from analysis.model.calibrate import _point, from_run, near
from bench import cli
from bench.common import devices
from bench.common.errors import UserError
from bench.config import sweep as config
from bench.engines import REGISTRY
from bench.measure import detail, hostcost, results
from bench.measure import timers as measure
from bench.measure.ceilings import DIRECT_WRITE, RunCeilings
from bench.run import plan
from bench.run.sweep import Sweep
from bench.storage import generations, odirect

MiB = 2**20
ENGINES = ["gds", "cpu-double", "cpu-single", "torch-save", "dcp"]
STRIPED = ("gds", "cpu-double", "cpu-single")
BASELINES = ("torch-save", "dcp")
CHUNK = {"gds": MiB, "cpu-single": MiB, "cpu-double": 16 * MiB}
EMULATED = not torch.cuda.is_available()
# DCP warns about single-process use from its own threads; bench.engines.dcp silences it, but
# pytest resets the warning filters for each test.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def tiny_raw(targets: list[str]) -> dict[str, Any]:
    """The tiny sweep: 8 MiB of 1 MiB or 8 MiB tensors (16 MiB is skipped), 1 and 2 targets.

    cpu-double keeps 16 MiB chunks, so its 8 MiB state fits one chunk and uses one target of two.
    """
    return {
        "name": "tiny",
        "host_baseline_s": QUICK_BASELINE_S,
        "engines": ENGINES,
        "total_sizes": ["8MiB"],
        "tensor_sizes": ["1MiB", "8MiB", "16MiB"],
        "ssd_counts": [1, 2],
        "targets": targets,
        "repetitions": 1,
        "warmups": 1,
        "ceilings": dict(QUICK_CEILINGS, probes=True),
        "engine_options": {e: {"chunk_bytes": CHUNK[e]} for e in STRIPED},
    }


def make_targets(root: Path, n: int) -> list[str]:
    out = []
    for i in range(n):
        d = root / f"target-{i}"
        d.mkdir(parents=True)
        reason = odirect.probe(str(d))
        if reason:
            pytest.skip(f"scratch refuses O_DIRECT, needed by cpu-single and gds: {reason}")
        out.append(str(d))
    return out


def read_csv(run_dir: str) -> tuple[list[str], list[dict[str, str]]]:
    with open(os.path.join(run_dir, "results.csv"), newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


# The tiny run's cpu-double rows and the test below read what stays in the page cache after a
# save or a restore: another test's sweep, dropping the page cache between its cases, would take
# it away. These run after the others, alone (`make test`).
ALONE = pytest.mark.alone


@pytest.fixture(scope="module")
def tiny() -> Iterator[dict[str, Any]]:
    """Runs the tiny sweep once; yields the runner, its run directory and the rows."""
    root = Path(tempfile.mkdtemp(prefix="test_runner-tiny-", dir=scratch_base()))
    try:
        targets = make_targets(root, 2)
        cfg = config.from_dict(tiny_raw(targets))
        r = Sweep(cfg, devices.detect("host-emulated"), str(root / "results"), quiet=True)
        run_dir = r.run()
        columns, rows = read_csv(run_dir)
        yield {
            "cfg": cfg,
            "runner": r,
            "run_dir": run_dir,
            "columns": columns,
            "rows": rows,
            "targets": targets,
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


@ALONE
def test_tiny_run_columns_and_row_count(tiny: dict[str, Any]) -> None:
    cfg, rows = tiny["cfg"], tiny["rows"]
    assert tiny["columns"] == results.COLUMNS
    per_round = len(STRIPED) * len(cfg.ssd_counts) + len(BASELINES) * 1
    n_workloads = 2  # 8MiB/1MiB and 8MiB/8MiB; 8MiB/16MiB is skipped
    assert len(rows) == per_round * (cfg.warmups + cfg.repetitions) * n_workloads == 32
    assert tiny["runner"].failures == 0
    assert os.path.basename(tiny["run_dir"]) == tiny["runner"].run_id
    assert sorted(os.listdir(tiny["run_dir"])) == ["env.json", "results.csv"]


@ALONE
def test_tiny_run_ran_a_plan_decided_whole_and_frozen(tiny: dict[str, Any]) -> None:
    """The plan the sweep ran was complete before the first save (every case's verdict, the
    rows already done, the page-cache policy, env.json's preflight block) and cannot be
    changed after."""
    r, cfg = tiny["runner"], tiny["cfg"]
    p = r.plan
    assert isinstance(p, plan.RunPlan)
    assert [g.key for g in p.groups] == ["x1", "x2"]
    assert p.done == frozenset()  # a new run
    engines_at = {n: plan.engines_at(cfg, p.engines, n) for n in cfg.ssd_counts}
    assert set(p.verdicts) == {
        (wl.id, g.key, e) for g in p.groups for wl in p.workloads for e in engines_at[g.n]
    }
    assert all(v.restore is not None for v in p.verdicts.values())
    assert {row["cache_dropped"] for row in tiny["rows"]} == {str(p.cache_dropped)}
    with open(os.path.join(tiny["run_dir"], "env.json")) as f:
        assert json.load(f)["preflight"] == json.loads(json.dumps(dict(p.preflight)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.cache_dropped = not p.cache_dropped


@ALONE
def test_tiny_run_watches_the_host_at_rest_for_its_configs_baseline(tiny: dict[str, Any]) -> None:
    """The idle baseline lasts the config's host_baseline_s, before the saves and after them."""
    env = json.loads(Path(tiny["run_dir"], "env.json").read_text())
    for when in ("baseline", "baseline_after"):
        took = env["host_cost"][when]["seconds"]
        assert QUICK_BASELINE_S <= took < hostcost.BASELINE_S, (when, took)


@ALONE
def test_tiny_run_probes_the_ceilings_before_each_workload(tiny: dict[str, Any]) -> None:
    """A probe per workload and target count, in run order, with the keys the model reads;
    the model of each case is taken from the probes around it."""
    with open(os.path.join(tiny["run_dir"], "env.json")) as f:
        env = json.load(f)
    probes = env["ceilings_probes"]
    wls = ("synthetic-8MiB-1MiB", "synthetic-8MiB-8MiB")
    assert [(p["n_targets"], p["workload"]) for p in probes] == [
        (n, w) for n in (1, 2) for w in wls
    ]
    for p in probes:
        for key in ("direct_write", "buffered_write", "buffered_write_1", "copy"):
            assert p[f"{key}_Bps"] > 0, key
        assert p["file_bytes"] * p["n_targets"] >= 8 * MiB
    assert [p["unix_time"] for p in probes] == sorted(p["unix_time"] for p in probes)
    run = runs.load(tiny["run_dir"])
    base = from_run(run)
    here = near(base, run, wls[1], 2)
    assert here is not base
    # Which values: the median of the probes around the workload and the ceilings after (fio
    # times in ms, so two measured 8 MiB runs can tie: the probes are set to known values).
    mine = [p for p in env["ceilings_probes"] if p["n_targets"] == 2]
    for p, v in zip(mine, (5e9, 7e9), strict=True):
        p["direct_write_Bps"] = v
    known = dataclasses.replace(run, env=env)
    after = RunCeilings.from_env(env).after
    tail = _point(after, 2) if after else {}
    window = [5e9, 7e9] + ([tail[DIRECT_WRITE]] if tail.get(DIRECT_WRITE) else [])
    got = dict(near(from_run(known), known, wls[1], 2).direct_by_n)[2]
    assert got == pytest.approx(float(np.median(window)))


@ALONE
def test_tiny_run_cases_in_order(tiny: dict[str, Any]) -> None:
    got = [
        (r["n_targets"], r["workload"], r["warmup"], r["rep"], r["engine"]) for r in tiny["rows"]
    ]
    want = []
    for n in ("1", "2"):
        for w in ("synthetic-8MiB-1MiB", "synthetic-8MiB-8MiB"):
            for warm in ("True", "False"):
                for e in ENGINES:
                    if n == "1" or e in STRIPED:  # baselines only at the smallest SSD count
                        want.append((n, w, warm, "0", e))
    assert got == want
    for r in tiny["rows"]:
        assert r["case_id"] == f"{r['workload']}-x{r['n_targets']}-{r['engine']}"
        assert r["run_id"] == tiny["runner"].run_id


@ALONE
def test_tiny_run_row_values(tiny: dict[str, Any]) -> None:
    for r in tiny["rows"]:
        e, n = r["engine"], int(r["n_targets"])
        where = f"{r['case_id']} warmup={r['warmup']}"
        assert r["verified"] == "True", where
        assert r["error"] == "", where
        assert r["device"] == ("host-emulated" if EMULATED else "cuda")
        assert r["emulated"] == str(EMULATED)
        if e != "gds":
            assert r["gds_mode"] == "none", where
        elif EMULATED:
            assert r["gds_mode"] == "emulated", where
        else:  # gds exactly when no file gave a reason for compat mode
            d = detail.read(r["io_detail"])
            reasons = (d.compat_reasons if isinstance(d, detail.GdsDetail) else None) or []
            assert r["gds_mode"] == ("compat" if reasons else "gds"), where
        tensor = 1 * MiB if r["workload"] == "synthetic-8MiB-1MiB" else 8 * MiB
        assert int(r["total_bytes"]) == 8 * MiB
        assert int(r["tensor_bytes"]) == tensor
        assert int(r["n_tensors"]) == 8 * MiB // tensor
        assert r["dtype"] == "float32"
        assert float(r["stall_s"]) > 0 and float(r["restore_s"]) > 0, where
        # Every case waits until its save is durable before the next save: none ever waits
        # for a previous one.
        assert float(r["wait_prev_s"]) == 0.0, where
        assert int(r["rss_peak_bytes"]) > 8 * MiB
        # A save of 8 MiB (copied or written, hashed) costs this process some CPU time.
        assert float(r["cpu_user_s"]) + float(r["cpu_sys_s"]) > 0, where
        assert r["cache_dropped"] == str(tiny["runner"].cache_dropped)
        if e in STRIPED:
            chunks = -(-8 * MiB // CHUNK[e])
            assert int(r["targets_used"]) == min(n, chunks), where
            assert r["checksums"] == "True"
            assert float(r["hash_s"]) > 0
            opts = json.loads(r["options"])
            assert opts["chunk_bytes"] == CHUNK[e]
            assert opts["checksums"] is True
        else:
            assert n == 1 and int(r["targets_used"]) == 1, where
            assert r["checksums"] == "False"
        if e in ("cpu-single", "gds"):  # read back with O_DIRECT: nothing left in the cache
            assert 0 <= int(r["restore_cached_bytes"]) < 8 * MiB // 100, where
        elif e == "cpu-double":  # read back through the page cache, which keeps it
            assert int(r["restore_cached_bytes"]) > 8 * MiB // 2, where
        if e in ("cpu-single", "cpu-double"):
            assert int(r["pinned_bytes"]) >= 8 * MiB, where
        elif e == "dcp":  # its cached staging: one host copy of the state, kept across saves
            assert int(r["pinned_bytes"]) == 8 * MiB, where
            assert json.loads(r["io_detail"]) == {
                "kind": "dcp",
                "staging": "cached",
                "checkpointer": "thread",
            }
            assert detail.read(r["io_detail"]) == detail.DcpDetail("cached", "thread")
        else:
            assert int(r["pinned_bytes"]) == 0, where
        if e in ("gds", "torch-save"):  # synchronous: durable when save() returns
            assert float(r["persist_s"]) == 0.0, where
            assert float(r["total_s"]) == float(r["stall_s"]), where


@ALONE
def test_tiny_run_staging_grows_only_outside_the_timed_saves(tiny: dict[str, Any]) -> None:
    # The runner warms every engine's staging for the state before timing anything.
    assert {r["staging_grew"] for r in tiny["rows"]} == {"False"}
    assert {r["copied_tensors"] for r in tiny["rows"]} == {"0"}


@ALONE
def test_tiny_run_env_json(tiny: dict[str, Any]) -> None:
    with open(os.path.join(tiny["run_dir"], "env.json")) as f:
        envb = json.load(f)
    storage = envb["storage"]
    assert [t["path"] for t in storage["targets"]] == tiny["targets"]
    for t in storage["targets"]:
        assert t["fstype"] and t["fstype"] != "unknown"
        assert t["mount"] and t["block"]["dev"]
        assert t["free_bytes"] > 0
    assert storage["shared_device"] is True  # both targets are folders on one disk
    assert storage["distinct_devices"] == 1
    assert any("share one device" in n for n in envb["notes"])
    assert envb["device"] == {"kind": "host-emulated" if EMULATED else "cuda", "emulated": EMULATED}
    from bench.engines import gds

    assert envb["kvikio"] == gds.kvikio_info()  # the gds engine's block, through its hook
    assert envb["config"]["skipped_cases"] == [
        {"total_bytes": 8 * MiB, "tensor_bytes": 16 * MiB, "why": "tensor larger than total"}
    ]
    assert envb["config"]["targets"] == tiny["targets"]
    assert envb["config"]["engine_options"]["cpu-single"]["chunk_bytes"] == MiB
    assert envb["packages"]["torch"] == torch.__version__
    assert "commit" in envb["git"]
    assert envb["memory_bytes"] > 0 and envb["cpu"]["logical_cores"] >= 1


@ALONE
def test_tiny_run_summary(tiny: dict[str, Any]) -> None:
    from analysis import runs, summary

    table = summary.table(runs.load(tiny["run_dir"]))
    assert len(table) == 16  # (3 striped x 2 counts + 2 baselines) x 2 workloads
    assert set(table["n"]) == {1}
    assert (table["write_GBps"] > 0).all()
    rows = table.reset_index()
    first = rows[(rows["workload"] == "synthetic-8MiB-1MiB") & (rows["n_targets"] == 1)]
    assert list(first["engine"]) == runs.order_engines(ENGINES)
    assert list(rows[rows["n_targets"] == 2]["engine"].unique()) == runs.order_engines(STRIPED)


# -- page cache and stall: the point of cpu-single ----------------------------------------------


@ALONE
@pytest.mark.parametrize("engine", ["cpu-single", "cpu-double"])
def test_what_a_save_leaves_in_the_page_cache(make_engine: Any, targets: Any, engine: str) -> None:
    """cpu-single writes with O_DIRECT: once durable, none of its checkpoint's pages are in the
    page cache (mincore on its own files, whatever else the machine does); cpu-double writes
    through the page cache, which keeps what it wrote. (System-wide `Cached` growth during the
    saves is measured in tests/perf/bench_timing.py: other processes' I/O counts there.)"""
    from bench.workloads import synthetic_state

    state = synthetic_state(32 * MiB, 8 * MiB, seed=4)
    eng = make_engine(engine, targets(1), chunk_bytes="1MiB")
    eng.save(state, "c").wait()
    files = eng.cached_files("c")
    size = sum(os.path.getsize(f) for f in files)
    assert size >= 32 * MiB
    resident = measure.resident_bytes(files)
    if engine == "cpu-single":
        assert resident == 0
    else:
        assert resident > 0
    measure.evict_files(files)
    assert measure.resident_bytes(files) == 0  # what restore_phase relies on
    # and a restore: cpu-single reads with O_DIRECT (< 1 % of the files left in the page
    # cache), cpu-double through the page cache
    for into in (None, state):
        eng.load("c", **({"into": into} if into is not None else {}))
        resident = measure.resident_bytes(files)
        assert resident < size // 100 if engine == "cpu-single" else resident > size // 2
        measure.evict_files(files)


# -- failed cases ---------------------------------------------------------------------------


@pytest.fixture
def small(scratch: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A small sweep (8 MiB of 4 MiB tensors, 1 target, 2 repetitions, no warm-up)."""
    monkeypatch.setattr(measure, "drop_page_cache", lambda: "not dropped in this test")
    targets = make_targets(scratch, 1)
    return {
        "name": "small",
        "host_baseline_s": QUICK_BASELINE_S,
        "engines": ["cpu-single", "torch-save"],
        "total_sizes": ["8MiB"],
        "tensor_sizes": ["4MiB"],
        "targets": targets,
        "repetitions": 2,
        "warmups": 0,
        "ceilings": dict(QUICK_CEILINGS),
    }


def corrupt_restores(monkeypatch: pytest.MonkeyPatch, engine: str, key: str) -> None:
    """`engine`'s restores come back with one bit of tensor `key` flipped."""
    cls = REGISTRY[engine]
    real = cls.load

    def load(
        self: Any, name: str, device: str = "cpu", checksums: bool = True, into: Any = None
    ) -> Any:
        state = real(self, name, device, checksums, into)
        state[key].view(-1).view(torch.uint8)[5] ^= 1
        return state

    monkeypatch.setattr(cls, "load", load)


def test_failed_verification_is_recorded(
    small: dict[str, Any], scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    corrupt_restores(monkeypatch, "cpu-single", "t00001")
    r = Sweep(
        config.from_dict(small),
        devices.detect("host-emulated"),
        str(scratch / "results"),
        quiet=True,
    )
    _, rows = read_csv(r.run())
    assert [(x["engine"], x["rep"]) for x in rows] == [
        ("cpu-single", "0"),
        ("torch-save", "0"),
        ("cpu-single", "1"),
        ("torch-save", "1"),
    ]
    for x in rows:
        if x["engine"] == "cpu-single":
            # the engine's own checksums catch the damaged restore before the comparison
            assert x["verified"] == "False"
            assert x["error"].startswith("ChecksumError: checkpoint ")
            assert "tensor state['t00001'] does not match its checksum" in x["error"]
            assert float(x["total_s"]) > 0  # the save itself was measured
        else:
            assert x["verified"] == "True" and x["error"] == ""
    assert r.failures == 2
    assert os.listdir(small["targets"][0]) == []  # every checkpoint deleted, failed or not


def test_engine_error_is_recorded_and_the_sweep_goes_on(
    small: dict[str, Any], scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []

    def broken_load(
        self: Any, name: str, device: str = "cpu", checksums: bool = True, into: Any = None
    ) -> Any:
        calls.append(name)
        if len(calls) == 1:
            raise OSError(errno.EIO, "injected read error", name)
        raise RuntimeError("injected bug")

    monkeypatch.setattr(REGISTRY["cpu-single"], "load", broken_load)
    r = Sweep(
        config.from_dict(small),
        devices.detect("host-emulated"),
        str(scratch / "results"),
        quiet=True,
    )
    _, rows = read_csv(r.run())
    assert len(rows) == 4
    single = [x for x in rows if x["engine"] == "cpu-single"]
    assert single[0]["error"].startswith("OSError: [Errno 5] injected read error: ")
    assert single[1]["error"] == "RuntimeError: injected bug"
    for x in single:
        assert x["verified"] == "False"
        assert x["restore_s"] == ""  # never reached
        assert float(x["total_s"]) > 0
    assert all(x["verified"] == "True" for x in rows if x["engine"] == "torch-save")
    assert r.failures == 2
    assert os.listdir(small["targets"][0]) == []


def test_a_delete_that_fails_is_logged_and_the_sweep_goes_on(
    small: dict[str, Any], scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`delete()` can raise UserError (here the claim check, over a `.targets` record damaged
    behind the engine's back): the sweep logs it and goes on, every row recorded. It used to
    escape the case loop and end the sweep."""
    cls = REGISTRY["cpu-single"]
    real = cls.delete

    def delete(self: Any, name: str) -> None:
        (Path(self.targets[0]) / name / generations.TARGETS_RECORD).write_text("{not json")
        real(self, name)

    monkeypatch.setattr(cls, "delete", delete)
    r = Sweep(
        config.from_dict(small),
        devices.detect("host-emulated"),
        str(scratch / "results"),
        quiet=True,
    )
    warned: list[str] = []
    r.core.warn = warned.append  # type: ignore[method-assign]
    _, rows = read_csv(r.run())
    assert [(x["engine"], x["verified"]) for x in rows] == [
        ("cpu-single", "True"),
        ("torch-save", "True"),
        ("cpu-single", "True"),
        ("torch-save", "True"),
    ]
    assert r.failures == 0
    t = small["targets"][0]
    names = sorted(os.listdir(t))  # the two cpu-single checkpoints stayed, said so
    assert len(names) == 2
    assert [w for w in warned if w.startswith("could not delete")] == [
        f"could not delete checkpoint {n}: checkpoint {n!r}: cannot read "
        f"{Path(t) / n / generations.TARGETS_RECORD} (Expecting property name enclosed in "
        "double quotes: line 1 column 2 (char 1)); remove it by hand"
        for n in names
    ]


def test_on_error_stop_keeps_the_rows_so_far(
    small: dict[str, Any], scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    corrupt_restores(monkeypatch, "cpu-single", "t00000")
    small = {**small, "engines": ["torch-save", "cpu-single"], "on_error": "stop"}
    r = Sweep(
        config.from_dict(small),
        devices.detect("host-emulated"),
        str(scratch / "results"),
        quiet=True,
    )
    with pytest.raises(UserError) as e:
        r.run()
    assert str(e.value) == (
        "stopped after a failed case (synthetic-8MiB-4MiB-x1-cpu-single); "
        f"results so far are in {r.run_dir}"
    )
    _, rows = read_csv(r.run_dir)
    assert [(x["engine"], x["verified"]) for x in rows] == [
        ("torch-save", "True"),
        ("cpu-single", "False"),
    ]
    assert r.failures == 1


def test_cli_exits_1_when_a_row_fails(
    small: dict[str, Any],
    scratch: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    corrupt_restores(monkeypatch, "cpu-single", "t00000")
    path = scratch / "small.yaml"
    path.write_text(json.dumps(small))  # JSON is YAML
    assert cli.main(["run", str(path), "-o", str(scratch / "results"), "-q"]) == 1
    out, err = capsys.readouterr()
    assert "2 row(s) failed or did not verify" in err
    assert "results: " in out


# -- preflight: nothing runs, no run directory ------------------------------------------------


def test_preflight_o_direct_refused(
    small: dict[str, Any], scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(odirect, "probe", lambda path: "O_DIRECT refused (EINVAL)")
    r = Sweep(
        config.from_dict(small),
        devices.detect("host-emulated"),
        str(scratch / "results"),
        quiet=True,
    )
    with pytest.raises(UserError) as e:
        r.run()
    t = small["targets"][0]
    assert str(e.value) == (
        f"target {t}: O_DIRECT refused (EINVAL); needed by cpu-single (use a disk-backed target)"
    )
    assert not (scratch / "results").exists()


def test_preflight_no_space(
    small: dict[str, Any], scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = shutil.disk_usage
    monkeypatch.setattr(plan.shutil, "disk_usage", lambda p: real(p)._replace(free=10 * MiB))
    r = Sweep(
        config.from_dict(small),
        devices.detect("host-emulated"),
        str(scratch / "results"),
        quiet=True,
    )
    with pytest.raises(UserError) as e:
        r.run()
    t = small["targets"][0]
    assert str(e.value) == (
        f"target {t}: disk space: 10MiB free, but a 8MiB checkpoint needs 72.4MiB here; "
        "way out: a smaller total_sizes, or more targets"
    )
    assert not (scratch / "results").exists()
    # The ceilings' files count too: 1 GiB of probe beside an 8 MiB checkpoint.
    monkeypatch.setattr(plan.shutil, "disk_usage", lambda p: real(p)._replace(free=512 * MiB))
    cfg = {**small, "ceilings": {"enabled": True, "min_bytes": "1GiB"}}
    r = Sweep(
        config.from_dict(cfg), devices.detect("host-emulated"), str(scratch / "r2"), quiet=True
    )
    with pytest.raises(UserError, match=r"512MiB free, but a 8MiB checkpoint needs 1.1GiB here"):
        r.run()


def test_a_run_without_verification_reports(scratch: Path) -> None:
    """`verify: false` never compares restores: its rows are not 'unverified', so the terminal
    summary and `ckptbench report` (the same code) both show them."""
    from analysis import runs
    from analysis.report.build import build

    targets = make_targets(scratch, 1)
    raw = {
        "name": "noverify",
        "host_baseline_s": QUICK_BASELINE_S,
        "engines": ["cpu-single", "torch-save"],
        "total_sizes": ["4MiB"],
        "tensor_sizes": ["1MiB"],
        "targets": targets,
        "repetitions": 2,
        "warmups": 0,
        "verify": False,
        "ceilings": {"enabled": False},
    }
    r = Sweep(
        config.from_dict(raw), devices.detect("host-emulated"), str(scratch / "res"), quiet=True
    )
    run_dir = r.run()
    _, rows = read_csv(run_dir)
    assert len(rows) == 4 and all(x["verified"] == "False" and x["error"] == "" for x in rows)
    assert r.failures == 0
    run = runs.load(run_dir)
    assert len(run.ok) == 4 and "not verified" not in {k for k, v in run.excluded.items() if v}
    rep = build(run_dir, str(scratch / "rep"))
    assert "torch-save" in rep.summary_text and "cpu-single" in rep.summary_text
