"""The environment block stored with every run (env.json): enough to tell whether two runs can
be compared, and to invalidate one that was not what it claimed.

Host, CPU, memory, kernel; filesystem type, mount point and block device of each target (and
whether they share one device, in which case SSD-count scaling is not real scaling); GPU model,
driver and PCIe link; kvikio and cuFile versions and mode; package versions; git commit.
"""

from __future__ import annotations

import glob
import importlib.metadata
import os
import platform
import shutil
import socket
import subprocess
from collections.abc import Mapping
from typing import Any

import psutil
import torch

from bench.measure import witness

PACKAGES = [
    "torch",
    "numpy",
    "pandas",
    "matplotlib",
    "pydantic",
    "xxhash",
    "bitmath",
    "psutil",
    "kvikio-cu12",
    "kvikio-cu13",
    "cupy-cuda12x",
    "cupy-cuda13x",
    "ckptbench",
]


def _run(cmd: list[str], cwd: str | None = None) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, cwd=cwd, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _block_device(path: str) -> dict[str, Any]:
    """The block device behind a path, from sysfs: name, model, rotational, block sizes."""
    st = os.stat(path)
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    info: dict[str, Any] = {"dev": f"{major}:{minor}"}
    sys_dev = f"/sys/dev/block/{major}:{minor}"
    if not os.path.exists(sys_dev):
        return info
    real = os.path.realpath(sys_dev)
    info["name"] = os.path.basename(real)
    # A partition's queue/ and device/ live in its parent disk's directory.
    disk = real if os.path.exists(os.path.join(real, "queue")) else os.path.dirname(real)
    for key, rel in [
        ("model", "device/model"),
        ("rotational", "queue/rotational"),
        ("logical_block_size", "queue/logical_block_size"),
        ("max_sectors_kb", "queue/max_sectors_kb"),
        ("scheduler", "queue/scheduler"),
    ]:
        try:
            with open(os.path.join(disk, rel)) as f:
                info[key] = f.read().strip()
        except OSError:
            pass
    info["disk"] = os.path.basename(disk)
    return info


def targets_info(targets: list[str]) -> dict[str, Any]:
    """Per-target filesystem and device, and whether all targets share one device."""
    rows: list[dict[str, Any]] = []
    for t in targets:
        usage = shutil.disk_usage(t)
        rows.append(
            {
                "path": t,
                **witness.mount_of(t),
                "block": _block_device(t),
                # the devices whose counters witness the saves (bench.measure.witness)
                "witness": witness.chain(t).to_json(),
                "free_bytes": usage.free,
                "total_bytes": usage.total,
            }
        )
    devs = {r["block"]["dev"] for r in rows}
    return {
        "targets": rows,
        "distinct_devices": len(devs),
        "shared_device": len(devs) == 1 and len(rows) > 1,
    }


def gpu_info() -> dict[str, Any]:
    if not torch.cuda.is_available():
        return {"present": False}
    info: dict[str, Any] = {
        "present": True,
        "name": torch.cuda.get_device_name(0),
        "cuda": torch.version.cuda,
        "count": torch.cuda.device_count(),
    }
    q = _run(
        [
            "nvidia-smi",
            "--query-gpu=driver_version,pcie.link.gen.current,pcie.link.width.current",
            "--format=csv,noheader",
        ]
    )
    if q:
        parts = [p.strip() for p in q.splitlines()[0].split(",")]
        if len(parts) == 3:
            info.update(driver=parts[0], pcie_gen=parts[1], pcie_width=parts[2])
    return info


def packages() -> dict[str, str]:
    out = {}
    for p in PACKAGES:
        try:
            out[p] = importlib.metadata.version(p)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def git_commit() -> dict[str, Any]:
    here = os.path.dirname(os.path.abspath(__file__))
    commit = _run(["git", "rev-parse", "HEAD"], cwd=here)
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here)
    return {"commit": commit, "dirty": bool(dirty) if dirty is not None else None}


def vm_info() -> dict[str, Any]:
    """Whether this is a virtual machine, and whether a memory balloon is bound: a balloon may
    hand freed guest memory back to the host, so memory touched for the first time after a free
    (new page-cache pages, fresh buffers) pays a host fault per page (measured on such a VM:
    ~1 GB/s against ~16 GB/s for memory reused at once)."""
    try:
        with open("/proc/cpuinfo") as f:
            hypervisor = any(line.startswith("flags") and " hypervisor" in line for line in f)
    except OSError:
        hypervisor = None
    balloon = False
    root = "/sys/bus/virtio/drivers/virtio_balloon"
    if os.path.isdir(root):
        balloon = any(e.startswith("virtio") for e in os.listdir(root))
    return {
        "hypervisor": hypervisor,
        "memory_balloon": balloon,
        "thp": thp_mode(),
        # torch's CPU allocator on transparent huge pages when set to 1 (bench/PERF.md)
        "torch_thp_alloc": os.environ.get("THP_MEM_ALLOC_ENABLE"),
        "damon": damon_actions(),
    }


def damon_actions(root: str = "/sys/kernel/mm/damon/admin/kdamonds") -> list[str] | None:
    """The actions of the kernel's running DAMON schemes (e.g. `pageout`: proactive reclaim of
    cold memory, on the development VM for cold page cache), a background actor beside the
    benchmark; None where DAMON's sysfs is absent."""
    if not os.path.isdir(root):
        return None
    out: list[str] = []
    for k in sorted(os.listdir(root)):
        try:
            with open(os.path.join(root, k, "state")) as f:
                if f.read().strip() != "on":
                    continue
        except OSError:
            continue
        for path in sorted(glob.glob(os.path.join(root, k, "contexts/*/schemes/*/action"))):
            try:
                with open(path) as f:
                    out.append(f.read().strip())
            except OSError:
                pass
    return out


def thp_mode() -> str | None:
    """The transparent huge page mode (always, madvise or never): the staging buffers ask for
    huge pages, which they get unless it is `never`."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.index("[") + 1 : text.index("]")] if "[" in text else text.strip()


def node_info() -> dict[str, Any]:
    """What one host of a run across hosts is, beside its storage (env.json
    `ranks.nodes[N].env`): its name, CPU, memory, kernel, OS and GPU."""
    return {
        "host": socket.gethostname(),
        "cpu": {"model": cpu_model(), "logical_cores": os.cpu_count()},
        "memory_bytes": psutil.virtual_memory().total,
        "kernel": platform.release(),
        "os": platform.platform(),
        "gpu": gpu_info(),
    }


def collect(targets: list[str], blocks: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The whole environment block for a run over `targets`. `blocks` are what engines add
    (`bench.engines.environment_blocks()`, e.g. gds's `kvikio`): the run asks the engines and
    hands them in, so that this module never imports an engine."""
    vm = psutil.virtual_memory()
    return {
        "host": socket.gethostname(),
        "cpu": {"model": cpu_model(), "logical_cores": os.cpu_count()},
        "memory_bytes": vm.total,
        "kernel": platform.release(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "user_is_root": os.geteuid() == 0,
        "vm": vm_info(),
        "storage": targets_info(targets),
        "gpu": gpu_info(),
        **(blocks or {}),
        "packages": packages(),
        "git": git_commit(),
    }
