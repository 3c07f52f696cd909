"""What a save costs per tensor (`make perf`): 20,000 tensors of 4 KiB through cpu-single, and
the same bytes as one tensor, for the ratio.

- save(): the call alone, what training stalls for (the snapshot); the previous save's wait()
  and the delete of its checkpoint run in the untimed setup;
- wait(): the persist that follows, timed from the moment save() returned (the save runs in
  the untimed setup) until the checkpoint is durable.

Only the public engine API (`bench.engines.create`, `warm`, `save`, `wait`, `delete`, `close`),
host-emulated, with the engine's default options (checksums on), so that the figures follow
whatever the engine does per tensor. After pytest-benchmark's timing table a second table
gives each benchmark in microseconds per tensor (the round's time over the state's tensors,
also stored in each benchmark's extra_info: `us_per_tensor_median`, `us_per_tensor_best`) and
how many times the one-tensor state's median the 20,000-tensor state's takes.

Scratch files go to `$CKPTBENCH_SCRATCH/perf`, else `<repo>/scratch/perf`, never /tmp (often
tmpfs, which refuses O_DIRECT), as in bench_hot_paths.py; the fixtures live here for the reason
that file gives.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from perf_common import SummaryTable, scratch_dir

from bench.engines import create
from bench.storage import odirect
from bench.storage.verify import first_difference
from bench.workloads import synthetic_state

N_SMALL = 20_000
SMALL = 4096
TOTAL = N_SMALL * SMALL  # 80,000 KiB either way
SHAPES = {f"{N_SMALL}x4KiB": SMALL, "1x80000KiB": TOTAL}
ROUNDS = {f"{N_SMALL}x4KiB": 5, "1x80000KiB": 10}


@pytest.fixture(scope="module")
def per_tensor_scratch() -> Iterator[Path]:
    """A fresh directory on a disk-backed filesystem for this module, removed afterwards; a
    skip where it refuses O_DIRECT (cpu-single writes with it)."""
    d = scratch_dir("per-tensor-")
    reason = odirect.probe(str(d))
    if reason:
        shutil.rmtree(d, ignore_errors=True)
        pytest.skip(reason)
    yield d
    shutil.rmtree(d, ignore_errors=True)


class _PerTensorTable(SummaryTable):
    """Time per round over the state's tensors: (group, name, tensors, median, min)."""

    def write(self, tr: Any) -> None:
        tr.write_sep("-", "per tensor: time per round / tensors (us = microseconds)")
        # the same bytes as one tensor, per group: how many times longer the many tensors take
        one = {g: median for g, _, n, median, _ in self.rows if n == 1}
        gw = max(len(r[0]) for r in self.rows)
        nw = max(len(r[1]) for r in self.rows)
        tr.write_line(
            f"{'group':<{gw}}  {'name':<{nw}}  {'tensors':>7}  {'median':>10}  "
            f"{'us/tensor median':>16}  {'us/tensor best':>14}  {'x 1 tensor':>10}"
        )
        for group, name, n, median, best in sorted(self.rows, key=lambda r: (r[0], -r[2])):
            ratio = f"{median / one[group]:.1f}" if group in one else "-"
            tr.write_line(
                f"{group:<{gw}}  {name:<{nw}}  {n:>7}  {median * 1e3:>7.2f} ms  "
                f"{median / n * 1e6:>16.2f}  {best / n * 1e6:>14.2f}  {ratio:>10}"
            )


@pytest.fixture(scope="session")
def _per_tensor_table(pytestconfig: pytest.Config) -> _PerTensorTable:
    return _PerTensorTable().register(pytestconfig, "ckptbench-perf-per-tensor")


def _record(benchmark: Any, table: _PerTensorTable, n: int) -> None:
    """us per tensor of the median and the fastest round, into extra_info and the table."""
    benchmark.extra_info["tensors"] = n
    benchmark.extra_info["bytes"] = TOTAL
    if benchmark.stats is None:  # --benchmark-disable: ran once, nothing timed
        return
    median, best = benchmark.stats.stats.median, benchmark.stats.stats.min
    benchmark.extra_info["us_per_tensor_median"] = round(median / n * 1e6, 3)
    benchmark.extra_info["us_per_tensor_best"] = round(best / n * 1e6, 3)
    table.rows.append((benchmark.group or "", benchmark.name, n, median, best))


@pytest.fixture(scope="module", params=list(SHAPES))
def engine_and_state(
    request: pytest.FixtureRequest, per_tensor_scratch: Path
) -> Iterator[tuple[str, Any, dict[str, torch.Tensor]]]:
    """(shape id, a warm cpu-single engine, its state): 20,000 x 4 KiB, or one tensor of the
    same bytes."""
    shape = request.param
    state = synthetic_state(TOTAL, SHAPES[shape], seed=11)
    assert len(state) == TOTAL // SHAPES[shape]
    target = per_tensor_scratch / shape
    target.mkdir()
    eng = create("cpu-single", [str(target)], device="host-emulated")
    eng.warm(state)
    yield shape, eng, state
    eng.close()


class _Saves:
    """The save in flight between rounds, so that each round's setup finishes the previous
    one (wait, then delete) outside the timing."""

    def __init__(self, eng: Any, state: dict[str, torch.Tensor]) -> None:
        self.eng, self.state = eng, state
        self.pending: Any = None
        self.results: list[Any] = []

    def finish(self) -> None:
        if self.pending is not None:
            self.results.append(self.pending.wait())
            self.pending = None
            self.eng.delete("ckpt")

    def save(self) -> None:
        self.pending = self.eng.save(self.state, "ckpt")


@pytest.mark.benchmark(group="cpu-single save() (snapshot)")
def test_save_call(
    benchmark: Any,
    _per_tensor_table: _PerTensorTable,
    engine_and_state: tuple[str, Any, dict[str, torch.Tensor]],
) -> None:
    shape, eng, state = engine_and_state
    saves = _Saves(eng, state)

    def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
        saves.finish()  # the previous round's persist and delete, untimed
        return (), {}

    benchmark.pedantic(saves.save, setup=setup, rounds=ROUNDS[shape], warmup_rounds=1)
    saves.finish()
    assert saves.results and all(r.bytes == TOTAL for r in saves.results)
    _record(benchmark, _per_tensor_table, len(state))


@pytest.mark.benchmark(group="cpu-single wait() (persist)")
def test_wait_after_save(
    benchmark: Any,
    _per_tensor_table: _PerTensorTable,
    engine_and_state: tuple[str, Any, dict[str, torch.Tensor]],
) -> None:
    shape, eng, state = engine_and_state
    saves = _Saves(eng, state)

    def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
        if saves.pending is not None:  # waited in the timed round: only the delete is left
            saves.pending = None
            eng.delete("ckpt")
        saves.save()  # untimed: the round times the wait() that follows
        return (), {}

    def wait() -> None:
        saves.results.append(saves.pending.wait())

    benchmark.pedantic(wait, setup=setup, rounds=ROUNDS[shape], warmup_rounds=1)
    # the last checkpoint, durable, reads back bit-exact (random bits: bytes, not values)
    assert first_difference(state, eng.load("ckpt")) is None
    saves.pending = None
    eng.delete("ckpt")
    assert saves.results and all(r.bytes == TOTAL for r in saves.results)
    _record(benchmark, _per_tensor_table, len(state))
