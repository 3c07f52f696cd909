"""The snapshot engines' save (cpu-single, cpu-double): the state copied into host staging (the
stall), then persisted from there in the background.

`SnapshotEngine` (engine) holds the staging buffer, the copy threads and one strategy, chosen
once from the options, that copies a state into staging and hands back what persists it:
- `Plain` (plain): the whole state into staging, then every chunk written from it;
- `Overlapped` (overlapped): each chunk written as soon as it is in staging (`overlap`);
- `Ring` (ring): bounded staging, a ring of `staging_chunks` chunks, each written once copied.
Each keeps its own packing of the plan (what its copies need, made once per layout) and its
own state; what they share (the packed stream, the persist steps) is in `strategy`, and the
engine does the accounting of every row (pinned bytes, the snapshot's detail) in one place.
"""

from bench.engines.snapshot.engine import SnapshotEngine

__all__ = ["SnapshotEngine"]
