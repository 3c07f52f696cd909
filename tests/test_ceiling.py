"""Device ceilings (bench.measure.ceilings: fio, builtin, memory, measure): the storage probes
write real files and clean up, honour write caps, repeat and keep every run; rows get their
efficiencies from them."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from conftest import QUICK_BASELINE_S

from bench.common import devices
from bench.common.traits import BUILTIN
from bench.config import sweep as config
from bench.measure import efficiency, timers
from bench.measure.ceilings import (
    BUFFERED_READ,
    BUFFERED_WRITE,
    BUFFERED_WRITE_1,
    COPY,
    D2H,
    DIRECT_READ,
    DIRECT_WRITE,
    H2D,
    SERIALIZE,
    Ceilings,
    Writers,
    builtin,
    data,
    fio,
    memory,
)
from bench.measure.ceilings import measure as ceiling_measure
from bench.measure.ceilings.measure import Options
from bench.run import rows
from bench.storage import odirect

MiB = 1 << 20
WRITERS = [builtin.builtin_write] + ([fio.fio_write] if fio.fio_version() else [])


def _dirs(scratch: Path, n: int) -> list[str]:
    out = []
    for i in range(n):
        d = scratch / f"t{i}"
        d.mkdir()
        out.append(str(d))
    reason = odirect.probe(out[0])
    if reason:
        pytest.skip(f"scratch refuses O_DIRECT: {reason}")
    return out


@pytest.mark.parametrize("write", WRITERS, ids=lambda w: w.__name__)
@pytest.mark.parametrize("direct", [True, False], ids=["direct", "buffered"])
@pytest.mark.parametrize("jobs", [1, 2])
def test_probe_writes_and_removes_its_files(
    scratch: Path, monkeypatch, write, direct: bool, jobs: int
) -> None:
    dirs = _dirs(scratch, 2)
    seen = []
    real = data.make_files

    def files(targets: list[str], share: int) -> list[str]:
        out = real(targets, share)
        # preallocated as the engines preallocate: full length, before any data is written
        seen.append([(os.path.getsize(p), os.stat(p).st_blocks * 512) for p in out])
        return out

    # the writer's own module makes its files (fio or builtin)
    monkeypatch.setattr(inspect.getmodule(write), "make_files", files)
    bw = write(dirs, 8 * MiB, MiB, direct, jobs, 4)
    assert seen == [[(8 * MiB, 8 * MiB)] * 2]
    # A real write of 2 x 8 MiB to durability: positive and below any memory bandwidth.
    assert 1e6 < bw < 200e9
    assert [os.listdir(d) for d in dirs] == [[], []]


def test_fio_env_asks_glibc_for_huge_pages(monkeypatch) -> None:
    """fio's buffers on huge pages where THP and glibc allow it; a user's own tunables kept."""
    from bench.measure import env as env_mod

    monkeypatch.setattr(env_mod, "thp_mode", lambda: "madvise")
    monkeypatch.setattr(fio, "_glibc_version", lambda: (2, 36))
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    env, pages = fio.fio_env()
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    assert pages == "transparent huge pages (glibc.malloc.hugetlb=1)"
    monkeypatch.setenv("GLIBC_TUNABLES", env["GLIBC_TUNABLES"])
    assert fio.fio_env()[0]["GLIBC_TUNABLES"] == env["GLIBC_TUNABLES"]  # not twice
    monkeypatch.delenv("GLIBC_TUNABLES")
    assert fio.fio_env()[0]["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"

    monkeypatch.setattr(env_mod, "thp_mode", lambda: "never")
    env, pages = fio.fio_env()
    assert "GLIBC_TUNABLES" not in env
    assert pages == "4 KiB pages (transparent huge pages: never)"
    monkeypatch.setattr(env_mod, "thp_mode", lambda: "always")
    monkeypatch.setattr(fio, "_glibc_version", lambda: (2, 31))
    env, pages = fio.fio_env()
    assert "GLIBC_TUNABLES" not in env and "glibc 2.35" in pages


def test_the_glibc_tunable_puts_malloc_memory_on_huge_pages() -> None:
    """What fio_env relies on, in real child processes: with the tunable a large buffer from
    malloc (as fio's) is backed by transparent huge pages once touched; without it, under THP
    `madvise`, it is not (numpy is no witness: it advises its own large arrays)."""
    import subprocess
    import sys

    from bench.measure import env as env_mod

    env, pages = fio.fio_env()
    if not pages.startswith("transparent"):
        pytest.skip(f"no huge pages for malloc here: {pages}")
    child = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None); libc.malloc.restype = ctypes.c_void_p\n"
        "p = libc.malloc(64 << 20); ctypes.memset(p, 1, 64 << 20)\n"
        "rollup = open('/proc/self/smaps_rollup').read().splitlines()\n"
        "print(next(int(l.split()[1]) for l in rollup if l.startswith('AnonHugePages:')))\n"
    )

    def huge_kb(env: dict[str, str]) -> int:
        out = subprocess.run(
            [sys.executable, "-c", child], env=env, capture_output=True, text=True, check=True
        )
        return int(out.stdout)

    assert huge_kb(env) >= 2048  # kB: at least one 2 MiB page
    if env_mod.thp_mode() == "madvise":
        plain = {k: v for k, v in env.items() if k != "GLIBC_TUNABLES"}
        assert huge_kb(plain) == 0


@pytest.mark.skipif(not fio.fio_version(), reason="fio is not installed")
def test_fio_queues_no_deeper_than_a_writer_has_blocks(scratch: Path, monkeypatch) -> None:
    """fio allocates depth x block per writer: a queue deeper than the writer's blocks would
    only fault in memory (GiBs at depth 32 over 16 MiB blocks)."""
    dirs = _dirs(scratch, 2)
    real = fio.subprocess.run
    cmds: list[list[str]] = []

    envs: list[dict[str, str]] = []

    def spy(cmd, *a, **k):  # type: ignore[no-untyped-def]
        cmds.append(cmd)
        envs.append(k.get("env"))
        return real(cmd, *a, **k)

    monkeypatch.setattr(fio.subprocess, "run", spy)
    # 8 MiB per target, 2 writers each: 4 blocks of 1 MiB per writer.
    assert fio.fio_write(dirs, 8 * MiB, MiB, True, 2, 32) > 1e6
    assert fio.fio_write(dirs, 8 * MiB, MiB, True, 2, 2) > 1e6
    depths = [[a for a in c if a.startswith("--iodepth=")] for c in cmds]
    assert depths == [["--iodepth=4"] * 2, ["--iodepth=2"] * 2]
    assert envs == [fio.fio_env()[0]] * 2  # its buffers on huge pages where they can be


def test_probe_honours_write_caps(scratch: Path) -> None:
    """Two targets capped at 16 MB/s each, 8 blocks of 1 MiB each: a bucket per target lets
    its first block go at once (its burst) and each next one 1 MiB / cap later, so the probe
    cannot take less than 7 MiB / cap, nor report more than 2 x cap x 8 / 7, however fast
    the disk. (How close to the cap it comes is a matter of speed: tests/perf/bench_timing.py.)"""
    dirs = _dirs(scratch, 2)
    cap = 16_000_000
    t0 = time.perf_counter()
    bw = builtin.builtin_write(dirs, 8 * MiB, MiB, True, 1, 2, [cap, cap])
    elapsed = time.perf_counter() - t0
    assert elapsed >= 7 * MiB / cap
    assert bw <= 2 * cap * 8 / 7


def test_fio_gets_the_caps_as_rate_limits(scratch: Path, fake_fio) -> None:
    """A capped target's writers share its cap through fio's `rate`; an uncapped one has none."""
    dirs = _dirs(scratch, 2)
    fio.fio_write(dirs, 8 * MiB, MiB, True, 2, 8, [16_000_000, None])
    (args,) = fake_fio.calls()
    jobs: list[list[str]] = []
    for a in args:
        if a.startswith("--name="):
            jobs.append([])
        elif jobs:
            jobs[-1].append(a)
    assert [[a for a in j if a.startswith("--rate=")] for j in jobs] == [["--rate=8000000"], []]


@pytest.mark.parametrize("write", WRITERS, ids=lambda w: w.__name__)
def test_a_storage_run_stops_writing_after_its_seconds(scratch: Path, write) -> None:
    """A run bounded in time writes what it can by then, and its rate is of what it wrote: a
    target capped at 8 MB/s, given 1.5 s for 64 MiB, writes a fraction of it at the cap."""
    dirs = _dirs(scratch, 1)
    cap = 8_000_000
    t0 = time.perf_counter()
    bw = write(dirs, 64 * MiB, MiB, True, 1, 2, [cap], 1.5)
    elapsed = time.perf_counter() - t0
    assert 0.3 * cap <= bw <= 1.3 * cap
    assert elapsed < 64 * MiB / cap / 2  # it did not write the whole 64 MiB (8.4 s at the cap)
    assert os.listdir(dirs[0]) == []


def test_ceilings_of_a_huge_checkpoint_cost_what_a_small_ones_do(scratch: Path, monkeypatch):
    """A 40 GiB checkpoint's storage runs write (and read) at most `max_bytes` each, its copy
    ceiling copies at most PROBE_COPY_BYTES, and the runs are as many as `storage_runs` says,
    each reported to `progress`; the reads search the grids given for the writes. Nothing of
    the checkpoint's size is allocated, written or read."""
    dirs = _dirs(scratch, 2)
    writes: list[tuple[int, float | None]] = []
    copies: list[int] = []
    reads: list[tuple[int, float | None]] = []
    real_write, real_read = builtin.builtin_write, builtin.builtin_read
    real_copy = memory.copy_bandwidth

    def read(files, share, block, direct, jobs, depth, seconds=None):  # type: ignore[no-untyped-def]
        reads.append((share * len(files), seconds))
        return real_read(files, share, block, direct, jobs, depth, seconds)

    def write(targets, share, block, direct, jobs, depth, caps=None, seconds=None):  # type: ignore[no-untyped-def]
        writes.append((share * len(targets), seconds))
        return real_write(targets, share, block, direct, jobs, depth, caps, seconds)

    def copy(nbytes, *a, **k):  # type: ignore[no-untyped-def]
        copies.append(nbytes)
        return real_copy(nbytes, *a, **k)

    # where measure looks them up
    monkeypatch.setattr(ceiling_measure, "builtin_write", write)
    monkeypatch.setattr(ceiling_measure, "builtin_read", read)
    monkeypatch.setattr(ceiling_measure, "copy_bandwidth", copy)
    monkeypatch.setattr(ceiling_measure, "PROBE_COPY_BYTES", 4 * MiB)
    seen: list[str] = []
    grids = {DIRECT_WRITE: [(1, 2), (2, 2)], BUFFERED_WRITE: [(1, 1), (2, 1)]}
    options = Options(
        targets=dirs,
        ssd_counts=[1, 2],
        checkpoint_bytes=40 << 30,
        block=MiB,
        device=devices.detect("host-emulated"),
        use_fio=False,
        repetitions=2,
        min_bytes=4 * MiB,
        max_bytes=8 * MiB,
        max_seconds=30.0,
        tensor_bytes=MiB,
        grids=grids,
        progress=seen.append,
    )
    out = ceiling_measure.measure(options)
    assert {n for n, _ in writes + reads} == {8 * MiB}
    assert {s for _, s in writes + reads} == {30.0}
    assert len(writes) == len(reads) == 16
    assert len(seen) == options.storage_runs() == 32
    assert dataclasses.replace(options, configs=out.chosen()).storage_runs() == 16  # no search
    assert dataclasses.replace(options, reads=False).storage_runs() == 16
    assert options.storage_bytes() == 8 * MiB
    assert copies == [4 * MiB] and out.method.checkpoint_bytes == 40 << 30
    assert out.method.max_bytes == 8 * MiB and out.counts[2].file_bytes == 4 * MiB
    assert seen[0].startswith("direct write x1: ") and seen[-1].startswith("buffered read x2: ")
    assert not [p for d in dirs for p in Path(d).iterdir()]  # every file made was removed
    assert ceiling_measure.probe_bytes(100, 4 * MiB, 8 * MiB) == 4 * MiB  # at least min_bytes
    assert ceiling_measure.probe_bytes(6 * MiB, 4 * MiB, 8 * MiB) == 6 * MiB


def test_measure_searches_then_repeats_the_best(scratch: Path) -> None:
    dirs = _dirs(scratch, 2)
    drops = []
    out = ceiling_measure.measure(
        Options(
            targets=dirs,
            ssd_counts=[1, 2],
            checkpoint_bytes=8 * MiB,
            block=MiB,
            device=devices.detect("host-emulated"),
            use_fio=False,
            drop=lambda: drops.append(1),
            repetitions=3,
            min_bytes=16 * MiB,
            copy_threads=2,
            tensor_bytes=MiB,
        )
    )
    how = out.method
    assert how.tool == "builtin" and how.repetitions == 3 and how.block_bytes == MiB
    assert set(out.counts) == {1, 2}
    for n, count in out.counts.items():
        assert count.file_bytes == 16 * MiB // n  # at least min_bytes in all
        # A queue deeper than a writer's blocks is the same run: searched once, as it ran
        # (16 MiB over 1 target: 16, 8, 4 blocks per writer; over 2: 8, 4, 2).
        direct = {
            1: [(1, 8), (1, 16), (2, 8), (4, 4)],
            2: [(1, 8), (2, 4), (4, 2)],
        }[n]
        assert ceiling_measure.DIRECT_SEARCH == [(j, q) for j in (1, 2, 4) for q in (8, 16, 32)]
        for kind, search in (
            (DIRECT_WRITE, direct),
            (BUFFERED_WRITE, ceiling_measure.BUFFERED_SEARCH),
            (DIRECT_READ, direct),  # the reads search as the writes of their kind
            (BUFFERED_READ, ceiling_measure.BUFFERED_SEARCH),
        ):
            got = count.kinds[kind]
            assert len(got.runs) == 3 and all(r > 0 for r in got.runs)
            assert [(t.writers.jobs, t.writers.iodepth) for t in got.search] == search
            best = max(got.search, key=lambda t: t.Bps)
            assert got.writers == best.writers
            # the ceiling is the best run of the chosen configuration
            assert got.Bps == pytest.approx(max([*got.runs, best.Bps]), rel=1e-6)
            assert got.median() == pytest.approx(statistics.median(got.runs), rel=1e-6)
        # one writer's page-cache rate, not run again: the search's run of one writer (the
        # buffered runs themselves where the search chose one writer)
        buffered = count.kinds[BUFFERED_WRITE]
        one = next(t for t in buffered.search if t.writers.jobs == 1)
        assert BUFFERED_WRITE_1 not in count.kinds
        assert out.at(BUFFERED_WRITE_1, n).median() == (
            buffered.median() if buffered.writers == Writers(1, 1) else one.Bps
        )
    searched = 4 + 3 + 2 * len(ceiling_measure.BUFFERED_SEARCH)
    # the page cache is dropped before every run, write and read
    assert len(drops) == 2 * (searched + 2 * 2 * 3)
    assert not [p for d in dirs for p in Path(d).iterdir()]  # the files read were removed
    copy = out.at(COPY)
    assert copy.Bps > 1e8 and out.at(D2H) is None and how.copy_threads == 2
    assert len(copy.runs) == 5
    assert copy.Bps == pytest.approx(max(copy.runs), rel=1e-3)
    assert out.at(SERIALIZE).Bps > 1e7
    # After the sweep: the chosen configurations only, no search.
    again = _builtin_once(dirs, [1, 2], 16 * MiB, configs=out.chosen())
    for n, count in again.counts.items():
        assert count.kinds[DIRECT_WRITE].search == ()
        assert count.kinds[DIRECT_WRITE].writers == out.counts[n].kinds[DIRECT_WRITE].writers


def _builtin_once(dirs: list[str], counts: list[int], min_bytes: int, **kw: Any) -> Ceilings:
    """The built-in probe's ceilings of 8 MiB checkpoints, one repetition."""
    host = devices.detect("host-emulated")
    return ceiling_measure.measure(
        Options(
            targets=dirs,
            ssd_counts=counts,
            checkpoint_bytes=8 * MiB,
            block=MiB,
            device=host,
            use_fio=False,
            repetitions=1,
            min_bytes=min_bytes,
            **kw,
        )
    )


def test_the_config_defaults_are_the_probe_defaults() -> None:
    spec = config.CeilingSpec()
    assert [tuple(c) for c in spec.direct_search] == ceiling_measure.GRIDS[DIRECT_WRITE]
    assert [(j, 1) for j in spec.buffered_jobs] == ceiling_measure.GRIDS[BUFFERED_WRITE]


def test_a_given_grid_is_searched_instead_of_the_default(scratch: Path) -> None:
    grids = {DIRECT_WRITE: [(1, 2), (2, 1)], BUFFERED_WRITE: [(2, 1)]}
    out = _builtin_once(_dirs(scratch, 1), [1], 8 * MiB, grids=grids)
    kinds = out.counts[1].kinds
    assert [t.writers for t in kinds[DIRECT_WRITE].search] == [Writers(1, 2), Writers(2, 1)]
    # one buffered configuration: run, not searched
    assert kinds[BUFFERED_WRITE].search == ()
    assert kinds[BUFFERED_WRITE].writers == Writers(2, 1)


def test_a_probe_runs_the_chosen_configurations_once_and_one_writer(scratch: Path) -> None:
    """Between workloads: the chosen configurations once each, the page cache with one writer
    too (what torch.save is), the copy; `drop` called before every storage run; no file left
    behind."""
    dirs = _dirs(scratch, 2)
    drops: list[int] = []
    keep: dict = {}
    calls: list[tuple] = []
    real = builtin.builtin_write

    def spy(targets, share, block, direct, jobs, depth, caps=None, seconds=None):  # type: ignore[no-untyped-def]
        calls.append((len(targets), share, direct, jobs, depth))
        return real(targets, share, block, direct, jobs, depth, caps, seconds)

    chosen = {DIRECT_WRITE: Writers(2, 4), BUFFERED_WRITE: Writers(2, 1)}
    ceiling_measure.builtin_write = spy
    try:
        got = ceiling_measure.probe(
            dirs,
            8 * MiB,
            MiB,
            devices.detect("host-emulated"),
            chosen,
            use_fio=False,
            drop=lambda: drops.append(1),
            copy_threads=2,
            keep=keep,
        )
    finally:
        ceiling_measure.builtin_write = real
    assert list(keep) == [8 * MiB]  # the copy buffers, kept for the next probe
    memory.copy_bandwidth(4 * MiB, reps=1, keep=keep)
    assert list(keep) == [4 * MiB]  # one size kept at a time
    memory.release(keep)
    assert keep == {}
    runs = ceiling_measure.PROBE_RUNS
    assert runs >= 2
    assert calls == [
        (2, 4 * MiB, True, 2, 4),
        *[(2, 4 * MiB, False, 2, 1)] * runs,
        *[(2, 4 * MiB, False, 1, 1)] * runs,
    ]
    assert len(drops) == 1 + 2 * runs  # the cache dropped before every run
    assert got.n_targets == 2 and got.file_bytes == 4 * MiB
    for kind, n in ((DIRECT_WRITE, 1), (BUFFERED_WRITE, runs), (BUFFERED_WRITE_1, runs)):
        assert len(got.kinds[kind].runs) == n
        assert got.kinds[kind].Bps == max(got.kinds[kind].runs) > 1e6, kind  # the best run
    assert got.kinds[BUFFERED_WRITE_1].writers == Writers(1, 1)
    # the copy: the median of 3, every run kept; no serialisation in a probe
    assert len(got.kinds[COPY].runs) == 3
    assert got.kinds[COPY].Bps == statistics.median(got.kinds[COPY].runs) > 1e6
    assert set(got.kinds) == {DIRECT_WRITE, BUFFERED_WRITE, BUFFERED_WRITE_1, COPY}
    assert [os.listdir(d) for d in dirs] == [[], []]
    # A chosen buffered configuration of one writer is not measured twice.
    calls.clear()
    chosen[BUFFERED_WRITE] = Writers(1, 1)
    ceiling_measure.builtin_write = spy
    try:
        got = ceiling_measure.probe(
            dirs, 8 * MiB, MiB, devices.detect("host-emulated"), chosen, use_fio=False
        )
    finally:
        ceiling_measure.builtin_write = real
    assert len(calls) == 1 + ceiling_measure.PROBE_RUNS
    assert got.kinds[BUFFERED_WRITE_1] == got.kinds[BUFFERED_WRITE]


def test_drift_between_before_and_after_is_said() -> None:
    before = {"per_ssd_count": {"1": {"direct_write_Bps": 2e9, "buffered_write_Bps": 1e9}}}
    after = {"per_ssd_count": {"1": {"direct_write_Bps": 1e9, "buffered_write_Bps": 1.1e9}}}
    (line,) = Ceilings.from_json(before).drift(Ceilings.from_json(after))
    assert line == (
        "direct write ceiling of 1 target(s) moved from 2.00 GB/s before the sweep "
        "to 1.00 GB/s after"
    )


def test_random_bytes_do_not_compress() -> None:
    import zlib

    b = data.random_bytes(1 << 20, seed=3).tobytes()
    assert len(zlib.compress(b)) >= len(b) and b != data.random_bytes(1 << 20, seed=4).tobytes()


def test_efficiency_of_a_row() -> None:
    """One definition: write = bytes / total_s over the ceiling of the engine's kind of write
    (for the targets it wrote); snapshot = bytes / stall over the copy ceiling."""
    c = Ceilings.from_json(
        {
            "per_ssd_count": {
                "1": {"direct_write_Bps": 2e9, "buffered_write_Bps": 1e9},
                "2": {"direct_write_Bps": 3e9, "buffered_write_Bps": 1.5e9},
            },
            "copy_Bps": 10e9,
        }
    )
    row = {
        "engine": "cpu-single",
        "n_targets": 1,
        "total_bytes": 1e9,
        "total_s": 1.0,
        "persist_s": 0.9,
        "stall_s": 0.1,
    }
    assert rows.efficiency(row, c) == (0.5, 1.0)
    assert rows.efficiency({**row, "n_targets": 2}, c) == (round(1 / 3, 4), 1.0)
    assert rows.efficiency({**row, "engine": "cpu-double"}, c) == (1.0, 1.0)
    # gds stalls until durable: no snapshot; torch-save writes one target whatever n_targets
    assert rows.efficiency({**row, "engine": "gds", "stall_s": 1.0}, c) == (0.5, None)
    ts = {**row, "engine": "torch-save", "persist_s": 0.0, "stall_s": 1.0, "n_targets": 2}
    assert rows.efficiency(ts, c) == (1.0, None)
    # dcp's stall is its staging copy: judged against the copy ceiling too
    assert rows.efficiency({**row, "engine": "dcp", "stall_s": 0.2}, c) == (1.0, 0.5)
    assert rows.efficiency(row, None) == (None, None)
    assert rows.beaten(1.06, None) and not rows.beaten(1.05, float("nan"))


def test_the_csv_is_judged_again_against_the_best_ceilings(tmp_path: Path) -> None:
    """A row written during the sweep was judged against the ceilings before it; at the end the
    CSV is judged again against the best of before, after and the probes (what the summary and
    the report use), in place and atomically. A rank's unjudged row stays unjudged."""
    from analysis import runs
    from bench.measure import efficiency, results

    path = tmp_path / "results.csv"
    before = {
        "per_ssd_count": {
            "1": {"direct_write_Bps": 0.8e9, "buffered_write_Bps": 0.5e9, "direct_read_Bps": 1e9}
        },
        "copy_Bps": 8e9,
    }
    env = {
        "ceilings": before,
        "ceilings_after": {"per_ssd_count": {"1": {"direct_write_Bps": 1.2e9}}},
        "ceilings_probes": [
            {
                "n_targets": 1,
                "copy_Bps": 12e9,
                "buffered_write_Bps": 0.9e9,
                "direct_read_Bps": 2.5e9,
            }
        ],
    }
    base = {c: "" for c in results.COLUMNS}
    gib = float(1 << 30)
    made = []
    for engine, stall, judged in (
        ("cpu-single", 0.1, True),
        ("torch-save", 1.5, True),
        ("cpu-single", 0.1, False),
    ):
        r = {**base, "engine": engine, "n_targets": 1, "total_bytes": int(gib)}
        r.update(total_s=1.5 if engine == "torch-save" else 1.0, stall_s=stall, restore_s=0.5)
        r["ceiling_beaten"] = False
        if judged:
            judge = Ceilings.from_json(before)
            r["write_efficiency"], r["snapshot_efficiency"] = rows.efficiency(r, judge)
            r["restore_efficiency"] = efficiency.restore_efficiency(r, judge, BUILTIN[engine])
            r["ceiling_beaten"] = rows.beaten(
                r["write_efficiency"], r["snapshot_efficiency"], r["restore_efficiency"]
            )
        made.append(r)
    w = results.RowWriter(str(path))
    for r in made:
        w.write(r)
    w.close()
    assert made[0]["ceiling_beaten"]  # 1.34 x the O_DIRECT ceiling before the sweep
    assert efficiency.rejudge_csv(str(path), {}) == 0  # no ceilings: nothing to judge against
    assert efficiency.rejudge_csv(str(path), env) == 2
    df = results.read_rows(str(tmp_path))
    assert df.loc[0, "write_efficiency"] == pytest.approx(round(gib / 1.2e9, 4))
    assert df.loc[0, "snapshot_efficiency"] == pytest.approx(round(gib / 0.1 / 12e9, 4))
    assert df.loc[1, "write_efficiency"] == pytest.approx(round(gib / 1.5 / 0.9e9, 4))
    # the restore too: 2.15 x the read ceiling before the sweep, 0.86 x the probe's
    assert df.loc[0, "restore_efficiency"] == pytest.approx(round(gib / 0.5 / 2.5e9, 4))
    assert pd.isna(df.loc[1, "restore_efficiency"])  # torch-save: no buffered read ceiling
    assert list(df["ceiling_beaten"]) == [False, False, False]
    assert df.loc[2, ["write_efficiency", "snapshot_efficiency"]].isna().all()
    # the same numbers the summary and the report compute from the run
    df["engine"] = df["engine"].astype(str)
    again = runs.add_efficiencies(df.iloc[:2], env)
    assert list(again["write_eff"]) == pytest.approx(list(df.loc[:1, "write_efficiency"]))
    assert again.loc[0, "restore_eff"] == pytest.approx(df.loc[0, "restore_efficiency"])
    assert efficiency.rejudge_csv(str(path), env) == 0  # judged once is judged
    assert not (tmp_path / "results.csv.tmp").exists()


@pytest.mark.alone  # another test's sweep would drop the pages a buffered read brought in
def test_a_read_ceiling_reads_its_files_back_from_the_device(scratch: Path, monkeypatch) -> None:
    """The files a read ceiling reads hold different random bytes in every block, none of them
    in the page cache; an O_DIRECT read brings none of them into it, a buffered one brings
    them in and the next run evicts them again before it reads."""
    dirs = _dirs(scratch, 2)
    files = data.make_read_files(dirs, 4 * MiB, MiB)
    try:
        blocks = [Path(f).read_bytes() for f in files]
        timers.evict_files(files)
        assert timers.resident_bytes(files) == 0
        chunks = {b[i : i + MiB] for b in blocks for i in range(0, 4 * MiB, MiB)}
        assert len(chunks) == 8 and all(len(b) == 4 * MiB for b in blocks)
        assert builtin.builtin_read(files, 4 * MiB, MiB, True, 1, 2) > 0
        assert timers.resident_bytes(files) == 0  # O_DIRECT: the device, not the cache
        assert builtin.builtin_read(files, 4 * MiB, MiB, False, 2, 1) > 0
        assert timers.resident_bytes(files) > 0  # buffered: the pages came in ...
        before_first_read: list[int] = []
        real, lock = odirect.pread_into, threading.Lock()

        def spy(fd: int, view: memoryview, offset: int) -> None:
            with lock:  # the first read of any thread looks first
                if not before_first_read:
                    before_first_read.append(timers.resident_bytes(files))
            real(fd, view, offset)

        monkeypatch.setattr(odirect, "pread_into", spy)
        builtin.builtin_read(files, 4 * MiB, MiB, False, 1, 1)
        assert before_first_read == [0]  # ... and the next run evicted them before it read
    finally:
        data.remove_files(files)


def test_without_reads_no_read_ceiling_is_measured(scratch: Path) -> None:
    """`ceilings.reads: false`: the write ceilings alone, as many runs as storage_runs says."""
    out = _builtin_once(_dirs(scratch, 1), [1], 4 * MiB, reads=False)
    assert set(out.counts[1].kinds) == {DIRECT_WRITE, BUFFERED_WRITE}
    assert out.at(DIRECT_READ, 1) is None and out.at(H2D) is None  # no CUDA here either
    host = devices.detect("host-emulated")
    both = Options(targets=["t"], ssd_counts=[1], checkpoint_bytes=MiB, block=MiB, device=host)
    assert dataclasses.replace(both, reads=False).storage_runs() * 2 == both.storage_runs()


def test_a_restore_is_judged_against_its_kind_of_read() -> None:
    """restore = bytes / restore_s over the read ceiling of the engine's kind of read (O_DIRECT
    for cpu-single and gds, a cold buffered read for the page-cache paths), for the targets it
    read; beyond 1.05 the ceiling is in question, as for writes."""
    c = Ceilings.from_json(
        {
            "per_ssd_count": {
                "1": {"direct_read_Bps": 2e9, "buffered_read_Bps": 1e9},
                "2": {"direct_read_Bps": 4e9, "buffered_read_Bps": 1.6e9},
            },
        }
    )
    row = {"engine": "cpu-single", "n_targets": 2, "total_bytes": 1e9, "restore_s": 0.5}
    judge = efficiency.restore_efficiency
    assert judge(row, c, BUILTIN["cpu-single"]) == 0.5
    assert judge(row, c, BUILTIN["gds"]) == 0.5
    assert judge(row, c, BUILTIN["cpu-double"]) == 1.25  # a finding about the ceiling
    assert judge(row, c, BUILTIN["torch-save"]) == 2.0  # one file, one target's ceiling
    assert judge({**row, "restore_s": None}, c, BUILTIN["cpu-single"]) is None
    assert judge(row, None, BUILTIN["cpu-single"]) is None
    no_reads = Ceilings.from_json({"per_ssd_count": {"2": {"direct_write_Bps": 2e9}}})
    assert judge(row, no_reads, BUILTIN["cpu-single"]) is None
    assert rows.beaten(None, 0.5, 1.25) and not rows.beaten(0.9, 0.5, 1.0)


# -- failures: an open that fails, fio failing or talking before its JSON -------------------------


def _ceiling_fds() -> list[str]:
    """The files of a ceiling probe this process holds open."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile (listdir's own descriptor)
            continue
        if ".ckptbench-ceiling-" in target:
            out.append(target)
    return out


def test_builtin_write_closes_and_removes_what_it_opened_when_an_open_fails(
    scratch: Path, monkeypatch
) -> None:
    """The second target's file cannot be opened (EMFILE, as when descriptors run out): the
    first one's descriptor is closed and both files are removed before the error goes up."""
    import errno

    dirs = _dirs(scratch, 2)
    real = os.open
    opened: list[str] = []

    def open_(path, flags, *a):  # type: ignore[no-untyped-def]
        if ".ckptbench-ceiling-" in str(path) and not flags & os.O_CREAT:
            opened.append(path)
            if len(opened) == 2:
                raise OSError(errno.EMFILE, "Too many open files", path)
        return real(path, flags, *a)

    monkeypatch.setattr(builtin.os, "open", open_)
    with pytest.raises(OSError) as e:
        builtin.builtin_write(dirs, 8 * MiB, MiB, True, 1, 2)
    monkeypatch.setattr(builtin.os, "open", real)
    assert e.value.errno == errno.EMFILE and len(opened) == 2
    assert _ceiling_fds() == []
    assert [os.listdir(d) for d in dirs] == [[], []]


FAKE_FIO = """#!{python}
# A stand-in for fio (not installed on every machine the tests run on): records its arguments,
# answers as fio does (a warning line, then the JSON report), or fails as fio does.
import json, os, sys

state = os.environ["FAKE_FIO_STATE"]
with open(os.path.join(state, "mode")) as f:
    mode, runtime_ms = f.read().split()
if sys.argv[1:] == ["--version"]:
    print("fio-3.99")
    sys.exit(0)
with open(os.path.join(state, "calls"), "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
if mode == "fail":
    print("fio: pid=1, err=22/file:filesetup.c:805, func=open, error=Invalid argument",
          file=sys.stderr)
    sys.exit(1)
jobs, size, numjobs, rw = 0, 0, 0, "write"
for a in sys.argv[1:]:
    if a.startswith("--name="):
        jobs += 1
    elif a.startswith("--size="):
        size = int(a.split("=")[1])
    elif a.startswith("--numjobs="):
        numjobs = int(a.split("=")[1])
    elif a.startswith("--rw="):
        rw = a.split("=")[1]
print("fio: this warning comes before the report")
# fio reports both directions of every job; the one it did not do moved nothing.
did = {{"io_bytes": jobs * numjobs * size, "runtime": int(runtime_ms)}}
idle = {{"io_bytes": 0, "runtime": 0}}
print(json.dumps({{"jobs": [{{d: did if d == rw else idle for d in ("read", "write")}}]}}))
"""


@pytest.fixture
def fake_fio(tmp_path: Path, monkeypatch) -> Any:
    """`fio` on PATH is the stand-in above; `set(mode, runtime_ms)` says how it answers next,
    `calls()` the argument lists it was run with."""
    import sys

    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    exe = bin_dir / "fio"
    exe.write_text(FAKE_FIO.format(python=sys.executable))
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ.get('PATH', '')}")
    monkeypatch.setenv("FAKE_FIO_STATE", str(state))

    class Fio:
        @staticmethod
        def set(mode: str, runtime_ms: int = 250) -> None:
            (state / "mode").write_text(f"{mode} {runtime_ms}")

        @staticmethod
        def calls() -> list[list[str]]:
            path = state / "calls"
            return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []

    Fio.set("ok")
    return Fio


def test_fio_reads_the_files_it_is_given_from_a_cold_cache(scratch: Path, fake_fio) -> None:
    """A read ceiling's fio run reads the files made for it (each reader its own part), drops
    their pages first (`invalidate`), syncs nothing and leaves the files to their maker."""
    dirs = _dirs(scratch, 2)
    files = data.make_read_files(dirs, 8 * MiB, MiB)
    try:
        fake_fio.set("ok", 500)
        assert fio.fio_read(files, 8 * MiB, MiB, True, 2, 8) == 16 * MiB / 0.5
        (args,) = fake_fio.calls()
        assert [a.split("=", 1)[1] for a in args if a.startswith("--filename=")] == files
        assert "--rw=read" in args and "--invalidate=1" in args and "--direct=1" in args
        assert "--end_fsync=1" not in args and "--size=4194304" in args
        assert all(os.path.exists(f) for f in files)
    finally:
        data.remove_files(files)


def test_fio_write_reads_fios_report_after_its_chatter(scratch: Path, fake_fio) -> None:
    """Bandwidth = io_bytes / runtime of fio's JSON, whatever fio printed before it."""
    dirs = _dirs(scratch, 2)
    fake_fio.set("ok", 250)
    assert fio.fio_version() == "fio-3.99"
    bw = fio.fio_write(dirs, 8 * MiB, MiB, True, 2, 8)
    # 2 targets x 2 writers x 4 MiB each, in 0.25 s
    assert bw == 16 * MiB / 0.25
    (args,) = fake_fio.calls()
    files = [a.split("=", 1)[1] for a in args if a.startswith("--filename=")]
    assert [os.path.dirname(f) for f in files] == dirs
    assert [os.listdir(d) for d in dirs] == [[], []]  # its files removed after


@pytest.mark.parametrize("use_fio", [True, False], ids=["fio", "builtin"])
def test_measure_asks_fio_its_version_once(
    scratch: Path, monkeypatch, fake_fio, use_fio: bool
) -> None:
    """fio's version picks the tool and is recorded beside it, whichever tool runs: one fio
    process asked, not one per use. The options are frozen: the caller's lists became tuples."""
    dirs = _dirs(scratch, 1)
    fake_fio.set("ok", 2)
    asked: list[str | None] = []

    def version() -> str | None:
        asked.append(fio.fio_version())
        return asked[-1]

    monkeypatch.setattr(ceiling_measure, "fio_version", version)
    options = Options(
        targets=dirs,
        ssd_counts=[1],
        checkpoint_bytes=8 * MiB,
        block=MiB,
        device=devices.detect("host-emulated"),
        use_fio=use_fio,
        repetitions=1,
        min_bytes=8 * MiB,
        tensor_bytes=MiB,
        grids={DIRECT_WRITE: [(1, 2)], BUFFERED_WRITE: [(1, 1)]},
    )
    assert options.targets == tuple(dirs) and options.ssd_counts == (1,)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.repetitions = 2  # type: ignore[misc]
    out = ceiling_measure.measure(options)
    assert asked == ["fio-3.99"]
    assert (out.method.tool, out.method.fio) == ("fio-3.99" if use_fio else "builtin", "fio-3.99")
    assert len(fake_fio.calls()) == (options.storage_runs() if use_fio else 0)


def test_fio_failing_is_a_runtime_error_with_its_words(scratch: Path, fake_fio) -> None:
    dirs = _dirs(scratch, 2)
    fake_fio.set("fail")
    with pytest.raises(RuntimeError) as e:
        fio.fio_write(dirs, 8 * MiB, MiB, True, 2, 8)
    assert str(e.value) == (
        "fio failed: fio: pid=1, err=22/file:filesetup.c:805, func=open, error=Invalid argument"
    )
    assert [os.listdir(d) for d in dirs] == [[], []]


# -- the sweep's handling of the ceilings: no fio, a probe that fails, a disk that drifts ------


def _sweep_config(scratch: Path, **ceilings: Any) -> config.Config:
    return config.from_dict(_sweep_raw(scratch, **ceilings))


def _sweep_raw(scratch: Path, **ceilings: Any) -> dict[str, Any]:
    (scratch / "t0").mkdir(exist_ok=True)
    return {
        "name": "ceil",
        "host_baseline_s": QUICK_BASELINE_S,
        "engines": ["cpu-double"],
        "total_sizes": ["8MiB"],
        "tensor_sizes": ["1MiB"],
        "targets": [str(scratch / "t0")],
        "repetitions": 1,
        "warmups": 0,
        "engine_options": {"cpu-double": {"chunk_bytes": "1MiB"}},
        "ceilings": {
            "min_bytes": "8MiB",
            "repetitions": 1,
            "direct_search": [[2, 8]],
            "buffered_jobs": [1],
            "after": True,
            "probes": False,
            **ceilings,
        },
    }


def _run_sweep(cfg: config.Config, scratch: Path, monkeypatch) -> tuple[Any, dict]:
    from bench.measure import timers as measure
    from bench.run.sweep import Sweep

    monkeypatch.setattr(measure, "drop_page_cache", lambda: "not dropped in this test")
    r = Sweep(cfg, devices.detect("host-emulated"), str(scratch / "results"), quiet=True)
    run_dir = r.run()
    return r, json.loads((Path(run_dir) / "env.json").read_text())


def test_ceilings_tool_fio_without_fio_is_a_user_error(scratch: Path, monkeypatch, capsys) -> None:
    from bench import cli

    empty = scratch / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert fio.fio_version() is None
    cfg = scratch / "c.yaml"
    cfg.write_text(json.dumps(_sweep_raw(scratch, tool="fio")))  # JSON is YAML
    capsys.readouterr()
    assert cli.main(["run", str(cfg), "-q", "-o", str(scratch / "results")]) == 2
    assert capsys.readouterr().err == (
        "ckptbench: error: ceilings.tool: fio is not installed (apt-get install fio, or use auto)\n"
    )


def test_a_probe_that_fails_is_noted_and_the_sweep_goes_on(scratch: Path, monkeypatch, fake_fio):
    """fio fails in the probe between the workloads (it ran fine before the sweep): a note
    names the workload and fio's words; the rows are all there."""
    cfg = _sweep_config(scratch, tool="fio", probes=True, after=False)
    real = ceiling_measure.probe

    def probe(*a: Any, **k: Any) -> dict:
        fake_fio.set("fail")
        return real(*a, **k)

    monkeypatch.setattr(ceiling_measure, "probe", probe)
    r, env = _run_sweep(cfg, scratch, monkeypatch)
    assert r.failures == 0
    assert len(results_rows(r.run_dir)) == 1
    assert "ceilings_probes" not in env
    assert env["ceilings"]["tool"] == "fio-3.99"
    assert (
        "the probe of synthetic-8MiB-1MiB over 1 target(s) failed: fio failed: fio: pid=1, "
        "err=22/file:filesetup.c:805, func=open, error=Invalid argument"
    ) in env["notes"]


def test_a_disk_that_drifted_during_the_sweep_is_noted(scratch: Path, monkeypatch, fake_fio):
    """fio reports twice the runtime after the sweep: every storage ceiling halves, the reads
    as the writes, and the notes say by how much, in GB/s computed here from what fio
    reported."""
    cfg = _sweep_config(scratch, tool="fio")
    fake_fio.set("ok", 2)
    real = ceiling_measure.measure
    calls: list[int] = []

    def measure(*a: Any, **k: Any) -> dict:
        calls.append(1)
        if len(calls) == 2:  # the ceilings after the sweep
            fake_fio.set("ok", 4)
        return real(*a, **k)

    monkeypatch.setattr(ceiling_measure, "measure", measure)
    _, env = _run_sweep(cfg, scratch, monkeypatch)
    assert len(calls) == 2
    # 8 MiB over 1 target: O_DIRECT by 2 writers of 4 MiB, page cache by 1 writer of 8 MiB
    before, after = 8 * MiB / 0.002 / 1e9, 8 * MiB / 0.004 / 1e9
    drifted = [n for n in env["notes"] if n.startswith("the disk drifted")]
    assert drifted == [  # env.json keeps its notes sorted
        f"the disk drifted during the run: {kind} ceiling of 1 target(s) moved from "
        f"{before:.2f} GB/s before the sweep to {after:.2f} GB/s after; efficiencies use the "
        "run's best ceiling"
        for kind in ("buffered read", "buffered write", "direct read", "direct write")
    ]


def results_rows(run_dir: str | None) -> list[dict]:
    import csv

    assert run_dir
    with open(os.path.join(run_dir, "results.csv"), newline="") as f:
        return list(csv.DictReader(f))
