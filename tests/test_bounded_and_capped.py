"""Bounded staging (a ring of K chunks) and write-bandwidth caps per target (token buckets)."""

from __future__ import annotations

import time

import pytest
import torch

from bench import config
from bench.errors import UserError
from bench.pacing import TokenBucket
from bench.verify import first_difference
from bench.workloads import synthetic_state

MiB = 1 << 20


def _state() -> dict:
    s = synthetic_state(40 * MiB, 3 * MiB + 4, dtype=torch.uint8, seed=3)
    s["nc"] = torch.arange(4096 * 3, dtype=torch.float64).reshape(3, 4096).t()
    s["empty"] = torch.empty(0, 5)
    s["scalar"] = torch.tensor(2.5, dtype=torch.bfloat16)
    return s


@pytest.mark.parametrize("engine", ["cpu-single", "cpu-double"])
@pytest.mark.parametrize("k", [1, 3])
def test_ring_round_trips_with_k_chunks_of_memory(make_engine, targets, engine, k):
    dirs = targets(3)
    eng = make_engine(engine, dirs, staging_chunks=k, chunk_bytes="1MiB")
    state = _state()
    res = eng.save(state, "r").wait()
    assert res.pinned_bytes == eng.pinned_bytes == k * MiB
    assert res.copied_tensors == 1  # the transposed tensor
    assert res.stall_s <= res.total_s
    assert first_difference(state, eng.load("r")) is None
    # A second save reuses the ring (no growth) and replaces the first.
    state2 = _state()
    state2["scalar"] = torch.tensor(-1.0, dtype=torch.bfloat16)
    res2 = eng.save(state2, "r").wait()
    assert not res2.staging_grew
    assert first_difference(state2, eng.load("r")) is None


def test_ring_and_whole_state_write_the_same_files(make_engine, targets):
    state = _state()
    ring = make_engine("cpu-single", targets(2), staging_chunks=2, chunk_bytes="1MiB")
    whole = make_engine("cpu-single", targets(2), chunk_bytes="1MiB")
    ring.save(state, "x").wait()
    whole.save(state, "x").wait()
    for a, b in zip(ring.cached_files("x"), whole.cached_files("x"), strict=True):
        with open(a, "rb") as fa, open(b, "rb") as fb:
            da, db = fa.read(), fb.read()
        # The same layout; only the padding between tensors may differ.
        assert len(da) == len(db)
    assert first_difference(ring.load("x"), whole.load("x")) is None


def test_bad_staging_chunks(make_engine, targets):
    with pytest.raises(
        UserError,
        match=r"^engine cpu-single: staging_chunks: Input should be greater than or equal to 0, got -2$",
    ):
        make_engine("cpu-single", targets(1), staging_chunks=-2)


def test_token_bucket_paces_many_threads_to_its_rate():
    import threading

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


def test_four_capped_targets_scale_like_four_slow_ssds(make_engine, targets):
    """With caps far below the disk's speed, 4 targets persist ~4x faster than 1. The caps are
    low enough (4 x 20 MB/s) that a disk slowed by other work still outruns them."""
    state = synthetic_state(16 * MiB, MiB, seed=1)
    speeds = {}
    for n in (1, 4):
        eng = make_engine("cpu-single", targets(n), max_write_bw="20MB/s", chunk_bytes="1MiB")
        res = eng.save(state, "c").wait()
        speeds[n] = res.bytes / res.persist_s
        assert first_difference(state, eng.load("c")) is None
    assert speeds[1] < 1.15 * 20e6
    assert speeds[4] / speeds[1] > 3.3, speeds


def test_caps_in_config(tmp_path):
    cfg = config.from_dict(
        {
            "engines": ["cpu-single"],
            "total_sizes": ["8MiB"],
            "tensor_sizes": ["1MiB"],
            "targets": ["a", {"path": "b", "max_write_bw": "1GB/s"}, "c"],
            "max_write_bw": "400MB/s",
            "ssd_counts": [3],
        }
    )
    assert cfg.target_caps() == [400_000_000, 1_000_000_000, 400_000_000]
    with pytest.raises(
        UserError, match=r"targets\.1\.max_write_bw: cannot read '1 furlong/s' as a bandwidth"
    ):
        config.from_dict(
            {
                "engines": ["cpu-single"],
                "total_sizes": ["8MiB"],
                "tensor_sizes": ["1MiB"],
                "targets": ["a", {"path": "b", "max_write_bw": "1 furlong/s"}],
            }
        )
