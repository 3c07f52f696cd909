"""Device ceilings (bench.ceiling): the storage probes write real files and clean up, honour
write caps, repeat and keep every run; rows get their efficiencies from them."""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import pytest

from bench import ceiling, devices, odirect, rows

MiB = 1 << 20
WRITERS = [ceiling.builtin_write] + ([ceiling.fio_write] if ceiling.fio_version() else [])


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
def test_probe_writes_and_removes_its_files(scratch: Path, write, direct: bool) -> None:
    dirs = _dirs(scratch, 2)
    bw = write(dirs, 8 * MiB, MiB, direct, 4)
    # A real write of 2 x 8 MiB to durability: positive and below any memory bandwidth.
    assert 1e6 < bw < 200e9
    assert [os.listdir(d) for d in dirs] == [[], []]


@pytest.mark.parametrize("write", WRITERS, ids=lambda w: w.__name__)
def test_probe_honours_write_caps(scratch: Path, write) -> None:
    """Two targets capped at 16 MB/s each, 8 MiB each: about 32 MB/s in all, never faster."""
    dirs = _dirs(scratch, 2)
    cap = 16_000_000
    t0 = time.perf_counter()
    bw = write(dirs, 8 * MiB, MiB, True, 2, [cap, cap])
    elapsed = time.perf_counter() - t0
    assert bw <= 2 * cap * 1.15
    assert bw >= 2 * cap * 0.5  # the disk is far faster than the cap here
    assert elapsed >= 8 * MiB / cap * 0.8


def test_measure_repeats_and_takes_the_median(scratch: Path) -> None:
    dirs = _dirs(scratch, 2)
    drops = []
    out = ceiling.measure(
        dirs,
        [1, 2],
        8 * MiB,
        MiB,
        4,
        devices.detect("host-emulated"),
        use_fio=False,
        drop=lambda: drops.append(1),
        repetitions=3,
    )
    assert out["tool"] == "builtin" and out["repetitions"] == 3 and out["block_bytes"] == MiB
    assert set(out["per_ssd_count"]) == {"1", "2"}
    for row in out["per_ssd_count"].values():
        for mode in ("direct_write", "buffered_write"):
            runs = row[f"{mode}_runs"]
            assert len(runs) == 3 and all(r > 0 for r in runs)
            assert row[f"{mode}_Bps"] == pytest.approx(statistics.median(runs), rel=1e-6)
    assert len(drops) == 2 * 2 * 3  # the page cache is dropped before every storage run
    assert out["copy_Bps"] > 1e8 and "d2h_Bps" not in out
    assert len(out["copy_runs"]) == 5
    assert out["copy_Bps"] == pytest.approx(statistics.median(out["copy_runs"]), rel=1e-3)


def test_efficiency_of_a_row() -> None:
    c = {
        "per_ssd_count": {"1": {"direct_write_Bps": 2e9, "buffered_write_Bps": 1e9}},
        "copy_Bps": 10e9,
    }
    row = {
        "engine": "cpu-single",
        "n_targets": 1,
        "total_bytes": 1e9,
        "total_s": 1.0,
        "persist_s": 0.9,
        "stall_s": 0.1,
    }
    # persist 1e9 / 0.9 s over 2 GB/s; snapshot 1e9 / 0.1 s over 10 GB/s
    assert rows.efficiency(row, c) == (round(1 / 0.9 / 2, 4), 1.0)
    row = {**row, "engine": "cpu-double"}
    assert rows.efficiency(row, c) == (round(1 / 0.9, 4), 1.0)
    # gds and torch-save are synchronous: persist over total_s, no snapshot
    row = {**row, "engine": "torch-save", "persist_s": 0.0, "stall_s": 1.0}
    assert rows.efficiency(row, c) == (1.0, None)
    assert rows.efficiency({**row, "n_targets": 2}, c) == (None, None)
    assert rows.efficiency(row, None) == (None, None)
