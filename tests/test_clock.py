"""bench.measure.clock: the stall and the time to durability are read by the harness around an
engine's save(), whatever the engine reports, in every caller (the library API, the sweep and
its ranks' save_phase, the training loop)."""

from __future__ import annotations

import ast
import csv
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import QUICK_BASELINE_S, QUICK_CEILINGS, result_row

from bench import engines
from bench.common import devices
from bench.config import sweep as config
from bench.config import training
from bench.engines import options as opts
from bench.engines.base import PendingSave, SaveResult
from bench.engines.cpu_single import CpuSingle
from bench.measure import clock
from bench.run import protocol
from bench.run.sweep import Sweep
from bench.run.training import loop
from bench.storage import odirect
from bench.workloads import synthetic_state

SLOW_S = 0.25  # work the planted engine does inside save() after its own timer stopped
PLANTED = "planted-slow"
MiB = 1 << 20


class PlantedSlow(CpuSingle):
    """cpu-single that, inside save(), stops a timer of its own, reports it as its stall, and
    only then does SLOW_S more work before returning: the work that engine timers missed."""

    name = PLANTED

    def save(self, state: Any, name: str) -> PendingSave:
        t0 = time.perf_counter_ns()
        pending = super().save(state, name)
        pending.result.stall_s = (time.perf_counter_ns() - t0) / 1e9  # a timer of its own
        time.sleep(SLOW_S)  # the caller is still blocked
        return pending


@pytest.fixture
def planted(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The planted engine registered as an engine like any other, for this test only."""
    monkeypatch.setitem(
        engines.ENGINES, PLANTED, engines.Entry("test_clock:PlantedSlow", opts.SnapshotOptions)
    )
    yield PLANTED


def target(scratch: Path, name: str = "t") -> str:
    d = scratch / name
    d.mkdir(parents=True, exist_ok=True)
    reason = odirect.probe(str(d))
    if reason:
        pytest.skip(f"cpu-single needs O_DIRECT: {reason}")
    return str(d)


def test_library_save_reports_the_wall_time_of_the_call(planted: str, scratch: Path) -> None:
    eng = engines.create(planted, [target(scratch)], chunk_bytes="1MiB", device="host-emulated")
    state = synthetic_state(4 * MiB, MiB)
    try:
        eng.warm(state)
        t_call = time.perf_counter_ns()
        pending = eng.save(state, "ck")
        t_back = time.perf_counter_ns()
        result = pending.wait()
        t_waited = time.perf_counter_ns()
    finally:
        eng.close()
    # The engine's own timer said a few milliseconds; save() blocked for more than SLOW_S.
    assert pending.stall_s >= SLOW_S
    assert pending.stall_s <= (t_back - t_call) / 1e9
    assert result.stall_s == pending.stall_s
    assert pending.t0_ns >= t_call and pending.t_return_ns <= t_back
    assert result.stall_s <= result.total_s <= (t_waited - t_call) / 1e9
    assert result.persist_s == pytest.approx(result.total_s - result.stall_s, abs=1e-9)


def test_the_sweeps_rows_hold_the_work_after_the_engines_timer(planted: str, scratch: Path) -> None:
    cfg = config.from_dict(
        {
            "name": "planted",
            "host_baseline_s": QUICK_BASELINE_S,
            "engines": [planted],
            "total_sizes": ["4MiB"],
            "tensor_sizes": ["1MiB"],
            "targets": [target(scratch)],
            "repetitions": 2,
            "warmups": 0,
            "ceilings": dict(QUICK_CEILINGS),
            "engine_options": {planted: {"chunk_bytes": "1MiB"}},
        }
    )
    run_dir = Sweep(
        cfg, devices.detect("host-emulated"), str(scratch / "results"), quiet=True
    ).run()
    with open(os.path.join(run_dir, "results.csv"), newline="") as f:
        got = list(csv.DictReader(f))
    slow = [r for r in got if r["engine"] == planted]
    assert len(slow) == 2
    for r in slow:
        assert r["error"] == "" and r["verified"] == "True"
        assert float(r["stall_s"]) >= SLOW_S
        assert float(r["total_s"]) >= float(r["stall_s"])
    with open(os.path.join(run_dir, "env.json")) as f:
        assert '"stall_clock": "harness"' in f.read()


def test_the_training_loop_rows_hold_it_too(planted: str, scratch: Path) -> None:
    from test_training import TINY_MODEL

    cfg = training.from_dict(
        {
            "name": "planted-train",
            "engines": [planted],
            "steps": 4,
            "checkpoint_every": 2,
            "warmup_steps": 1,
            "warmup_checkpoints": 1,
            "model": TINY_MODEL,
            "scratch": str(scratch / "train"),
            "engine_options": {planted: {"chunk_bytes": "64KiB"}},
        }
    )
    t = cfg.resolved_targets()[0]
    Path(t).mkdir(parents=True)
    if odirect.probe(t):
        pytest.skip(f"cpu-single needs O_DIRECT: {odirect.probe(t)}")
    tr = loop.TrainingRun(cfg, str(scratch / "results"), quiet=True)
    run_dir = tr.run()
    assert tr.failures == []
    with open(os.path.join(run_dir, loop.CKPTS_CSV), newline="") as f:
        ckpts = list(csv.DictReader(f))
    with open(os.path.join(run_dir, loop.STEPS_CSV), newline="") as f:
        steps = [r for r in csv.DictReader(f) if r["checkpoint"] == "True"]
    assert [r["warmup"] for r in ckpts] == ["True", "False", "False"]
    for r in ckpts:
        assert float(r["stall_s"]) >= SLOW_S
        assert float(r["save_call_s"]) >= float(r["stall_s"])
        durable = float(r["t_save_s"]) + float(r["total_s"])
        assert float(r["t_durable_s"]) == pytest.approx(durable)
    assert len(steps) == 2
    for r in steps:
        assert float(r["stall_s"]) >= SLOW_S


class Gated:
    """An engine whose persist waits for the test to open a gate: nothing races."""

    def __init__(self) -> None:
        self.gate = threading.Event()

    def save(self, state: Any, name: str) -> PendingSave:
        pending = PendingSave(SaveResult(name=name, bytes=0))
        pending.run_in_background(self.gate.wait)
        return pending


def test_durable_is_when_the_persist_ended_not_when_wait_was_called() -> None:
    """A training loop waits long after the persist ended; its time to durability is the end
    of the persist, read by the clock when the engine's pending save finished."""
    eng = Gated()
    pending = clock.clocked(eng).save(None, "ck")
    assert not pending.done() and pending.result.total_s == 0.0
    opened = time.perf_counter_ns()
    eng.gate.set()
    while not pending.done():
        time.sleep(0.001)
    seen = time.perf_counter_ns()
    time.sleep(0.05)  # the harness is busy elsewhere
    result = pending.wait()
    assert pending.t_durable_ns is not None
    assert opened <= pending.t_durable_ns <= seen
    assert result.total_s == (pending.t_durable_ns - pending.t0_ns) / 1e9
    assert result.persist_s == (pending.t_durable_ns - pending.t_return_ns) / 1e9


def test_a_synchronous_save_is_durable_when_it_returns() -> None:
    class Sync:
        def save(self, state: Any, name: str) -> PendingSave:
            pending = PendingSave(SaveResult(name=name, bytes=0))
            time.sleep(0.01)
            pending.finish_now()
            time.sleep(0.01)  # still inside save(): part of the stall and of the total
            return pending

    pending = clock.clocked(Sync()).save(None, "ck")
    result = pending.wait()
    assert result.stall_s >= 0.02
    assert result.total_s == result.stall_s and result.persist_s == 0.0


def test_a_persist_error_reaches_wait_and_the_row() -> None:
    class Failing:
        def save(self, state: Any, name: str) -> PendingSave:
            pending = PendingSave(SaveResult(name=name, bytes=0))

            def fail() -> None:
                raise OSError(28, "No space left on device")

            pending.run_in_background(fail)
            return pending

    with pytest.raises(OSError, match="No space left"):
        protocol.save_phase(result_row(), Failing(), None, "ck", None)


def test_join_waits_for_a_failed_save_and_leaves_its_error_to_wait() -> None:
    """An engine joins its previous save before the next one: join() returns once that save
    has finished, failed here, and the error stays for the failed save's own wait()."""
    gate = threading.Event()
    pending = PendingSave(SaveResult(name="ck", bytes=0))

    def fail() -> None:
        gate.wait()
        raise OSError(28, "No space left on device")

    pending.run_in_background(fail)
    assert not pending.done()
    gate.set()
    pending.join()
    assert pending.done()
    with pytest.raises(OSError, match="No space left"):
        pending.wait()


def test_clocked_forwards_the_engine() -> None:
    class Thing:
        knob = 3

    eng = clock.clocked(Thing())
    assert clock.clocked(eng) is eng
    assert eng.knob == 3
    eng.knob = 4
    assert eng.engine.knob == 4


ENGINE_DIR = Path(engines.__file__).parent
TIMES = {"stall_s", "total_s", "persist_s"}


@pytest.mark.parametrize(
    "path", sorted(ENGINE_DIR.rglob("*.py")), ids=lambda p: str(p.relative_to(ENGINE_DIR))
)
def test_no_engine_sets_a_stall_or_a_total(path: Path) -> None:
    """Only the clock writes them: an engine module that assigns one is named here (the
    packages' modules too: gds/, snapshot/)."""
    if path.name == "base.py":
        return  # the dataclass declares the fields
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        targets: list[Any] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for t in targets:
            for leaf in ast.walk(t):
                if isinstance(leaf, ast.Attribute) and leaf.attr in TIMES:
                    found.append(f"line {leaf.lineno}: .{leaf.attr}")
        if isinstance(node, ast.keyword) and node.arg in TIMES:
            found.append(f"line {node.value.lineno}: {node.arg}=")
    assert found == [], f"{path.name} sets the harness's times: {found}"


def test_make_peers_goes_through_the_clock(scratch: Path) -> None:
    """`make peers` (scripts/peers.py), on a tiny state: every method's row holds a stall and a
    time to durability read by the clock, its restart timed and verified, and env.json says
    whose clock."""
    import json
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    target(scratch, "t")
    out = subprocess.run(
        [sys.executable, str(repo / "scripts" / "peers.py"), "--size", "4MiB", "--tensor", "1MiB"]
        + ["--reps", "1", "--target", str(scratch / "t"), "-o", str(scratch / "out")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    (run,) = (scratch / "out").iterdir()
    with open(run / "peers.csv", newline="") as f:
        got = [r for r in csv.DictReader(f) if r["engine"] not in ("copy", "fio", "disk")]
    assert {r["engine"] for r in got} >= {"cpu-single", "torch-save"}
    for r in got:
        assert r["verified"] == "True", r
        assert 0 < float(r["stall_s"]) <= float(r["durable_s"]), r
        if r["engine"] in ("torch-save", "safetensors"):  # synchronous: durable on return
            assert float(r["stall_s"]) == float(r["durable_s"]), r
        # the restart side: into the scrubbed state, timed by the harness, verified
        assert float(r["restore_s"]) > 0, r
        if r["engine"] == "cpu-single":  # O_DIRECT: nothing left in the page cache
            assert r["restore_cached_bytes"] == "0", r
    assert "| restart into the existing state |" in out.stdout
    assert json.loads((run / "env.json").read_text())["stall_clock"] == "harness"
