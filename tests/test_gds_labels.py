"""How a gds save is labelled gds or compat (bench/engines/gds/labels.py): files cuFile cannot
take, kvikio's own compat reasons, GDS's filesystem list, nvidia-fs's byte counters, and the
pinned bounce buffers a compat save counts.

The engine runs over FakeKvikio and FakeCuda (tests/fake_kvikio.py), which follow kvikio's
real contracts; its fixtures and sample states are in tests/conftest.py.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch
from conftest import (
    assert_same_state,
    kvikio_engine,
    mixed_state,
    sample_state,
)
from fake_kvikio import FakeKvikio

from bench.common.errors import UserError
from bench.engines import gds


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
