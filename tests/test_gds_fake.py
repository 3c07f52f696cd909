"""The gds engine's kvikio path, checked against FakeKvikio and FakeCuda (tests/fake_kvikio.py).

The fakes follow kvikio's real contracts (a package whose submodules must be imported, what
pwrite/pread accept, its settings and thread pool, per-file compat decisions, futures that run
on threads, registration per CUDA allocation, nvidia-fs's counters) so that the logic around
kvikio runs on any machine: which pieces go where, the thread pool it is given, where checksums
are computed, how each save is labelled, the GDS read path, buffer registration, pacing, and the
failure paths. The engine runs on a CUDA Device whose memory is the fake's, so its device
branches run too. The real kvikio package is held against the same calls in
tests/test_kvikio_real.py; the real GPU path runs only in the test marked `gpu`.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import assert_same_state, read_manifest
from fake_kvikio import FakeCuda, FakeCudart, FakeKvikio

from bench.common.devices import Device
from bench.common.errors import ChecksumError, UserError
from bench.engines import gds
from bench.measure.ceilings import memory
from bench.storage import checksums, odirect, pacing, staging

FAKE_CUDA_DEVICE = Device("cuda", torch.device("cpu"))


@pytest.fixture
def fake_kvikio(monkeypatch, tmp_path, fake_cuda) -> Iterator[Callable[..., FakeKvikio]]:
    """`fake_kvikio(**knobs)` makes `import kvikio` import a FakeKvikio and returns it; its
    nvidia-fs statistics are a file the engine is pointed at (`nvfs_stats=None`: no driver
    statistics at all)."""
    made: list[FakeKvikio] = []

    def install(**kw: Any) -> FakeKvikio:
        kw.setdefault("allocation_of", fake_cuda.allocation_of)
        kw.setdefault("nvfs_stats", str(tmp_path / f"nvidia-fs-stats-{len(made)}"))
        fake = FakeKvikio(**kw).install(monkeypatch)
        monkeypatch.setattr(gds.labels, "NVFS_STATS", kw["nvfs_stats"] or str(tmp_path / "absent"))
        made.append(fake)
        return fake

    yield install
    for fake in made:
        fake.uninstall()


class _Refuse:
    """A meta-path finder for `kvikio` that fails the way a machine without it (or without the
    libraries it loads) does."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name.split(".")[0] == "kvikio":
            raise self.error
        return None


@pytest.fixture
def no_kvikio(monkeypatch) -> Callable[[BaseException | None], None]:
    """`no_kvikio(error)`: `import kvikio` raises `error` (default: not installed)."""

    def install(error: BaseException | None = None) -> None:
        for name in list(sys.modules):
            if name.split(".")[0] in ("kvikio", "libkvikio"):
                monkeypatch.delitem(sys.modules, name)
        err = error or ModuleNotFoundError("No module named 'kvikio'", name="kvikio")
        monkeypatch.setattr(sys, "meta_path", [_Refuse(err), *sys.meta_path])

    return install


@pytest.fixture
def fake_cudart(monkeypatch) -> FakeCudart:
    rt = FakeCudart()
    monkeypatch.setattr(staging, "cudart", lambda: rt)
    return rt


def sample_state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    flat = torch.randint(-(2**40), 2**40, (6000,), generator=g)
    return {
        "w": torch.randn(96, 80, generator=g),
        "wt": torch.randn(40, 70, generator=g).t(),  # non-contiguous: copied first
        "half": torch.randn(4097, generator=g).to(torch.bfloat16),
        "offset_view": flat[3:5003],  # contiguous, unaligned start
        "step": torch.tensor(7.0),  # an optimizer's step: stays on the host
        "empty": torch.empty(0, 3),
    }


def mixed_state(cuda: FakeCuda) -> dict[str, torch.Tensor]:
    """The sample state in fake device memory, but for `step`, which stays on the host."""
    return cuda.to_device(sample_state(), keep_on_host=("step",))


def kvikio_engine(make_engine: Any, dirs: list[str], **opts: Any) -> Any:
    """gds through the fake kvikio; each tensor written from its own memory unless the test
    turns coalescing on (test_coalesced_*)."""
    opts = {"io": "kvikio", "device": "cuda", "chunk_bytes": "8KiB", "coalesce_below": 0, **opts}
    return make_engine("gds", dirs, **opts)


def data_files(dirs: list[str], m: dict[str, Any], name: str = "ckpt") -> dict[int, str]:
    return {int(t): os.path.join(dirs[int(t)], name, i["file"]) for t, i in m["files"].items()}


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


def test_a_file_cufile_cannot_take_makes_the_save_compat(
    make_engine, targets, fake_kvikio, fake_cuda
):
    """kvikio's AUTO mode would fall back to POSIX for that file silently; the engine opens
    with compat mode OFF, falls back itself and says why."""
    fake = fake_kvikio()
    dirs = targets(3)
    fake.unregistrable = [dirs[1]]
    eng = kvikio_engine(make_engine, dirs)
    state = mixed_state(fake_cuda)
    result = eng.save(state, "ckpt").wait()
    assert result.gds_mode == "compat"
    (reason,) = result.detail.compat_reasons
    assert "cuFile could not take" in reason and dirs[1] in reason
    assert_same_state(eng.load("ckpt"), state)
    # The other two files did go over GDS; the fallback file went through POSIX.
    by_file = {(os.path.dirname(os.path.dirname(c.path)), c.route) for c in fake.calls}
    assert (dirs[1], "posix") in by_file and (dirs[0], "gds") in by_file
    assert (dirs[1], "gds") not in by_file
    assert fake.values["compat_mode"] == fake.modules["kvikio"].CompatMode.AUTO  # restored


def test_allow_compat_false_refuses_a_file_cufile_cannot_take(
    make_engine, targets, fake_kvikio, fake_cuda
):
    fake = fake_kvikio()
    dirs = targets(2)
    fake.unregistrable = [dirs[1]]
    eng = kvikio_engine(make_engine, dirs, allow_compat=False)
    with pytest.raises(
        UserError, match=rf"cuFile could not take {re.escape(dirs[1])}.*allow_compat is false"
    ):
        eng.save(mixed_state(fake_cuda), "ckpt")
    assert all(os.listdir(Path(d) / "ckpt") == [] for d in dirs)  # nothing half-written left
    assert eng.status("ckpt") == "absent"


@pytest.mark.parametrize(
    ("knobs", "why"),
    [
        ({"cufile_loads": False}, "prefers compat mode"),
        ({"gds_available": False}, "nvidia-fs driver is not loaded"),
    ],
)
def test_no_gds_on_the_machine_is_compat(make_engine, targets, fake_kvikio, fake_cuda, knobs, why):
    fake_kvikio(**knobs)
    eng = kvikio_engine(make_engine, targets(2))
    state = mixed_state(fake_cuda)
    result = eng.save(state, "ckpt").wait()
    assert result.gds_mode == "compat"
    assert any(why in r for r in result.detail.compat_reasons)
    assert_same_state(eng.load("ckpt", device="cuda"), state)
    assert eng.restore_mode == "compat"


def test_gds_mode_is_compat_when_kvikio_cannot_tell(make_engine, targets, fake_kvikio, fake_cuda):
    fake = fake_kvikio()
    del fake.modules["kvikio.cufile_driver"].properties  # an older kvikio without them
    eng = kvikio_engine(make_engine, targets(1))
    result = eng.save(mixed_state(fake_cuda), "a").wait()
    assert result.gds_mode == "compat"
    assert "cannot tell" in result.detail.compat_reasons[0]


def test_small_device_pieces_under_gds_threshold_are_compat(
    make_engine, targets, fake_kvikio, fake_cuda
):
    fake = fake_kvikio()
    eng = kvikio_engine(make_engine, targets(1), gds_threshold="16KiB", chunk_bytes="64KiB")
    result = eng.save(mixed_state(fake_cuda), "ckpt").wait()
    assert result.gds_mode == "compat"
    assert any("gds_threshold" in r for r in result.detail.compat_reasons)
    assert "posix" in {c.route for c in fake.calls if c.memory == "device"}
    # With the default threshold of 0 every device byte goes to cuFile.
    fake.calls.clear()
    eng0 = kvikio_engine(make_engine, targets(1), chunk_bytes="64KiB")
    assert eng0.save(mixed_state(fake_cuda), "ckpt").wait().gds_mode == "gds"
    assert {c.route for c in fake.calls if c.memory == "device"} == {"gds"}


@pytest.mark.parametrize("allow", [True, False])
def test_without_nvidia_fs_counters_the_filesystem_list_decides(
    make_engine, targets, fake_kvikio, fake_cuda, monkeypatch, allow
):
    """Where nvidia-fs keeps no statistics and cufile.json allows compat mode, cuFile itself may
    serve a file through POSIX on storage GDS does not serve natively, and kvikio cannot see it:
    such saves are not called gds, and the row says what decided."""
    fake_kvikio(allow_compat_mode=allow, nvfs_stats=None)
    monkeypatch.setattr(
        gds.labels, "native_gds_reason", lambda info: f"{info['path']} is on a virtio disk"
    )
    eng = kvikio_engine(make_engine, targets(1))
    result = eng.save(mixed_state(fake_cuda), "ckpt").wait()
    assert result.gds_mode == ("compat" if allow else "gds")
    assert result.detail.gds_evidence == "filesystem list: no nvidia-fs statistics"
    if allow:
        assert "is on a virtio disk" in result.detail.compat_reasons[0]
    # Where GDS serves the target natively, the list has nothing to say.
    monkeypatch.setattr(gds.labels, "native_gds_reason", lambda info: None)
    eng2 = kvikio_engine(make_engine, targets(1))
    assert eng2.save(mixed_state(fake_cuda), "ckpt").wait().gds_mode == "gds"


def test_nvidia_fs_counters_overrule_the_filesystem_list(
    make_engine, targets, fake_kvikio, fake_cuda, monkeypatch
):
    """Where nvidia-fs counts bytes, its counters decide: all device bytes counted -> gds,
    whatever the list says of the filesystem."""
    fake_kvikio()
    monkeypatch.setattr(gds.labels, "native_gds_reason", lambda info: "never asked")
    eng = kvikio_engine(make_engine, targets(2))
    state = mixed_state(fake_cuda)
    result = eng.save(state, "ckpt").wait()
    assert result.gds_mode == "gds", result.detail
    assert result.detail.compat_reasons is None
    eng.load("ckpt", device="cuda")
    assert eng.restore_mode == "gds"
    assert eng.restore_detail["gds_evidence"].startswith("nvidia-fs counted")


def test_bytes_cufile_served_through_posix_make_the_save_compat(
    make_engine, targets, fake_kvikio, fake_cuda
):
    """cuFile accepted every file (kvikio saw no fallback), but on one target cuFile's own compat
    mode moved the bytes through POSIX: nvidia-fs did not count them, and the save says so."""
    fake = fake_kvikio()
    dirs = targets(2)
    fake.posix_inside_cufile = [dirs[1]]
    eng = kvikio_engine(make_engine, dirs, chunk_bytes="1MiB")
    big = fake_cuda.to_device({"a": torch.randn(1 << 20), "b": torch.randn(1 << 20)})
    result = eng.save(big, "ckpt").wait()
    assert result.gds_mode == "compat"
    (why,) = result.detail.compat_reasons
    assert re.match(r"nvidia-fs counted 4 MiB in \d+ writes GPU-direct of 8 MiB", why), why
    assert fake.routes() == {"gds": 4 << 20, "cufile-compat": 4 << 20}


def test_nvidia_fs_without_io_statistics_falls_back_to_the_list(
    make_engine, targets, fake_kvikio, fake_cuda, monkeypatch
):
    fake_kvikio(nvfs_io_stats=False)
    monkeypatch.setattr(gds.labels, "native_gds_reason", lambda info: None)
    eng = kvikio_engine(make_engine, targets(1))
    result = eng.save(mixed_state(fake_cuda), "ckpt").wait()
    assert result.gds_mode == "gds"
    assert "IO statistics are off" in result.detail.gds_evidence


@pytest.mark.parametrize(
    ("fstype", "disk", "opts", "native"),
    [
        ("ext4", "nvme0n1", "rw,relatime", True),
        ("xfs", "nvme3n1", "rw", True),
        ("ext4", "vda", "rw,relatime", False),  # virtio
        ("xfs", "sda", "rw", False),  # SATA/SCSI
        ("ext4", "dm-0", "rw", False),  # LVM
        ("ext4", "loop0", "rw", False),
        ("ext4", "nvme0n1", "rw,data=writeback", False),  # not ordered mode
        ("nfs4", "?", "rw,vers=4.2,proto=tcp", False),
        ("nfs", "?", "rw,vers=3,proto=rdma", True),
        ("lustre", "?", "rw", True),
        ("wekafs", "?", "rw", True),
        ("tmpfs", "?", "rw", False),
        ("overlay", "?", "rw", False),
    ],
)
def test_where_gds_serves_files_natively(fstype, disk, opts, native):
    info = {"path": "/ckpt", "fstype": fstype, "opts": opts, "block": {"disk": disk}}
    why = gds.native_gds_reason(info)
    assert (why is None) == native, why
    if why:
        assert why.startswith("/ckpt ")


def test_nvidia_fs_statistics_are_read_in_the_drivers_format(tmp_path):
    path = tmp_path / "stats"
    assert gds.nvfs_counters(str(path)) is None
    fake = FakeKvikio(nvfs_stats=str(path))
    fake.count_gds("pwrite", (3 << 20) + 5)
    fake.count_gds("pread", 1 << 20)
    assert gds.nvfs_counters(str(path)) == {
        "read_ops": 1,
        "read_MiB": 1,
        "read_err": 0,
        "write_ops": 1,
        "write_MiB": 3,
        "write_err": 0,
        "pg_cache": 0,
    }
    FakeKvikio(nvfs_stats=str(path), nvfs_io_stats=False)
    assert gds.nvfs_counters(str(path)) == {"read_err": 0, "write_err": 0, "pg_cache": 0}
    # The verdict: floors of MiB, so 3.0 MiB counted for 3.9 MiB on the device is all of it.
    before = {"write_MiB": 10, "write_ops": 4}
    assert gds.nvfs_verdict(before, {"write_MiB": 13, "write_ops": 5}, 4089446, "write")[1] is None
    why = gds.nvfs_verdict(before, {"write_MiB": 11, "write_ops": 5}, 3 << 20, "write")[1]
    assert why and "counted 1 MiB in 1 writes GPU-direct of 3 MiB" in why
    assert gds.nvfs_verdict(None, None, 1, "write") == (None, None)
    assert gds.nvfs_verdict({}, {}, 1, "write") == (None, None)


def test_a_state_without_device_tensors_is_not_gds(make_engine, targets, fake_kvikio):
    fake_kvikio()
    eng = kvikio_engine(make_engine, targets(1))
    state = sample_state()
    result = eng.save(state, "ckpt").wait()
    assert result.gds_mode == "compat"
    assert "no tensor was in device memory" in result.detail.compat_reasons[0]
    assert_same_state(eng.load("ckpt"), state)


def test_device_memory_is_registered_once_per_allocation_and_released(
    make_engine, targets, fake_kvikio, fake_cuda
):
    """kvikio's memory_register registers the whole CUDA allocation holding a pointer and refuses
    a second registration inside it. torch packs small tensors into shared segments: the
    engine registers each segment once, for every tensor in it."""
    fake = fake_kvikio()
    eng = kvikio_engine(make_engine, targets(2))
    state = mixed_state(fake_cuda)
    state["big"] = fake_cuda.to(torch.randn(3 << 20))  # 12 MiB: a segment of its own
    eng.warm(state)
    contiguous_device = [t for k, t in state.items() if k not in ("step", "empty", "wt")]
    segments = {fake_cuda.allocation_of(t.data_ptr()) for t in contiguous_device}
    assert len(segments) == 2  # the small tensors share one 2 MiB segment
    assert fake.registered == dict(segments)
    assert fake.register_calls == 2
    result = eng.save(state, "ckpt").wait()
    assert result.detail.registered_bytes == sum(size for _, size in segments)
    assert result.detail.unregistered_device_bytes == state["wt"].numel() * 4  # copied first
    assert result.detail.register_note is None
    eng.close()
    assert fake.registered == {}


def test_a_failed_registration_is_said_and_the_rest_still_registered(
    make_engine, targets, fake_kvikio, fake_cuda
):
    fake = fake_kvikio()
    eng = kvikio_engine(make_engine, targets(1))
    state = mixed_state(fake_cuda)
    state["big"] = fake_cuda.to(torch.randn(3 << 20))
    small = fake_cuda.allocation_of(state["w"].data_ptr())
    fake.registered[small[0]] = small[1]  # registered by someone else already
    eng.warm(state)
    big = fake_cuda.allocation_of(state["big"].data_ptr())
    assert fake.registered == dict([small, big])
    result = eng.save(state, "ckpt").wait()
    note = result.detail.register_note
    assert note.startswith("3 tensors not registered (['w']: RuntimeError: ")
    assert "CU_FILE_MEMORY_ALREADY_REGISTERED" in note
    assert result.detail.registered_bytes == big[1]
    unregistered = sum(state[k].numel() * state[k].element_size() for k in ("w", "wt", "half"))
    unregistered += state["offset_view"].numel() * 8
    assert result.detail.unregistered_device_bytes == unregistered
    eng.close()
    assert fake.registered == dict([small])  # only what the engine registered is released


def test_no_registration_in_compat_mode(make_engine, targets, fake_kvikio, fake_cuda):
    fake = fake_kvikio(cufile_loads=False)
    eng = kvikio_engine(make_engine, targets(1))
    state = mixed_state(fake_cuda)
    eng.warm(state)
    result = eng.save(state, "ckpt").wait()
    assert fake.register_calls == 0
    assert result.detail.registered_bytes == 0
    assert "compat mode" in result.detail.register_note


def test_the_fake_is_a_package_whose_submodules_must_be_imported(fake_kvikio):
    """As the real kvikio: `import kvikio` alone gives neither `defaults` nor `cufile_driver`."""
    fake_kvikio()
    import kvikio

    assert not hasattr(kvikio, "defaults") and not hasattr(kvikio, "cufile_driver")
    kv = gds.import_kvikio()
    assert kv is kvikio and kv.defaults.get("num_threads") == 1
    assert kv.cufile_driver.properties.is_gds_available


def test_unavailable_on_cuda_without_kvikio(monkeypatch, no_kvikio):
    no_kvikio()
    reason = gds.Gds.unavailable({"device": "cuda"})
    assert reason and "kvikio is not installed" in reason and "io: emulated" in reason
    assert gds.Gds.unavailable({"device": "cuda", "io": "emulated"}) is None
    assert gds.Gds.unavailable({"device": "host-emulated"}) is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert gds.Gds.unavailable({}) == reason  # auto on a CUDA machine means kvikio


def test_kvikio_that_does_not_import(make_engine, targets, no_kvikio):
    no_kvikio()
    from bench import engines

    with pytest.raises(
        UserError, match=r"gds cannot run here: kvikio is not installed \(No module"
    ):
        engines.create("gds", targets(1), io="kvikio", device="host-emulated")


class DynamicLibNotFoundError(RuntimeError):
    """What cuda.pathfinder raises when libcufile cannot be found (a RuntimeError)."""


def test_kvikio_whose_libraries_do_not_load_is_a_reason_not_a_crash(monkeypatch, no_kvikio, capsys):
    """libkvikio loads libcufile through cuda.pathfinder, which raises a RuntimeError subclass
    when it is missing: `ckptbench engines`, the environment block and the engine give that as
    the reason why gds cannot run."""
    from bench import cli, engines

    no_kvikio(DynamicLibNotFoundError('Failure finding "libcufile.so.0"'))
    assert gds.kvikio_load_error() == (
        'kvikio does not load (DynamicLibNotFoundError: Failure finding "libcufile.so.0")'
    )
    reason = gds.Gds.unavailable({"io": "kvikio"})
    assert reason and reason.startswith("kvikio does not load (DynamicLibNotFoundError")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert gds.kvikio_info() == {"available": False, "reason": gds.kvikio_load_error()}
    with pytest.raises(UserError, match="kvikio does not load"):
        engines.create("gds", ["/nonexistent"], io="kvikio")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["engines"]) == 0
    assert "gds" in capsys.readouterr().out


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


def test_a_sweep_skips_gds_that_cannot_run_and_says_why(scratch, no_kvikio, capsys):
    """gds on CUDA without kvikio (here: io=kvikio without kvikio) used to write error rows;
    the sweep now skips it with the reason, in the terminal summary and env.json."""
    from bench import cli
    from bench.measure import results

    no_kvikio()
    cfg = scratch / "c.yaml"
    cfg.write_text(
        "name: skip\nengines: [gds, cpu-double]\ntotal_sizes: [1MiB]\ntensor_sizes: [1MiB]\n"
        f"scratch: {scratch}/t\nrepetitions: 1\nwarmups: 0\nceilings: {{enabled: false}}\n"
        "engine_options: {gds: {io: kvikio}}\n"
    )
    assert cli.main(["run", str(cfg), "-q", "-o", str(scratch / "out")]) == 0
    out = capsys.readouterr().out
    assert "note: engine gds skipped: it cannot run here: kvikio is not installed" in out
    (run_dir,) = (scratch / "out").iterdir()
    rows = results.read_rows(str(run_dir))
    assert list(rows["engine"]) == ["cpu-double"] and rows["verified"].all()
    env = json.loads((run_dir / "env.json").read_text())
    assert any(n.startswith("engine gds skipped") for n in env["notes"])
    # With nothing left to run, the sweep is refused in one line.
    cfg.write_text(cfg.read_text().replace("[gds, cpu-double]", "[gds]"))
    assert cli.main(["run", str(cfg), "-q", "-o", str(scratch / "out")]) == 2
    assert (
        "no engine of the config can run here (gds: kvikio is not installed"
        in capsys.readouterr().err
    )


# -- coalescing small tensors (issue 32) ---------------------------------------------------------


def many_small_state(cuda: FakeCuda, n: int = 300) -> dict[str, Any]:
    """`n` small tensors of mixed dtypes and odd sizes in fake device memory, two larger ones,
    a strided one, an empty one, and a host `step` scalar, as an optimizer state would have."""
    g = torch.Generator().manual_seed(7)
    host: dict[str, Any] = {}
    for i in range(n):
        dtype = (torch.float32, torch.bfloat16, torch.int8, torch.float64)[i % 4]
        numel = 1 + (i * 37) % 700
        host[f"p{i:03d}"] = torch.randint(-100, 100, (numel,), generator=g).to(dtype)
    host["big"] = torch.randn(40_000, generator=g)  # 160 KB: written from its own memory
    host["wide"] = torch.randn(32, 300, generator=g).t()  # strided, small: coalesced
    host["empty"] = torch.empty(0, 3)
    host["step"] = torch.tensor(12.0)
    return cuda.to_device(host, keep_on_host=("step",))


def test_coalesced_small_tensors_go_through_one_device_buffer(
    make_engine, targets, fake_kvikio, fake_cuda
):
    """Small device tensors are copied into the coalescing buffer (device memory, registered
    with cuFile in warm()) and written from it in chunks, in windows of `coalesce_bytes`; their
    checksums are computed there all at once, and equal the per-tensor wsum64; restore reads
    them back bit for bit through the GDS read path."""
    fake = fake_kvikio()
    dirs = targets(2)
    eng = kvikio_engine(
        make_engine, dirs, coalesce_below="64KiB", coalesce_bytes="128KiB", chunk_bytes="16KiB"
    )
    state = many_small_state(fake_cuda)
    eng.warm(state)
    buf = eng._cbuf
    assert buf is not None and fake_cuda.is_device(buf) and buf.data_ptr() % 4096 == 0
    result = eng.save(state, "ckpt").wait()
    assert_same_state(eng.load("ckpt", device="cuda"), state)

    small = [k for k, t in state.items() if 0 < t.numel() * t.element_size() < 64 << 10]
    detail = result.detail
    assert detail.coalesced_tensors == len(small) == 302  # the 300, `wide` and `step`
    assert detail.coalesced_bytes == sum(state[k].numel() * state[k].element_size() for k in small)
    assert detail.coalesce_rounds >= 3  # both halves of the buffer, one of them twice
    assert result.copied_tensors == 0  # the strided one went into the buffer by a strided copy
    # Every write is a chunk of the buffer or a piece of `big`: far fewer than the tensors,
    # and all from device memory (the host `step` went into the buffer too).
    writes = [c for c in fake.calls if c.op == "pwrite"]
    assert 0 < len(writes) < 40 < len(small)
    assert {c.memory for c in writes} == {"device"}
    assert max(c.size for c in writes) <= 16 << 10
    # The buffer was registered with the state's device memory, and the writes say so.
    assert detail.registered_bytes >= buf.numel() and detail.unregistered_device_bytes == 0
    # wsum64 from the buffer, one digest per tensor, as if each were hashed alone.
    m = read_manifest(dirs)
    by_path = {e["path"]: e for e in m["tensors"]}
    for k in small + ["big"]:
        flat = state[k].detach().contiguous().reshape(-1).view(torch.uint8)
        assert by_path[f"[{k!r}]"]["wsum64"] == checksums.device_checksum(flat), k
        assert by_path[f"[{k!r}]"]["xxh3"] is None


def test_coalescing_off_writes_each_tensor_from_its_memory(
    make_engine, targets, fake_kvikio, fake_cuda
):
    fake = fake_kvikio()
    eng = kvikio_engine(make_engine, targets(2), coalesce_below=0)
    state = many_small_state(fake_cuda, n=40)
    result = eng.save(state, "ckpt").wait()
    assert result.detail.coalesced_tensors == 0
    assert len(fake.calls) >= 40 + 1  # one write at least per tensor with bytes
    assert_same_state(eng.load("ckpt", device="cuda"), state)


# -- issue 33: kvikio's own compat reasons, its pinned bounce buffers, registrations released ----


@pytest.mark.parametrize(
    ("machine", "named"),
    [
        (
            {"_libcufile_error": lambda: "libcufile.so.0: cannot open shared object file"},
            "does not load",
        ),
        ({"_run_udev_readable": lambda: False}, "/run/udev is not a readable directory"),
        ({"_in_wsl": lambda: True}, "running in WSL"),
    ],
)
def test_compat_names_the_check_of_kvikios_that_failed(
    make_engine, targets, fake_kvikio, fake_cuda, monkeypatch, machine, named
):
    """kvikio's AUTO mode falls back to POSIX when libcufile does not load, when /run/udev is
    not readable (a container without the volume) or in WSL; the label says which."""
    fake_kvikio(cufile_loads=False)
    healthy = {"_libcufile_error": lambda: None, "_run_udev_readable": lambda: True}
    for name, fn in {**healthy, "_in_wsl": lambda: False, **machine}.items():
        monkeypatch.setattr(gds.kvikio_lib, name, fn)
    eng = kvikio_engine(make_engine, targets(1))
    result = eng.save(mixed_state(fake_cuda), "ckpt").wait()
    assert result.gds_mode == "compat"
    (why,) = [r for r in result.detail.compat_reasons if r.startswith("kvikio prefers")]
    assert named in why and why.count(";") == 0  # that check, and only that one


def test_compat_asked_for_is_named(make_engine, targets, fake_kvikio, fake_cuda):
    fake = fake_kvikio()
    fake.values["compat_mode"] = fake.modules["kvikio"].CompatMode.ON  # KVIKIO_COMPAT_MODE=ON
    assert gds.compat_reasons(gds.import_kvikio()) == [
        "compat mode is asked for (KVIKIO_COMPAT_MODE=ON or set in kvikio.defaults)"
    ]


def test_a_compat_save_counts_kvikios_pinned_bounce_buffers(
    make_engine, targets, fake_kvikio, fake_cuda
):
    """kvikio's compat path stages device bytes through a pinned bounce buffer per running task,
    kept in its pool: num_threads x bounce_buffer_size, derived and said so; a GDS save pins
    nothing of kvikio's."""
    fake_kvikio()
    eng = kvikio_engine(make_engine, targets(2), threads_per_target=3)
    result = eng.save(mixed_state(fake_cuda), "gds").wait()
    assert result.gds_mode == "gds" and result.pinned_bytes == 0 == eng.pinned_bytes
    eng.close()
    fake_kvikio(cufile_loads=False)
    eng = kvikio_engine(make_engine, targets(2), threads_per_target=3)
    result = eng.save(mixed_state(fake_cuda), "compat").wait()
    assert result.gds_mode == "compat"
    assert result.pinned_bytes == eng.pinned_bytes == 6 * 16 << 20  # 3 x 2 threads, 16 MiB
    assert "num_threads x bounce_buffer_size" in result.detail.pinned_bytes_derived


def test_release_deregisters_and_lets_the_state_go(make_engine, targets, fake_kvikio, fake_cuda):
    """The registrations keep views of the state's device memory: release() deregisters them
    and drops the views, so that a state released is not held while the next one is built;
    warm() registers the next one."""
    import gc
    import weakref

    fake = fake_kvikio()
    eng = kvikio_engine(make_engine, targets(1))
    state = mixed_state(fake_cuda)
    eng.warm(state)
    assert fake.registered and eng._registered
    views = [weakref.ref(mem) for mem, _ in eng._registered.values()]
    eng.release()
    gc.collect()
    assert fake.registered == {} and eng._registered == {} and eng._registered_ptrs == {}
    assert all(v() is None for v in views)
    eng.warm(state)  # and again, for a save
    assert fake.registered
    eng.save(state, "ckpt").wait()
    assert_same_state(eng.load("ckpt", device="cuda"), state)


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
