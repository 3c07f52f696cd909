"""How a gds save or restore is labelled `gds` or `compat`: where GDS serves files natively
(NVIDIA's list), nvidia-fs's own byte counters before and after, and the verdict (`label`).
Functions taking `self` are methods of the engine (bench.engines.gds.engine.Gds), kept here by
their job."""

from __future__ import annotations

import re
from typing import Any

from bench.engines.gds import kvikio_lib
from bench.engines.gds.parts import GdsEngine
from bench.measure import env as env_mod

MiB = 1 << 20

# Where GDS serves files natively, from NVIDIA's nvidia-fs documentation ("Key Features",
# docs.nvidia.com/gpudirect-storage/nvidia_fs): "EXT4 in ordered mode on NVMe and NVMe-oF",
# "XFS on NVMe and NVMe-oF", "NFS over RDMA", and "RDMA-capable distributed file systems,
# including DDN EXAScaler [lustre], WekaFS, VAST, IBM Spectrum Scale [gpfs], and BeeGFS".
# Anywhere else (ext4 or xfs on virtio, SATA/SCSI, LVM/device-mapper or loop devices, ext4 in
# writeback or journal data mode, NFS over TCP) cuFile serves the file through POSIX.
NVME_FILESYSTEMS = ("ext4", "xfs")
DISTRIBUTED_GDS_FILESYSTEMS = ("lustre", "gpfs", "wekafs", "beegfs")

# nvidia-fs's statistics: cumulative, system-wide counters of the I/O that went GPU-direct
# (bytes only while its IO stats are enabled: `rw_stats_enabled`).
NVFS_STATS = "/proc/driver/nvidia-fs/stats"


def native_gds_reason(info: dict[str, Any]) -> str | None:
    """Why GDS would not serve target `info` (a row of `env.targets_info`) natively, or None.
    Only used where nvidia-fs keeps no byte counters to tell what really happened."""
    fs = info.get("fstype", "unknown")
    path = info.get("path", "?")
    disk = (info.get("block") or {}).get("disk") or (info.get("block") or {}).get("name") or "?"
    opts = set((info.get("opts") or "").split(","))
    if fs in NVME_FILESYSTEMS:
        if not disk.startswith("nvme"):
            return f"{path} is {fs} on {disk}, not on an NVMe device, which GDS does not serve"
        if fs == "ext4" and opts & {"data=writeback", "data=journal"}:
            return f"{path} is ext4 not in ordered mode, which GDS does not serve"
        return None
    if fs in ("nfs", "nfs4"):
        if "proto=rdma" in opts or "rdma" in opts:
            return None
        return f"{path} is NFS over TCP (GDS serves NFS over RDMA only)"
    if fs in DISTRIBUTED_GDS_FILESYSTEMS:
        return None
    return f"{path} is on {fs}, which GDS does not serve natively"


def nvfs_counters(path: str | None = None) -> dict[str, int] | None:
    """nvidia-fs's cumulative I/O counters, or None where its statistics file is absent.

    Keys: `write_err`, `read_err`, `pg_cache` (writes nvidia-fs sent to the page cache), and,
    while its IO statistics are enabled, `write_ops`, `write_MiB`, `read_ops`, `read_MiB`
    (the byte counts are printed in whole MiB)."""
    try:
        with open(path or NVFS_STATS) as f:
            text = f.read()
    except OSError:
        return None
    out: dict[str, int] = {}
    names = {
        "Writes": {"n": "write_ops", "writeMiB": "write_MiB", "err": "write_err"},
        "Reads": {"n": "read_ops", "readMiB": "read_MiB", "err": "read_err"},
    }
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        key = key.strip()
        if not sep or key not in names:
            continue
        fields = dict(re.findall(r"(?:^|\s)([A-Za-z-]+)=(\d+)", rest))
        for key_name, name in names[key].items():
            if key_name in fields:
                out[name] = int(fields[key_name])
        if key == "Writes" and "pg-cache" in fields:
            out["pg_cache"] = int(fields["pg-cache"])
    return out


def nvfs_verdict(
    before: dict[str, int] | None, after: dict[str, int] | None, device_bytes: int, op: str
) -> tuple[str | None, str | None]:
    """What nvidia-fs's counters say of `device_bytes` moved by `op` (`write` or `read`)
    between two readings: (evidence, reason). `evidence` is None where they cannot tell (no
    statistics file, or its IO statistics off), else a line of what they counted; `reason` is
    why the bytes did not all go GPU-direct, or None.

    The counter is printed floored to whole MiB, so all `device_bytes` went GPU-direct only if it
    grew by at least floor(device_bytes / MiB) (floor(a + b) >= floor(a) + floor(b)); less
    means that at least 1 MiB went another way. Other processes' GDS I/O in the same interval
    counts too: the counters can wrongly confirm, never wrongly deny."""
    if before is None or after is None:
        return None, None
    key = f"{op}_MiB"
    if key not in before or key not in after:
        return None, None
    moved = after[key] - before[key]
    ops = after.get(f"{op}_ops", 0) - before.get(f"{op}_ops", 0)
    want = device_bytes // MiB
    evidence = (
        f"nvidia-fs counted {moved} MiB in {ops} {op}s GPU-direct of {want} MiB on the device"
    )
    if device_bytes and (moved < want or ops < 1):
        return evidence, f"{evidence}: cuFile moved the rest through POSIX"
    if op == "write" and after.get("pg_cache", 0) > before.get("pg_cache", 0):
        n = after["pg_cache"] - before.get("pg_cache", 0)
        return evidence, f"nvidia-fs sent {n} writes to the page cache"
    return evidence, None


def filesystem_reasons(self: GdsEngine) -> list[str]:
    """Why GDS would not serve a target natively (`native_gds_reason`): used to label a
    save only where nvidia-fs keeps no byte counters, and only when cufile.json allows
    cuFile's own compat mode."""
    out = []
    for info in env_mod.targets_info(self.targets)["targets"]:
        why = native_gds_reason(info)
        if why:
            out.append(why)
    return out


def label(
    self: GdsEngine,
    reasons: list[str],
    device_bytes: int,
    nvfs_before: dict[str, int] | None,
    op: str,
) -> tuple[str, str]:
    """(label, evidence) of a save or restore: `compat` if anything in `reasons`, if no
    device bytes, or if the bytes did not go GPU-direct: by nvidia-fs's counters where it
    keeps them, else by the filesystem list (only when cufile.json allows compat mode)."""
    if device_bytes == 0:
        reasons.append("no tensor was in device memory: nothing went over GDS")
    evidence, why = nvfs_verdict(nvfs_before, nvfs_counters(), device_bytes, op)
    if evidence is not None:
        if why:
            reasons.append(why)
    else:
        evidence = (
            "filesystem list: no nvidia-fs statistics"
            if nvfs_before is None
            else "filesystem list: nvidia-fs IO statistics are off (rw_stats_enabled)"
        )
        if kvikio_lib._cufile_allows_compat(self._kvikio) and self._fs_reasons:
            reasons.extend(f"cufile.json allows compat mode and {r}" for r in self._fs_reasons)
    return ("compat" if reasons else "gds"), evidence


# -- buffer registration ----------------------------------------------------------------
