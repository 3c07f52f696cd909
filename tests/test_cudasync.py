"""How the process's threads wait for the GPU (issue 33): bench.common.cudasync asks every
GPU's primary context for blocking-sync scheduling before anything makes it, against a fake
CUDA driver that follows the driver API's contract (out-parameters by reference, CUresult
codes); the engines' events are blocking; the gds engine waits for the stream that produced the
state before its first write."""

from __future__ import annotations

import ast
import ctypes
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from bench import cli
from bench.common import cudasync
from bench.common.devices import Device

BLOCKING = cudasync.CU_CTX_SCHED_BLOCKING_SYNC


class FakeDriver:
    """libcuda.so.1: `n` GPUs whose primary contexts hold `flags`; cuDevicePrimaryCtxSetFlags_v2
    sets them (or returns `refuse`, a CUresult)."""

    def __init__(self, n: int = 2, flags: int = 0, active: bool = False, refuse: int = 0) -> None:
        self.flags = [flags] * n
        self.active = active
        self.refuse = refuse
        self.calls: list[tuple[Any, ...]] = []

    def cuInit(self, flags: int) -> int:
        self.calls.append(("cuInit", flags))
        return 0

    def cuDeviceGetCount(self, count: Any) -> int:
        count._obj.value = len(self.flags)
        return 0

    def cuDeviceGet(self, dev: Any, ordinal: int) -> int:
        dev._obj.value = ordinal
        return 0

    def cuDevicePrimaryCtxGetState(self, dev: ctypes.c_int, flags: Any, active: Any) -> int:
        flags._obj.value = self.flags[dev.value]
        active._obj.value = int(self.active)
        return 0

    def cuDevicePrimaryCtxSetFlags_v2(self, dev: ctypes.c_int, flags: int) -> int:
        self.calls.append(("set", dev.value, flags))
        if self.refuse:
            return self.refuse
        self.flags[dev.value] = flags
        return 0


class OldDriver(FakeDriver):
    """A driver before CUDA 11: the call has no _v2 version."""

    def __getattribute__(self, name: str) -> Any:
        if name == "cuDevicePrimaryCtxSetFlags_v2":
            raise AttributeError(name)
        return super().__getattribute__(name)

    def cuDevicePrimaryCtxSetFlags(self, dev: ctypes.c_int, flags: int) -> int:
        return FakeDriver.cuDevicePrimaryCtxSetFlags_v2(self, dev, flags)


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """`driver(fake)`: the process's driver is `fake` (or absent: None); asked afresh."""
    monkeypatch.setattr(cudasync, "_sync_info", None)
    monkeypatch.delenv("CKPTBENCH_CUDA_SYNC", raising=False)

    def use(fake: Any) -> Any:
        def load() -> Any:
            if fake is None:
                raise OSError("libcuda.so.1: cannot open shared object file")
            return fake

        monkeypatch.setattr(cudasync, "libcuda", load)
        return fake

    yield use


def test_every_gpu_is_asked_to_block_and_the_mode_is_read_back(driver: Any) -> None:
    fake = driver(FakeDriver(n=2))
    info = cudasync.blocking_sync()
    assert info == {
        "asked": "blocking_sync",
        "in_force": "blocking_sync",
        "why": "",
        "context_active": False,
    }
    assert [c for c in fake.calls if c[0] == "set"] == [("set", 0, BLOCKING), ("set", 1, BLOCKING)]
    assert cudasync.blocking_sync() is info and fake.calls.count(("cuInit", 0)) == 1  # once


def test_a_driver_that_refuses_leaves_its_mode_said(driver: Any) -> None:
    driver(FakeDriver(n=1, flags=0, active=True, refuse=708))
    info = cudasync.blocking_sync()
    assert info["in_force"] == "auto" and info["context_active"] is True
    assert info["why"] == "cuDevicePrimaryCtxSetFlags returned CUresult 708"


def test_an_old_driver_takes_the_first_version_of_the_call(driver: Any) -> None:
    fake = driver(OldDriver(n=1))
    assert cudasync.blocking_sync()["in_force"] == "blocking_sync"
    assert ("set", 0, BLOCKING) in fake.calls


def test_auto_leaves_cudas_default(driver: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPTBENCH_CUDA_SYNC", "auto")
    fake = driver(FakeDriver(n=1, flags=1))
    info = cudasync.blocking_sync()
    assert info["asked"] == "auto" and info["in_force"] == "spin" and info["why"] == ""
    assert not [c for c in fake.calls if c[0] == "set"]


def test_no_driver_no_mode(driver: Any) -> None:
    driver(None)
    info = cudasync.blocking_sync()
    assert info["in_force"] == "n/a" and info["why"].startswith("no CUDA driver")


def test_the_cli_asks_before_anything_touches_cuda(
    driver: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ckptbench engines` asks torch whether CUDA is there (gds's back end): after the ask."""
    order: list[str] = []
    driver(FakeDriver(n=1))
    real = cudasync.blocking_sync

    def asked() -> Any:
        order.append("blocking_sync")
        return real()

    monkeypatch.setattr(cudasync, "blocking_sync", asked)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: order.append("cuda") or False)
    assert cli.main(["engines"]) == 0
    assert order[0] == "blocking_sync" and "cuda" in order


def test_a_run_on_cuda_says_how_its_threads_waited(
    driver: Any, scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench.config import sweep as config
    from bench.run.core import Core

    driver(FakeDriver(n=1))
    cfg = config.from_dict(
        {"engines": ["torch-save"], "total_sizes": ["1MiB"], "tensor_sizes": ["1MiB"]}
    )
    core = Core(cfg, Device("cuda", torch.device("cpu")), str(scratch), quiet=True)
    core.open({}, [str(scratch)], ["torch-save"])
    assert core.env["cuda_sync"]["in_force"] == "blocking_sync"
    host = Core(cfg, Device("host-emulated", torch.device("cpu")), str(scratch), quiet=True)
    host.open({}, [str(scratch)], ["torch-save"])
    assert "cuda_sync" not in host.env


BENCH = Path(cli.__file__).parent


def test_every_cuda_event_of_the_engines_is_blocking() -> None:
    """cudaEventSynchronize busy-waits on an event made without cudaEventBlockingSync, whatever
    the context's scheduling: every torch.cuda.Event the project makes is blocking."""
    found, seen = [], 0
    for path in sorted(BENCH.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "torch.cuda.Event":
                seen += 1
                blocking = [k for k in node.keywords if k.arg == "blocking"]
                if not (blocking and ast.unparse(blocking[0].value) == "True"):
                    found.append(f"{path.relative_to(BENCH.parent)}:{node.lineno}")
    assert seen >= 3 and found == []  # the overlap's two, the current stream's wait
