"""Bounded staging (a ring of K chunks) and write-bandwidth caps per target (token buckets)."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

from bench.common.errors import UserError
from bench.config import sweep as config
from bench.storage import layout, pacing
from bench.storage.pacing import TokenBucket
from bench.storage.verify import first_difference
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
def test_ring_round_trips_with_k_chunks_of_memory(make_engine, targets, monkeypatch, engine, k):
    dirs = targets(3)
    eng = make_engine(engine, dirs, staging_chunks=k, chunk_bytes="1MiB")
    state = _state()
    # With the writes held, save() cannot return: 40 MiB do not fit in k chunks, so the copy
    # must wait for a slot's write. (A ring that buffered more than k chunks would return;
    # the grace gives it the time to, a correct one waits for the gate whatever the grace.)
    held, gate = threading.Event(), threading.Event()
    real = layout.write_piece

    def write_piece(fd: int, piece: layout.Piece, o_direct: bool) -> None:
        held.set()
        assert gate.wait(60), "the gate was never opened"
        real(fd, piece, o_direct)

    monkeypatch.setattr(layout, "write_piece", write_piece)
    got: list = []
    saving = threading.Thread(
        target=lambda: got.append((eng.save(state, "r"), time.perf_counter()))
    )
    saving.start()
    assert held.wait(60)
    saving.join(0.5)
    opened_at = time.perf_counter()
    gate.set()
    saving.join(60)
    pending, returned_at = got[0]
    assert returned_at >= opened_at, "save() returned with more than k chunks unwritten"
    res = pending.wait()
    monkeypatch.setattr(layout, "write_piece", real)
    assert res.pinned_bytes == eng.pinned_bytes == k * MiB
    assert res.copied_tensors == 1  # the transposed tensor
    assert res.stall_s >= returned_at - opened_at
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


class FrozenClock:
    """bench.storage.pacing's clock, stopped: `sleep` records what was asked and lets no time pass, so
    what a bucket makes each writer wait is worked out exactly, however busy the machine is."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []
        self._lock = threading.Lock()

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        with self._lock:
            self.slept.append(s)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FrozenClock:
    c = FrozenClock()
    monkeypatch.setattr(pacing, "time", c)
    return c


def test_token_bucket_paces_many_threads_to_its_rate(clock: FrozenClock) -> None:
    """40 writes of 2 MiB from 4 threads at 200 MB/s with a 2 MiB burst, all asked for at one
    instant: whatever order the threads take the lock in, the k-th write (k = 1..40) waits
    k x 2 MiB / rate less the burst, so the last one ends (80 - 2) MiB / rate after the start."""
    rate, piece = 200e6, 2 * MiB
    b = TokenBucket(rate, piece)

    def work() -> None:
        for _ in range(10):
            b.take(piece)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    want = [k * piece / rate - piece / rate for k in range(2, 41)]  # the first is the burst
    assert sorted(clock.slept) == pytest.approx(want, rel=1e-9)
    assert max(clock.slept) == pytest.approx((80 - 2) * MiB / rate, rel=1e-9)


def test_token_bucket_credits_idle_time_up_to_one_burst(clock: FrozenClock) -> None:
    rate, burst = 100e6, 4 * MiB
    b = TokenBucket(rate, burst)
    b.take(burst)  # the burst: no wait
    b.take(MiB)  # beyond it: MiB / rate
    assert clock.slept == pytest.approx([MiB / rate], rel=1e-9)
    clock.now += 10.0  # idle for far longer than a burst takes
    b.take(burst)  # earned back one burst, not 10 s worth
    b.take(MiB)
    assert clock.slept == pytest.approx([MiB / rate, MiB / rate], rel=1e-9)
    with pytest.raises(ValueError, match="rate must be positive, got 0"):
        TokenBucket(0, burst)


def test_capped_targets_each_pace_their_own_writes(make_engine, targets, monkeypatch):
    """max_write_bw paces each target by a bucket of its own: every byte written to target i
    is taken from bucket i, at the cap given for it (one cap for all, or one per target). Four
    capped targets then write like four slow SSDs; how fast that is on this disk is a matter
    for `make perf` (tests/perf/bench_timing.py)."""
    state = synthetic_state(16 * MiB, MiB, seed=1)
    taken: dict[int, list[tuple[float, int]]] = {}
    real = TokenBucket.take

    def take(self: TokenBucket, n: int) -> None:
        taken.setdefault(id(self), []).append((self.rate, n))
        real(self, n)

    monkeypatch.setattr(TokenBucket, "take", take)
    for caps, n in (("200MB/s", 1), ("200MB/s", 4), (["100MB/s", "200MB/s", "300MB/s"], 3)):
        taken.clear()
        dirs = targets(n)
        eng = make_engine("cpu-single", dirs, max_write_bw=caps, chunk_bytes="1MiB")
        eng.save(state, "c").wait()
        assert first_difference(state, eng.load("c")) is None
        buckets = eng.writer.buckets
        assert len({id(b) for b in buckets}) == n  # one bucket per target
        want_rates = [200e6] * n if isinstance(caps, str) else [100e6, 200e6, 300e6]
        assert [b.rate for b in buckets] == want_rates
        files = eng.cached_files("c")
        for b, f in zip(buckets, files, strict=True):
            got = taken[id(b)]
            assert {r for r, _ in got} == {b.rate}
            # every byte of the target's file went through its bucket
            assert sum(k for _, k in got) == os.path.getsize(f)


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
