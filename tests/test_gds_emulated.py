"""gds's host emulation (bench/engines/gds/emulated.py) and the pinned host memory the device
paths use: the bounce buffers, staging pinned to the byte and given back, and cpu-single's
restore into device memory through its staging ring.

The engine runs over FakeKvikio and FakeCuda (tests/fake_kvikio.py), which follow kvikio's
real contracts; its fixtures and sample states are in tests/conftest.py.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from conftest import (
    FAKE_CUDA_DEVICE,
    assert_same_state,
    mixed_state,
    read_manifest,
    sample_state,
)

from bench.common.errors import ChecksumError
from bench.engines import gds
from bench.measure.ceilings import memory
from bench.storage import staging


def test_auto_on_the_host_emulates_without_kvikio(make_engine, targets, monkeypatch):
    def must_not_be_called() -> Any:
        raise AssertionError("io=auto on the host must not use kvikio")

    monkeypatch.setattr(gds.kvikio_lib, "import_kvikio", must_not_be_called)
    eng = make_engine("gds", targets(1), io="auto", device="host-emulated")
    state = sample_state()
    assert eng.save(state, "ckpt").wait().gds_mode == "emulated"
    assert_same_state(eng.load("ckpt"), state)


def test_emulation_on_cuda_writes_through_a_pinned_bounce_buffer(
    make_engine, targets, fake_cuda, fake_cudart
):
    eng = make_engine(
        "gds", targets(2), io="emulated", device="cuda", chunk_bytes="8KiB", threads_per_target=1
    )
    state = mixed_state(fake_cuda)
    result = eng.save(state, "ckpt").wait()
    assert result.gds_mode == "emulated"
    assert_same_state(eng.load("ckpt"), state)
    # One bounce buffer per writer thread, pinned exactly, released with the engine.
    assert 0 < result.pinned_bytes == fake_cudart.locked_bytes <= 2 * (8192 + 2 * 4096)
    eng.close()
    assert fake_cudart.locked == {}


def test_pinned_staging_is_exactly_the_bytes_held(fake_cudart):
    """torch's pin_memory rounds a request up to a power of two and caches freed blocks; the
    staging buffer pins exactly what it holds, and releases it."""
    s = staging.Staging(FAKE_CUDA_DEVICE)
    n = (10 << 20) + 4096
    assert s.ensure(n)
    assert s.pinned_bytes == n == fake_cudart.locked_bytes
    assert list(fake_cudart.locked) == [s.array.ctypes.data]
    assert s.tensor.numel() == n
    assert not s.ensure(n - 1)  # reused
    assert s.ensure(n + 1)  # grown: the old range unpinned, the new one pinned
    assert fake_cudart.locked_bytes == s.pinned_bytes == n + 4096
    s.release()
    assert fake_cudart.locked == {} and s.pinned_bytes == 0


def test_copy_ceiling_releases_what_it_pinned(fake_cudart):
    runs = memory.d2h_bandwidth(1 << 20, FAKE_CUDA_DEVICE, reps=2)
    assert len(runs) == 2 and min(runs) > 0
    assert [c[0] for c in fake_cudart.calls] == ["register", "unregister"]
    assert fake_cudart.calls[0][2] == 1 << 20
    assert fake_cudart.locked == {}


def test_snapshot_engine_pins_its_staging_exactly(make_engine, targets, fake_cudart, fake_cuda):
    eng = make_engine("cpu-single", targets(2), device="cuda", chunk_bytes="8KiB")
    state = sample_state()
    eng.warm(state)
    result = eng.save(state, "ckpt").wait()
    assert result.pinned_bytes == eng.pinned_bytes == fake_cudart.locked_bytes > 0
    assert_same_state(eng.load("ckpt"), state)
    eng.close()
    assert fake_cudart.locked == {}


def test_cpu_single_restores_to_the_device_through_its_staging_ring(
    make_engine, targets, fake_cuda, fake_cudart
):
    """cpu-single restores to a CUDA device with O_DIRECT chunk by chunk through its pinned
    staging, each chunk's host-to-device copy queued (its slot reused only once the copy's event
    is waited on: the fake runs a copy no earlier), into one device buffer; in place into device
    tensors, a strided one included; a flipped byte is caught, naming tensor and file."""
    # 2 reads in flight per target: a ring of 2 x 2 + 1 chunks, within the staging it reuses
    eng = make_engine(
        "cpu-single", targets(2), device="cuda", chunk_bytes="8KiB", read_threads_per_target=2
    )
    state = sample_state()
    eng.save(state, "ckpt").wait()
    pinned = fake_cudart.locked_bytes
    got = eng.load("ckpt", device="cuda")
    assert_same_state(got, state)
    assert all(fake_cuda.is_device(t) for t in got.values() if t.numel())
    (copies,) = fake_cuda.copiers
    chunks = -(-sum(t.numel() * t.element_size() for t in state.values()) // 8192)
    assert len(copies.queue) == chunks and copies.events == chunks
    assert fake_cudart.locked_bytes == pinned  # the ring is the staging, pinned once
    dev = fake_cuda.to_device(state)
    assert not dev["wt"].is_contiguous()
    for t in dev.values():
        t.zero_()
    assert eng.load("ckpt", into=dev) is dev
    assert_same_state(dev, state)
    assert len(fake_cuda.copiers) == 2 and fake_cuda.copiers[1].queue
    m = read_manifest(eng.targets)
    t, off, _ = m["tensors"][0]["extents"][0]
    path = os.path.join(eng.targets[t], "ckpt", m["files"][str(t)]["file"])
    with open(path, "r+b") as f:
        f.seek(off)
        b = f.read(1)[0]
        f.seek(off)
        f.write(bytes([b ^ 1]))
    with pytest.raises(ChecksumError, match=rf"tensor state\['w'\] does not match .*{path}"):
        eng.load("ckpt", device="cuda")
    eng.close()  # before the fake runtime goes
    assert fake_cudart.locked == {}
