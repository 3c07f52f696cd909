"""Checks that depend on how fast this machine is, kept out of `make test` (`make perf` runs
them): the wall-clock rate of a token bucket, four capped targets against one, the ceiling
probes under caps, and how much page cache a save of cpu-single and cpu-double grows.

`make test` checks the same mechanisms by order and exact arithmetic (a frozen clock for the
bucket, a bucket per target, a gate in the write path, mincore on the checkpoint's own files);
these say whether the numbers come out as they should on an idle machine, and can miss on a
busy one. They use the fixtures of tests/conftest.py (scratch space, targets, engines).
"""

from __future__ import annotations

import csv
import os
import statistics
import threading
import time
from pathlib import Path

import pytest

from bench.common import devices
from bench.config import sweep as config
from bench.measure import timers as measure
from bench.measure.ceilings.builtin import builtin_write
from bench.measure.ceilings.fio import fio_version, fio_write
from bench.run.sweep import Sweep
from bench.storage import odirect
from bench.storage.pacing import TokenBucket
from bench.storage.verify import first_difference
from bench.workloads import synthetic_state

MiB = 1 << 20


def test_token_bucket_paces_many_threads_to_its_rate() -> None:
    b = TokenBucket(200e6, 2 * MiB)
    t0 = time.perf_counter()

    def work() -> None:
        for _ in range(10):
            b.take(2 * MiB)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rate = 80 * MiB / (time.perf_counter() - t0)
    assert 0.8 * 200e6 < rate < 1.15 * 200e6


def test_four_capped_targets_scale_like_four_slow_ssds(make_engine, targets) -> None:
    """With caps far below the disk's speed, 4 targets persist ~4x faster than 1."""
    state = synthetic_state(16 * MiB, MiB, seed=1)
    speeds = {}
    for n in (1, 4):
        eng = make_engine("cpu-single", targets(n), max_write_bw="20MB/s", chunk_bytes="1MiB")
        res = eng.save(state, "c").wait()
        speeds[n] = res.bytes / res.persist_s
        assert first_difference(state, eng.load("c")) is None
    assert speeds[1] < 1.15 * 20e6
    assert speeds[4] / speeds[1] > 3.3, speeds


def test_probe_honours_write_caps(scratch: Path) -> None:
    """Two targets capped at 16 MB/s each, 8 MiB each: about 32 MB/s in all, never faster."""
    dirs = []
    for i in range(2):
        d = scratch / f"t{i}"
        d.mkdir()
        dirs.append(str(d))
    if odirect.probe(dirs[0]):
        pytest.skip(f"scratch refuses O_DIRECT: {odirect.probe(dirs[0])}")
    cap = 16_000_000
    writers = [builtin_write] + ([fio_write] if fio_version() else [])
    for write in writers:
        t0 = time.perf_counter()
        bw = write(dirs, 8 * MiB, MiB, True, 1, 2, [cap, cap])
        elapsed = time.perf_counter() - t0
        assert bw <= 2 * cap * 1.15
        assert bw >= 2 * cap * 0.5  # the disk is far faster than the cap here
        assert elapsed >= 8 * MiB / cap * 0.8


def test_cpu_single_bypasses_the_page_cache(scratch: Path, monkeypatch) -> None:
    """System-wide `Cached` growth during the saves: any other process's reads and writes count
    too, so this belongs on a quiet machine (make test checks the checkpoint's own pages)."""
    monkeypatch.setattr(measure, "drop_page_cache", lambda: "not dropped in this test")
    (scratch / "t0").mkdir()
    raw = {
        "name": "pagecache",
        "engines": ["cpu-single", "cpu-double"],
        "total_sizes": ["256MiB"],
        "tensor_sizes": ["64MiB"],
        "ssd_counts": [1],
        "targets": [str(scratch / "t0")],
        "repetitions": 2,
        "warmups": 1,
        "ceilings": {"enabled": False},
        "engine_options": {"cpu-single": {"checksums": True}, "cpu-double": {"checksums": True}},
    }
    r = Sweep(
        config.from_dict(raw), devices.detect("host-emulated"), str(scratch / "results"), quiet=True
    )
    with open(os.path.join(r.run(), "results.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    assert r.failures == 0 and len(rows) == 6

    def median(engine: str, col: str) -> float:
        vals = [float(x[col]) for x in rows if x["engine"] == engine and x["warmup"] == "False"]
        return statistics.median(vals)

    total = 256 * MiB
    assert median("cpu-single", "page_cache_peak_bytes") < 0.10 * total
    assert median("cpu-double", "page_cache_peak_bytes") > 0.50 * total
    assert median("cpu-single", "stall_s") < 0.5 * median("cpu-single", "total_s")
