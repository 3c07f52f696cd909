"""How this process's threads wait for a GPU: sleeping, not spinning (no torch imported here:
the CLI asks first thing, before anything makes a CUDA context).

With no more CUDA contexts than CPUs, CUDA's default scheduling (CU_CTX_SCHED_AUTO) spins a CPU
while a thread waits for the GPU (cuCtxCreate's documentation). The process's CPU time, which
bench.measure.hostcost counts, would then charge a save for every thread spinning through a
device-to-host copy, a stream synchronisation or a kvikio task. So a run asks every device's
primary context for CU_CTX_SCHED_BLOCKING_SYNC before torch makes it (a waiting thread sleeps on
a primitive), reads back what is in force, and env.json says it (`cuda_sync`).
CKPTBENCH_CUDA_SYNC=auto leaves CUDA's own default. Waiting on an event is another matter: it
busy-waits unless the event was made with cudaEventBlockingSync, whatever the context's
scheduling (cudaEventSynchronize's documentation), so the engines make theirs blocking.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

CU_CTX_SCHED = {0: "auto", 1: "spin", 2: "yield", 4: "blocking_sync"}
CU_CTX_SCHED_BLOCKING_SYNC = 4
_sync_info: dict[str, Any] | None = None


def libcuda() -> Any:
    """The CUDA driver library (tests put a fake in its place)."""
    return ctypes.CDLL("libcuda.so.1")


def blocking_sync() -> dict[str, Any]:
    """Ask CUDA to block rather than spin while a thread waits for any of this machine's GPUs
    (once per process, before their contexts are made: call it first thing); what is in force
    afterwards on the GPUs, for env.json `cuda_sync`: `asked`, `in_force` (auto, spin, yield,
    blocking_sync; n/a without a CUDA driver; `mixed` if the GPUs differ), `context_active`
    (whether a context existed when asked) and `why` where it could not be set."""
    global _sync_info
    if _sync_info is not None:
        return _sync_info
    asked = os.environ.get("CKPTBENCH_CUDA_SYNC", "blocking_sync")
    info: dict[str, Any] = {"asked": asked, "in_force": "n/a", "why": ""}
    try:
        cu = libcuda()
    except OSError as e:
        info["why"] = f"no CUDA driver ({' '.join(str(e).split())[:120]})"
        _sync_info = info
        return info
    count, dev, flags, active = ctypes.c_int(), ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()

    def call(name: str, *args: Any) -> None:
        rc = getattr(cu, name)(*args)
        if rc:
            raise RuntimeError(f"{name} returned CUresult {rc}")

    try:
        call("cuInit", 0)
        call("cuDeviceGetCount", ctypes.byref(count))
        modes, was_active = set(), False
        for ordinal in range(count.value):
            call("cuDeviceGet", ctypes.byref(dev), ordinal)
            call("cuDevicePrimaryCtxGetState", dev, ctypes.byref(flags), ctypes.byref(active))
            was_active = was_active or bool(active.value)
            if asked == "blocking_sync":
                try:
                    set_flags = cu.cuDevicePrimaryCtxSetFlags_v2
                except AttributeError:  # a driver before CUDA 11: the call's first version
                    set_flags = cu.cuDevicePrimaryCtxSetFlags
                rc = set_flags(dev, CU_CTX_SCHED_BLOCKING_SYNC)
                if rc:
                    info["why"] = f"cuDevicePrimaryCtxSetFlags returned CUresult {rc}"
            call("cuDevicePrimaryCtxGetState", dev, ctypes.byref(flags), ctypes.byref(active))
            modes.add(CU_CTX_SCHED.get(flags.value & 7, f"flags {flags.value}"))
        info["context_active"] = was_active
        info["in_force"] = modes.pop() if len(modes) == 1 else ("mixed" if modes else "n/a")
        if asked not in ("blocking_sync", "auto"):
            info["why"] = f"CKPTBENCH_CUDA_SYNC={asked!r} is neither blocking_sync nor auto"
    except (RuntimeError, AttributeError) as e:
        info["why"] = str(e)
        info["in_force"] = "unknown"
    if asked == "blocking_sync" and info["in_force"] != "blocking_sync" and not info["why"]:
        info["why"] = "the driver kept its own scheduling"
    _sync_info = info
    return info
