"""`cpu-single`: the paper's single-copy CPU-centric path.

GPU -> 4 KiB-aligned pinned staging (the stall ends when this snapshot is complete), then a
background writer does O_DIRECT pwrite from the staging buffer itself and fsyncs. The staging
buffer is the only host copy: O_DIRECT bypasses the page cache, so host memory is about 1 x the
checkpoint. Lengths that are not multiples of 4096 are written through a one-block bounce buffer
and the file is truncated back to its exact length.
"""

from __future__ import annotations

from bench.common.traits import Traits
from bench.engines.snapshot import SnapshotEngine


class CpuSingle(SnapshotEngine):
    name = "cpu-single"
    traits = Traits(
        stall="snapshot",
        from_device=False,
        o_direct=True,
        page_cache=False,
        stripes=True,
        host_copies=1,
        baseline=False,
        restore_in_place=True,
        summary="device -> aligned pinned staging; background O_DIRECT + fsync",
    )
