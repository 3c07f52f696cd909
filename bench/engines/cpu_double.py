"""`cpu-double`: the common CPU-centric path with two host copies.

GPU -> pinned staging (the stall ends when this snapshot is complete), then a background writer
does buffered write() into the page cache (the second host copy) and fsyncs. Host memory is
about 2 x the checkpoint while the page cache holds the dirty data.
"""

from __future__ import annotations

from bench.engines.base import register
from bench.engines.striped import SnapshotEngine


@register
class CpuDouble(SnapshotEngine):
    name = "cpu-double"
    o_direct = False
