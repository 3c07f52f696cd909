"""`cpu-double`: the common CPU-centric path with two host copies.

GPU -> pinned staging (the stall ends when this snapshot is complete), then a background writer
does buffered write() into the page cache (the second host copy) and fsyncs. Host memory is
about 2 x the checkpoint while the page cache holds the dirty data.
"""

from __future__ import annotations

from bench.common.traits import Traits
from bench.engines.snapshot import SnapshotEngine


class CpuDouble(SnapshotEngine):
    name = "cpu-double"
    traits = Traits(
        stall="snapshot",
        from_device=False,
        o_direct=False,
        page_cache=True,
        stripes=True,
        host_copies=2,
        baseline=False,
        restore_in_place=True,
        summary="device -> pinned staging; background buffered write + fsync",
    )
