"""The memory ceilings: a copy into a warm host buffer by the snapshot's own mechanism (8 MiB
pieces from one queue over `threads` threads), on CUDA a device-to-host copy into exactly pinned
memory and a host-to-device copy from it, and serialisation (torch.save of a state into memory,
no disk: the baselines' own ceiling). Each returns the bandwidth of every timed run, after an
untimed warm-up."""

from __future__ import annotations

import io
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from bench.common.devices import Device
from bench.measure.ceilings.data import random_bytes
from bench.storage import odirect
from bench.storage.staging import COPY_PIECE, PinnedBuffer, copy_tasks, run_copies

COPY_REPS = 5  # timed runs of a memory ceiling before and after the sweep


def copy_bandwidth(
    nbytes: int,
    reps: int = COPY_REPS,
    threads: int = 1,
    keep: dict[int, Any] | None = None,
) -> list[float]:
    """Copy bandwidth (B/s of each run) into a warm host buffer with the snapshot's own
    mechanism (pieces over `threads` threads): one untimed copy first, then `reps` timed ones.
    `keep`: host buffers kept there for the next call of the same size (the caller releases
    them with `release`), so that a probe repeated through a sweep does not fault in fresh
    memory each time."""
    if keep is not None and nbytes in keep:
        dst, src_buf = keep[nbytes]
    else:
        if keep is not None:
            release(keep)  # one size kept at a time
        dst = odirect.HostBuffer(nbytes, prefault=True)
        # The source on huge pages too, like the emulated device memory the snapshot copies
        # from (bench.workloads.synthetic.DeviceMemory).
        src_buf = odirect.HostBuffer(nbytes, prefault=False)
        random_bytes(nbytes, out=src_buf.array)
        if keep is not None:
            keep[nbytes] = (dst, src_buf)
    src = src_buf.array[:nbytes]
    tasks = copy_tasks([(dst.array[:nbytes], src)], COPY_PIECE)
    pool = ThreadPoolExecutor(max_workers=threads) if threads > 1 else None

    def copy() -> None:
        if pool is not None and len(tasks) > 1:
            list(pool.map(run_copies, tasks))
        else:
            for t in tasks:
                run_copies(t)

    try:
        copy()  # warm-up: caches, threads
        times = []
        for _ in range(reps):
            t0 = time.perf_counter_ns()
            copy()
            times.append((time.perf_counter_ns() - t0) / 1e9)
    finally:
        if pool is not None:
            pool.shutdown()
        tasks.clear()  # the views go, so that the mappings can close now
        del src
        if keep is None:
            release({0: (dst, src_buf)})
    return [nbytes / t for t in times]


def d2h_bandwidth(nbytes: int, device: Device, reps: int = COPY_REPS) -> list[float]:
    """Device-to-host bandwidth (B/s of each run) into memory pinned as the engines pin their
    staging (exactly, with cudaHostRegister), released afterwards (torch's pin_memory would
    keep the block pinned in its cache): one untimed copy first, then `reps` timed ones."""
    return _pinned_copy(nbytes, device, reps, to_device=False)


def h2d_bandwidth(nbytes: int, device: Device, reps: int = COPY_REPS) -> list[float]:
    """Host-to-device bandwidth (B/s of each run) from memory pinned as the engines' staging
    is, as `d2h_bandwidth` measures the other way: what bounds a restore through host memory."""
    return _pinned_copy(nbytes, device, reps, to_device=True)


def _pinned_copy(nbytes: int, device: Device, reps: int, to_device: bool) -> list[float]:
    buf = PinnedBuffer(nbytes)
    try:
        pinned = torch.from_numpy(buf.array)[:nbytes]
        dev = torch.empty(nbytes, dtype=torch.uint8, device=device.torch_device).fill_(3)
        if to_device:
            pinned.copy_(torch.from_numpy(random_bytes(nbytes)))
        dst, src = (dev, pinned) if to_device else (pinned, dev)
        dst.copy_(src, non_blocking=True)  # warm-up
        times = []
        for _ in range(reps):
            device.synchronize()
            t0 = time.perf_counter_ns()
            dst.copy_(src, non_blocking=True)
            device.synchronize()
            times.append((time.perf_counter_ns() - t0) / 1e9)
        del pinned, dev, dst, src
    finally:
        buf.close()
    return [nbytes / t for t in times]


def release(keep: dict[int, Any]) -> None:
    """Free the buffers `copy_bandwidth` kept."""
    for bufs in keep.values():
        for b in bufs:
            b.close()
    keep.clear()


def serialize_bandwidth(nbytes: int, tensor_bytes: int, reps: int = 3) -> list[float]:
    """torch.save of `nbytes` of random float32 tensors of `tensor_bytes` each into memory (no
    disk), B/s of each of `reps` runs after a warm-up: the rate a torch.save-based path cannot
    exceed before it writes."""
    n = max(1, nbytes // max(tensor_bytes, 4))
    each = max(1, min(tensor_bytes, nbytes) // 4)
    raw = random_bytes(n * each * 4)
    state = {
        f"t{i}": torch.from_numpy(raw[i * each * 4 : (i + 1) * each * 4].view(np.float32))
        for i in range(n)
    }
    sink = io.BytesIO()
    torch.save(state, sink)  # warm-up; also sizes the buffer
    times = []
    for _ in range(reps):
        sink.seek(0)
        t0 = time.perf_counter_ns()
        torch.save(state, sink)
        times.append((time.perf_counter_ns() - t0) / 1e9)
    total = n * each * 4
    return [total / t for t in times]
