"""gds's kvikio I/O (bench/engines/gds/kvikio_io.py): the pieces kvikio is handed and where,
its thread pool, the checksums beside the writes, the restore into device memory, pacing,
the failure paths, and the real kvikio on CUDA (marked `gpu`; the real package is held
against the same calls in tests/test_kvikio_real.py).

The engine runs over FakeKvikio and FakeCuda (tests/fake_kvikio.py), which follow kvikio's
real contracts; its fixtures and sample states are in tests/conftest.py.
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import (
    assert_same_state,
    data_files,
    kvikio_engine,
    mixed_state,
    read_manifest,
    sample_state,
)

from bench.common.errors import ChecksumError, UserError
from bench.engines import gds
from bench.storage import checksums, odirect, pacing


def test_kvikio_calls_match_the_manifest(make_engine, targets, fake_kvikio, fake_cuda):
    fake = fake_kvikio()
    dirs = targets(3)
    eng = kvikio_engine(make_engine, dirs)
    state = mixed_state(fake_cuda)
    pending = eng.save(state, "ckpt")
    assert pending.done()  # the stall lasts until durable
    result = pending.wait()
    assert_same_state(eng.load("ckpt"), state)

    assert result.gds_mode == "gds", result.detail
    assert result.copied_tensors == 1
    assert result.bytes == sum(t.numel() * t.element_size() for t in state.values())
    assert result.targets_used == 3
    assert result.stall_s <= result.total_s
    assert result.detail.host_bytes == 4  # the step scalar
    assert result.detail.device_bytes == result.bytes - 4

    m = read_manifest(dirs)
    data = data_files(dirs, m)
    # One CuFile per data file, closed, with every future awaited first.
    assert sorted(f.path for f in fake.files) == sorted(data.values())
    assert all(f.closed and f.unawaited_at_close == 0 for f in fake.files)
    # Every pwrite is one extent of the manifest, and every extent was one pwrite.
    want = sorted((data[t], length, off) for e in m["tensors"] for t, off, length in e["extents"])
    assert sorted((c.path, c.size, c.offset) for c in fake.calls) == want
    assert len(fake.calls) > len(state)  # chunks really split the tensors
    # Device bytes went over GDS, the host scalar through kvikio's POSIX path.
    assert fake.routes() == {"gds": result.bytes - 4, "posix": 4}
    assert result.detail.gds_evidence.startswith("nvidia-fs counted")
    for t, path in data.items():
        assert os.path.getsize(path) == m["files"][str(t)]["bytes"]


def test_host_tensors_are_handed_to_kvikio_as_host_buffers(
    make_engine, targets, fake_kvikio, fake_cuda
):
    """A torch CPU tensor has neither __cuda_array_interface__ nor the buffer protocol: handed
    to kvikio as it is, CuFile.pwrite raises TypeError (a model state's `step` crashed gds)."""
    fake = fake_kvikio()
    with pytest.raises(TypeError):
        kv = fake.modules["kvikio"]
        kv.CuFile(os.path.join(targets(1)[0], "x"), "w").pwrite(torch.zeros(4, dtype=torch.uint8))
    eng = kvikio_engine(make_engine, targets(2))
    state = mixed_state(fake_cuda)
    state["opt"] = {"step": torch.tensor(1000.0), "lr": 3e-4}
    eng.save(state, "ckpt").wait()
    assert_same_state(
        {k: v for k, v in eng.load("ckpt").items() if k != "opt"},
        {k: v for k, v in state.items() if k != "opt"},
    )
    assert eng.load("ckpt")["opt"]["lr"] == 3e-4
    assert torch.equal(eng.load("ckpt")["opt"]["step"], torch.tensor(1000.0))
    host_calls = [c for c in fake.calls if c.memory == "host"]
    assert sorted(c.size for c in host_calls) == [4, 4]


def test_kvikio_thread_pool_is_sized_once_per_engine_and_given_back(
    make_engine, targets, fake_kvikio, fake_cuda
):
    """kvikio rebuilds its thread pool whenever num_threads is set: the engine sets its
    settings once, outside the timed region, and gives kvikio's back at close."""
    fake = fake_kvikio()
    eng = kvikio_engine(make_engine, targets(3), threads_per_target=4, chunk_bytes="64KiB")
    assert (fake.values["num_threads"], fake.values["task_size"]) == (12, 64 << 10)
    assert fake.values["gds_threshold"] == 0
    assert fake.pool_resets == 1
    state = mixed_state(fake_cuda)
    eng.warm(state)
    result = eng.save(state, "ckpt").wait()
    eng.save(state, "ckpt").wait()
    eng.load("ckpt", device="cuda")
    assert fake.pool_resets == 1  # not inside any save or restore
    assert fake.calls and {(c.num_threads, c.task_size) for c in fake.calls} == {(12, 64 << 10)}
    assert (result.detail.num_threads, result.detail.task_size) == (12, 64 << 10)
    assert result.detail.settings_reset_in_save is None
    # Someone else changes kvikio's settings: the next save sets them again and says so.
    fake.modules["kvikio.defaults"].set("num_threads", 3)
    again = eng.save(state, "ckpt").wait()
    assert again.detail.settings_reset_in_save is True and fake.values["num_threads"] == 12
    eng.close()
    # kvikio's own values again, as the engine found them
    assert (fake.values["num_threads"], fake.values["task_size"]) == (1, 4 << 20)
    assert fake.values["gds_threshold"] == 16 << 10


def test_no_host_copy_inside_the_stall(make_engine, targets, fake_kvikio, fake_cuda, monkeypatch):
    """Checksums of device tensors are computed on the device (wsum64), never by copying them
    to the host and hashing there."""
    fake_kvikio()
    eng = kvikio_engine(make_engine, targets(2))
    state = mixed_state(fake_cuda)
    host_copies: list[str] = []
    for method in ("cpu", "numpy", "to", "tolist"):
        real = getattr(torch.Tensor, method)

        def spy(self: torch.Tensor, *a: Any, _real: Any = real, _m: str = method, **k: Any) -> Any:
            # .to(dtype) stays on the device; .to(a device) would move the bytes
            moves = _m != "to" or "device" in k or any(isinstance(x, str | torch.device) for x in a)
            if moves and fake_cuda.is_device(self):
                host_copies.append(_m)
            return _real(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, method, spy)
    result = eng.save(state, "ckpt").wait()
    monkeypatch.undo()
    assert host_copies == []
    assert result.hash_s > 0 and result.checksums
    m = read_manifest(eng.targets)
    algos = {
        e["path"]: ("xxh3" if e["xxh3"] else "wsum64" if e["wsum64"] else None)
        for e in m["tensors"]
        if e["nbytes"]
    }
    assert algos == {
        "['w']": "wsum64",
        "['wt']": "wsum64",
        "['half']": "wsum64",
        "['offset_view']": "wsum64",
        "['step']": "xxh3",
    }


def test_device_checksum_matches_on_any_device_and_catches_damage():
    g = torch.Generator().manual_seed(1)
    raw = torch.randint(0, 256, ((1 << 16) + 3,), dtype=torch.uint8, generator=g)
    a = checksums.device_checksum(raw)
    # The same bytes at another alignment and in pieces of another size give the same digest.
    shifted = torch.empty(raw.numel() + 1, dtype=torch.uint8)[1:]
    shifted.copy_(raw)
    assert checksums.device_checksum(shifted) == a
    old = checksums.WSUM_PIECE
    try:
        checksums.WSUM_PIECE = 1000
        assert checksums.device_checksum(raw) == a
    finally:
        checksums.WSUM_PIECE = old
    # Reference: the definition in plain Python.
    data = bytes(raw.numpy()) + b"\0"
    words = [int.from_bytes(data[i : i + 4], "little") for i in range(0, len(data), 4)]
    s1 = sum(words) % 2**64
    s2 = sum((i + 1) * w for i, w in enumerate(words)) % 2**64
    assert a == f"{s1:016x}{s2:016x}-{raw.numel():x}"
    flipped = raw.clone()
    flipped[1234] ^= 1
    swapped = raw.clone()
    swapped[0:4], swapped[4:8] = raw[4:8].clone(), raw[0:4].clone()
    assert len({a, checksums.device_checksum(flipped), checksums.device_checksum(swapped)}) == 3
    assert checksums.device_checksum(raw[:-3]) != a


@pytest.mark.parametrize("where", ["cpu", "cuda"])
def test_damaged_byte_is_caught_on_either_restore_path(
    make_engine, targets, fake_kvikio, fake_cuda, where
):
    fake_kvikio()
    dirs = targets(2)
    eng = kvikio_engine(make_engine, dirs)
    eng.save(mixed_state(fake_cuda), "ckpt").wait()
    m = read_manifest(dirs)
    entry = next(e for e in m["tensors"] if e["path"] == "['w']")
    t, off, _ = entry["extents"][0]
    path = data_files(dirs, m)[t]
    with open(path, "r+b") as f:
        f.seek(off + 100)
        b = f.read(1)
        f.seek(off + 100)
        f.write(bytes([b[0] ^ 0x10]))
    with pytest.raises(ChecksumError, match=r"tensor state\['w'\] does not match"):
        eng.load("ckpt", device=where)


def test_gds_restore_reads_into_device_memory(make_engine, targets, fake_kvikio, fake_cuda):
    fake = fake_kvikio()
    dirs = targets(2)
    eng = kvikio_engine(make_engine, dirs)
    state = mixed_state(fake_cuda)
    eng.save(state, "ckpt").wait()
    fake.calls.clear()
    loaded = eng.load("ckpt", device="cuda")
    assert_same_state(loaded, state)
    assert eng.restore_mode == "gds"
    reads = [c for c in fake.calls if c.op == "pread"]
    m = read_manifest(dirs)
    device_extents = [x for e in m["tensors"] if e["wsum64"] for x in e["extents"]]
    assert len(reads) == len(device_extents) and {c.memory for c in reads} == {"device"}
    assert {c.route for c in reads} == {"gds"}
    for k in ("w", "half", "offset_view"):
        assert fake_cuda.is_device(loaded[k]), k
    # Restoring to the host is a host read, and says so.
    assert_same_state(eng.load("ckpt", device="cpu"), state)
    assert eng.restore_mode == "host"


@pytest.mark.parametrize("failure", ["call", "get", "short"])
def test_failed_write_closes_files_and_commits_nothing(
    make_engine, targets, fake_kvikio, fake_cuda, failure
):
    fake = fake_kvikio()
    if failure == "short":
        fake.short_by = 1
    else:
        fake.fail_on_call, fake.fail_in = 3, failure
    dirs = targets(2)
    eng = kvikio_engine(make_engine, dirs)
    with pytest.raises(OSError) as e:
        eng.save(mixed_state(fake_cuda), "ckpt")
    if failure == "short":
        assert "kvikio wrote" in str(e.value)
        assert re.search(r"/ckpt/data-0\.[0-9a-f]{16}\.bin", str(e.value)), str(e.value)
    else:
        # kvikio's RuntimeError, raised as the OSError it is, naming the file
        assert "fake I/O error" in str(e.value) and str(e.value).startswith("[Errno 5] kvikio")
        assert re.search(r"/ckpt/data-[01]\.[0-9a-f]{16}\.bin$", e.value.filename)
    # Every write issued was awaited before its file closed, the failed one included.
    assert fake.files and all(f.closed and f.unawaited_at_close == 0 for f in fake.files)
    if failure != "call":
        assert len(fake.calls) == sum(len(f.futures) for f in fake.files) > 3
    assert not (Path(dirs[0]) / "ckpt" / "manifest.json").exists()
    # The failed save removed its own files (data and marker): nothing is left to clean.
    assert all(os.listdir(Path(d) / "ckpt") == [] for d in dirs)
    assert eng.status("ckpt") == "absent"
    assert fake.values["num_threads"] == 4 and fake.pool_resets == 1  # untouched by the failure
    with pytest.raises(UserError, match="no complete checkpoint"):
        eng.load("ckpt")


@pytest.mark.parametrize("failure", ["call", "get", "short"])
def test_failed_write_keeps_the_previous_checkpoint(
    make_engine, targets, fake_kvikio, fake_cuda, failure
):
    fake = fake_kvikio()
    dirs = targets(2)
    eng = kvikio_engine(make_engine, dirs)
    state = mixed_state(fake_cuda)
    eng.save(state, "ckpt").wait()
    before = {d: sorted(os.listdir(Path(d) / "ckpt")) for d in dirs}
    if failure == "short":
        fake.short_by = 1
    else:
        fake.fail_on_call, fake.fail_in = len(fake.calls) + 3, failure
    changed = fake_cuda.to_device({k: v + 1 for k, v in sample_state().items()}, ("step",))
    with pytest.raises(OSError):
        eng.save(changed, "ckpt")
    assert {d: sorted(os.listdir(Path(d) / "ckpt")) for d in dirs} == before
    assert eng.status("ckpt") == "complete"
    assert_same_state(eng.load("ckpt"), state)


def test_hashing_runs_while_kvikio_writes(
    make_engine, targets, fake_kvikio, fake_cuda, monkeypatch
):
    """kvikio's futures run on its threads: the checksums are computed while the writes are
    in flight (here held back until hashing is done), not after them."""
    fake = fake_kvikio()
    eng = kvikio_engine(make_engine, targets(2))
    gate = threading.Event()
    seen: list[int] = []
    real_submit = fake.submit

    def held(fn: Any, *args: Any) -> Any:
        return real_submit(lambda *a: gate.wait(60) and fn(*a), *args)

    real_hash = gds.Gds._hash_kvikio

    def hash_then_release(self: Any, *a: Any) -> None:
        seen.append(sum(f.done() for f in fake.files[0].futures))
        real_hash(self, *a)
        seen.append(sum(f.done() for f in fake.files[0].futures))
        gate.set()

    monkeypatch.setattr(fake, "submit", held)
    monkeypatch.setattr(gds.Gds, "_hash_kvikio", hash_then_release)
    state = mixed_state(fake_cuda)
    result = eng.save(state, "ckpt").wait()
    assert seen == [0, 0] and len(fake.files[0].futures) > 1
    assert result.checksums and result.hash_s > 0
    assert_same_state(eng.load("ckpt"), state)


def test_fallocate_and_write_caps_apply_through_kvikio(
    make_engine, targets, fake_kvikio, fake_cuda, monkeypatch
):
    """gds through kvikio reserves each file's length and honours `max_write_bw` as the other
    striped engines do: every piece is handed to kvikio only after its target's bucket let it."""
    fake = fake_kvikio()
    reserved: list[int] = []
    real_reserve = odirect.preallocate
    monkeypatch.setattr(
        odirect, "preallocate", lambda fd, n: (reserved.append(n), real_reserve(fd, n))
    )
    events: list[tuple[str, int]] = []
    real_take = pacing.TokenBucket.take

    def take(self: Any, n: int) -> None:
        real_take(self, n)
        events.append(("take", n))

    monkeypatch.setattr(pacing.TokenBucket, "take", take)
    real_submit = fake.submit
    monkeypatch.setattr(
        fake, "submit", lambda fn, *a: (events.append(("pwrite", a[1])), real_submit(fn, *a))[1]
    )
    rate = 4 << 20
    eng = kvikio_engine(make_engine, targets(2), chunk_bytes="256KiB", max_write_bw=rate)
    state = fake_cuda.to_device({"a": torch.randn(1 << 19), "b": torch.randn(1 << 19)})
    t0 = time.perf_counter()
    result = eng.save(state, "ckpt").wait()
    elapsed = time.perf_counter() - t0
    m = read_manifest(eng.targets)
    assert sorted(reserved) == sorted(i["bytes"] for i in m["files"].values())
    takes = [n for kind, n in events if kind == "take"]
    assert sorted(takes) == sorted(c.size for c in fake.calls) and len(takes) > 16
    # Each target's bucket let a piece through before it was handed to kvikio.
    for i, (kind, n) in enumerate(events):
        if kind == "pwrite":
            assert ("take", n) in events[:i]
    # 4 MiB over two targets capped at 4 MiB/s each, one 256 KiB burst each: at least 0.44 s.
    assert elapsed >= (2 << 20) / rate - (256 << 10) / rate - 0.02
    assert result.detail.gds_evidence.startswith("nvidia-fs counted")
    assert_same_state(eng.load("ckpt"), state)


@pytest.mark.gpu
def test_real_kvikio_on_cuda(make_engine, targets):
    reason = gds.kvikio_unavailable()
    if reason:
        pytest.skip(reason)
    kvikio = gds.import_kvikio()
    threads_before = kvikio.defaults.get("num_threads")
    dirs = targets(2)
    eng = make_engine(
        "gds", dirs, io="kvikio", device="cuda", chunk_bytes="64KiB", coalesce_below=0
    )
    assert kvikio.defaults.get("num_threads") == 4  # 2 threads per target x 2 targets
    state = {k: v if k == "step" else v.to("cuda") for k, v in sample_state().items()}
    eng.warm(state)
    result = eng.save(state, "ckpt").wait()
    if gds.kvikio_mode(kvikio) == "compat" or result.gds_mode == "compat":
        assert result.gds_mode == "compat" and result.detail.compat_reasons
    else:
        assert result.gds_mode == "gds" and result.detail.compat_reasons is None
        # Registered once per CUDA allocation: only the copied transposed tensor is not.
        assert result.detail.unregistered_device_bytes == 40 * 70 * 4, result.detail
        assert result.detail.registered_bytes > 0
    assert result.detail.num_threads == 4
    assert result.copied_tensors == 1
    assert result.detail.host_bytes == 4
    assert eng._hash_stream is not None  # the checksums ran on a side stream
    loaded = eng.load("ckpt", device="cuda")
    assert eng.restore_mode in ("gds", "compat") and eng.restore_detail["gds_evidence"]
    assert all(t.device.type == "cuda" for t in loaded.values())
    assert_same_state(loaded, state)
    # Device checksums computed on the GPU are checked again on the host.
    assert_same_state(eng.load("ckpt", device="cpu"), state)
    m = read_manifest(dirs)
    for t, info in m["files"].items():
        assert os.path.getsize(Path(dirs[int(t)]) / "ckpt" / info["file"]) == info["bytes"]
    eng.close()
    assert kvikio.defaults.get("num_threads") == threads_before


@pytest.mark.gpu
def test_real_kvikio_on_cuda_coalesces_small_tensors(make_engine, targets):
    """The coalesced path for real: 2,000 small device tensors, a strided one and a host step
    copied into one registered device buffer (HBM to HBM), written in chunks by kvikio, their
    wsum64 from the buffer; read back bit for bit, on the device and through the host."""
    reason = gds.kvikio_unavailable()
    if reason:
        pytest.skip(reason)
    kvikio = gds.import_kvikio()
    g = torch.Generator().manual_seed(5)
    state: dict[str, torch.Tensor] = {
        f"p{i:04d}": torch.randn(1 + i % 900, generator=g).to("cuda") for i in range(2000)
    }
    state["wt"] = torch.randn(40, 70, generator=g).to("cuda").t()
    state["big"] = torch.randn(1 << 20, generator=g).to("cuda")  # 4 MiB: from its own memory
    state["step"] = torch.tensor(7.0)
    dirs = targets(2)
    eng = make_engine("gds", dirs, io="kvikio", device="cuda", chunk_bytes="1MiB")
    eng.warm(state)
    result = eng.save(state, "ckpt").wait()
    assert result.detail.coalesced_tensors == 2002 and result.copied_tensors == 0
    assert result.detail.host_bytes == 0  # the step went through the device buffer
    if gds.kvikio_mode(kvikio) == "gds" and result.gds_mode == "gds":
        assert result.detail.unregistered_device_bytes == 0, result.detail
    assert_same_state(eng.load("ckpt", device="cuda"), state)
    assert_same_state(eng.load("ckpt", device="cpu"), state)
    eng.close()


@pytest.mark.parametrize("io", ["kvikio", "emulated"])
def test_the_writes_wait_for_the_stream_that_made_the_state(
    make_engine, targets, fake_kvikio, fake_cuda, fake_cudart, monkeypatch, io
):
    """kvikio orders its writes after the legacy default stream only: before the first write
    of device bytes the engine waits for the current stream (a blocking event), where a state
    produced under torch.cuda.stream(s) was written; the emulation's bounce copies too."""
    from bench.common.devices import Device

    order: list[str] = []
    fake = fake_kvikio()
    monkeypatch.setattr(Device, "wait_current_stream", lambda self: order.append("wait"))
    real_issue = gds.Gds._write_piece

    def write_piece(self: Any, fd: int, piece: Any) -> None:
        order.append("write")
        real_issue(self, fd, piece)

    monkeypatch.setattr(gds.Gds, "_write_piece", write_piece)
    eng = kvikio_engine(make_engine, targets(2), io=io)
    state = mixed_state(fake_cuda)
    result = eng.save(state, "ckpt").wait()
    writes = len(fake.calls) if io == "kvikio" else order.count("write")
    assert writes and order[0] == "wait" and order.count("wait") == 1
    if io == "kvikio":
        assert "write" not in order and result.gds_mode == "gds"
    assert_same_state(eng.load("ckpt"), state)
    eng.close()  # its pinned bounce buffers, while the fake CUDA runtime is still in place
