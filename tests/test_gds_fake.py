"""The gds engine's kvikio calls, checked against a fake kvikio that writes host memory.

`FakeCuFile` stands in for `kvikio.CuFile`: it writes host tensors with os.pwrite and records
every call, so the logic around kvikio (which pieces go where, waiting on every future, closing
every file, fsync, the manifest, and how `gds_mode` is told) runs on any machine. The real
kvikio path runs only in the test marked `gpu`.
"""

from __future__ import annotations

import functools
import json
import os
import re
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from bench.engines import gds
from bench.errors import UserError


@dataclass(frozen=True)
class Call:
    """One CuFile.pwrite: the file, the size and offset asked for, and the buffer's length."""

    path: str
    size: int
    offset: int
    buf_bytes: int


class FakeFuture:
    """kvikio's IOFuture: `get()` returns the bytes written."""

    def __init__(self, n: int, error: OSError | None = None) -> None:
        self.n = n
        self.error = error
        self.got = False

    def get(self) -> int:
        self.got = True
        if self.error is not None:
            raise self.error
        return self.n


class FakeCuFile:
    """kvikio.CuFile for host tensors: writes with os.pwrite, records calls into `kvikio`."""

    def __init__(self, kvikio: types.ModuleType, path: str, flags: str = "r") -> None:
        if flags != "w":
            raise ValueError(f"the fake only writes, got flags {flags!r}")
        self.kvikio = kvikio
        self.path = os.fspath(path)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.closed = False
        self.futures: list[FakeFuture] = []
        self.unawaited_at_close: int | None = None
        kvikio.files.append(self)

    def pwrite(self, buf: Any, size: int | None = None, file_offset: int = 0) -> FakeFuture:
        assert not self.closed, "pwrite on a closed file"
        assert isinstance(buf, torch.Tensor) and buf.dtype == torch.uint8 and buf.dim() == 1
        assert buf.is_contiguous()
        n = buf.numel() if size is None else size
        assert n <= buf.numel()
        call = Call(self.path, n, file_offset, buf.numel())
        self.kvikio.calls.append(call)
        failing = self.kvikio.fail_on_call == len(self.kvikio.calls)
        error = OSError(5, "fake I/O error", self.path) if failing else None
        if error is not None and self.kvikio.fail_in == "pwrite":
            raise error
        written = os.pwrite(self.fd, memoryview(buf.numpy())[:n], file_offset)
        fut = FakeFuture(written - self.kvikio.short_by, error)
        self.futures.append(fut)
        return fut

    def close(self) -> None:
        if not self.closed:
            os.close(self.fd)
            self.closed = True
            self.unawaited_at_close = sum(not f.got for f in self.futures)


def make_fake_kvikio(*, compat: bool = False, gds_available: bool = True) -> types.ModuleType:
    """A module with the parts of kvikio the gds engine uses, and the fake's records."""
    fake_kvikio = types.ModuleType("kvikio")
    fake_kvikio.files = []
    fake_kvikio.calls = []
    fake_kvikio.fail_on_call = None  # 1-based index of a pwrite call that fails...
    fake_kvikio.fail_in = "get"  # ...in pwrite itself or in its future's get()
    fake_kvikio.short_by = 0  # every future reports this many bytes fewer than written
    fake_kvikio.CuFile = functools.partial(FakeCuFile, fake_kvikio)
    fake_kvikio.defaults = types.SimpleNamespace(is_compat_mode_preferred=lambda: compat)
    fake_kvikio.cufile_driver = types.SimpleNamespace(
        properties=types.SimpleNamespace(is_gds_available=gds_available)
    )
    return fake_kvikio


@pytest.fixture
def fake_kvikio(monkeypatch) -> Callable[..., types.ModuleType]:
    """`fake_kvikio(compat=..., gds_available=...)` installs a fake kvikio and returns it."""

    def install(**kw: Any) -> types.ModuleType:
        fake = make_fake_kvikio(**kw)
        monkeypatch.setattr(gds, "import_kvikio", lambda: fake)
        return fake

    return install


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def sample_state(device: str = "cpu") -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    flat = torch.randint(-(2**40), 2**40, (6000,), generator=g)
    state = {
        "w": torch.randn(96, 80, generator=g),
        "wt": torch.randn(40, 70, generator=g).t(),  # non-contiguous: copied first
        "half": torch.randn(4097, generator=g).to(torch.bfloat16),
        "offset_view": flat[3:5003],  # contiguous, unaligned start
        "step": torch.tensor(7),
        "empty": torch.empty(0, 3),
    }
    return {k: v.to(device) for k, v in state.items()}


def assert_round_trip(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert list(got) == list(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
        assert torch.equal(bits(got[k]), bits(want[k])), k


def read_manifest(dirs: list[str], name: str = "ckpt") -> dict[str, Any]:
    with open(Path(dirs[0]) / name / "manifest.json") as f:
        return json.load(f)


def kvikio_engine(make_engine: Any, dirs: list[str], **opts: Any) -> Any:
    return make_engine("gds", dirs, io="kvikio", device="host-emulated", chunk_bytes="8KiB", **opts)


def test_kvikio_calls_match_the_manifest(make_engine, targets, fake_kvikio):
    fake = fake_kvikio()
    dirs = targets(3)
    eng = kvikio_engine(make_engine, dirs)
    state = sample_state()
    pending = eng.save(state, "ckpt")
    assert pending.done()  # the stall lasts until durable
    result = pending.wait()
    assert_round_trip(eng.load("ckpt"), state)

    assert result.gds_mode == "gds"
    assert result.copied_tensors == 1
    assert result.bytes == sum(t.numel() * t.element_size() for t in state.values())
    assert result.targets_used == 3
    assert result.stall_s <= result.total_s

    m = read_manifest(dirs)
    data = {
        int(t): os.path.join(dirs[int(t)], "ckpt", info["file"]) for t, info in m["files"].items()
    }
    # One CuFile per data file, opened for writing, closed, with every future awaited first.
    assert sorted(f.path for f in fake.files) == sorted(data.values())
    assert all(f.closed and f.unawaited_at_close == 0 for f in fake.files)
    # Every pwrite is one extent of the manifest, and every extent was one pwrite.
    want = sorted((data[t], length, off) for e in m["tensors"] for t, off, length in e["extents"])
    assert sorted((c.path, c.size, c.offset) for c in fake.calls) == want
    assert all(c.buf_bytes == c.size for c in fake.calls)
    assert len(fake.calls) > len(state)  # chunks really split the tensors
    for t, path in data.items():
        assert os.path.getsize(path) == m["files"][str(t)]["bytes"]


@pytest.mark.parametrize(
    ("compat", "gds_available", "mode"),
    [
        (False, True, "gds"),
        (True, True, "compat"),
        (False, False, "compat"),
        (True, False, "compat"),
    ],
)
def test_gds_mode_is_told_by_kvikio(make_engine, targets, fake_kvikio, compat, gds_available, mode):
    fake_kvikio(compat=compat, gds_available=gds_available)
    eng = kvikio_engine(make_engine, targets(2))
    state = sample_state()
    result = eng.save(state, "ckpt").wait()
    assert result.gds_mode == mode
    assert_round_trip(eng.load("ckpt"), state)


def test_gds_mode_is_compat_when_kvikio_cannot_tell(make_engine, targets, fake_kvikio):
    fake = fake_kvikio()
    del fake.cufile_driver  # an older kvikio without the driver properties
    eng = kvikio_engine(make_engine, targets(1))
    assert eng.save(sample_state(), "a").wait().gds_mode == "compat"

    def broken() -> bool:
        raise RuntimeError("cuFile driver not loaded")

    fake.defaults = types.SimpleNamespace(is_compat_mode_preferred=broken)
    assert eng.save(sample_state(), "b").wait().gds_mode == "compat"


@pytest.mark.parametrize(("compat", "gds_available"), [(True, True), (False, False)])
def test_allow_compat_false_refuses_compat_mode(
    make_engine, targets, fake_kvikio, compat, gds_available
):
    fake = fake_kvikio(compat=compat, gds_available=gds_available)
    with pytest.raises(UserError, match="compat mode and allow_compat is false"):
        kvikio_engine(make_engine, targets(1), allow_compat=False)
    assert fake.files == []


def test_allow_compat_false_runs_with_gds(make_engine, targets, fake_kvikio):
    fake_kvikio()
    eng = kvikio_engine(make_engine, targets(1), allow_compat=False)
    assert eng.save(sample_state(), "ckpt").wait().gds_mode == "gds"


def test_kvikio_that_does_not_import(make_engine, targets, monkeypatch):
    def no_kvikio() -> Any:
        raise ImportError("No module named 'kvikio'")

    monkeypatch.setattr(gds, "import_kvikio", no_kvikio)
    with pytest.raises(UserError, match=r"io=kvikio but kvikio does not import \(No module"):
        kvikio_engine(make_engine, targets(1))


def test_auto_on_the_host_emulates_without_kvikio(make_engine, targets, monkeypatch):
    def must_not_be_called() -> Any:
        raise AssertionError("io=auto on the host must not use kvikio")

    monkeypatch.setattr(gds, "import_kvikio", must_not_be_called)
    eng = make_engine("gds", targets(1), io="auto", device="host-emulated")
    state = sample_state()
    assert eng.save(state, "ckpt").wait().gds_mode == "emulated"
    assert_round_trip(eng.load("ckpt"), state)


@pytest.mark.parametrize("failure", ["pwrite", "get", "short"])
def test_failed_write_closes_files_and_commits_nothing(make_engine, targets, fake_kvikio, failure):
    fake = fake_kvikio()
    if failure == "short":
        fake.short_by = 1
    else:
        fake.fail_on_call, fake.fail_in = 3, failure
    dirs = targets(2)
    eng = kvikio_engine(make_engine, dirs)
    with pytest.raises(OSError) as e:
        eng.save(sample_state(), "ckpt")
    if failure == "short":
        assert "kvikio wrote" in str(e.value)
        assert re.search(r"/ckpt/data-0\.[0-9a-f]{16}\.bin", str(e.value)), str(e.value)
    else:
        assert "fake I/O error" in str(e.value)
    # Every write issued was awaited before its file closed, the failed one included.
    assert fake.files and all(f.closed and f.unawaited_at_close == 0 for f in fake.files)
    if failure != "pwrite":
        assert len(fake.calls) == sum(len(f.futures) for f in fake.files) > 3
    assert not (Path(dirs[0]) / "ckpt" / "manifest.json").exists()
    # The failed save removed its own files (data and marker): nothing is left to clean.
    assert all(os.listdir(Path(d) / "ckpt") == [] for d in dirs)
    assert eng.status("ckpt") == "absent"
    with pytest.raises(UserError, match="no complete checkpoint"):
        eng.load("ckpt")


@pytest.mark.parametrize("failure", ["pwrite", "get", "short"])
def test_failed_write_keeps_the_previous_checkpoint(make_engine, targets, fake_kvikio, failure):
    fake = fake_kvikio()
    dirs = targets(2)
    eng = kvikio_engine(make_engine, dirs)
    state = sample_state()
    eng.save(state, "ckpt").wait()
    before = {d: sorted(os.listdir(Path(d) / "ckpt")) for d in dirs}
    if failure == "short":
        fake.short_by = 1
    else:
        fake.fail_on_call, fake.fail_in = len(fake.calls) + 3, failure
    with pytest.raises(OSError):
        eng.save({k: v + 1 if v.dtype != torch.bool else v for k, v in state.items()}, "ckpt")
    assert {d: sorted(os.listdir(Path(d) / "ckpt")) for d in dirs} == before
    assert eng.status("ckpt") == "complete"
    assert_round_trip(eng.load("ckpt"), state)


@pytest.mark.gpu
def test_real_kvikio_on_cuda(make_engine, targets):
    reason = gds.kvikio_unavailable()
    if reason:
        pytest.skip(reason)
    kvikio = gds.import_kvikio()
    dirs = targets(2)
    eng = make_engine("gds", dirs, io="kvikio", device="cuda", chunk_bytes="64KiB")
    state = sample_state("cuda")
    result = eng.save(state, "ckpt").wait()
    assert result.gds_mode == gds.kvikio_mode(kvikio)
    assert result.gds_mode in ("gds", "compat")
    assert result.copied_tensors == 1
    loaded = eng.load("ckpt", device="cuda")
    assert all(t.device.type == "cuda" for t in loaded.values())
    assert_round_trip(loaded, state)
    m = read_manifest(dirs)
    for t, info in m["files"].items():
        assert os.path.getsize(Path(dirs[int(t)]) / "ckpt" / info["file"]) == info["bytes"]
