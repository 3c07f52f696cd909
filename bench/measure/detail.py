"""What an engine reports of a save beyond the row's columns: one typed detail per kind of
engine, documented here, written into the row's `io_detail` as JSON (`to_json`) and read back
typed (`read`) by whoever looks (the GPU check's table, the report, the tests).

The JSON carries `kind` since ckptbench 0.2.0; rows written before have the same keys without
it, and `read` tells their kind from the keys. A field that is None is left out of the JSON (a
kvikio-only field on the emulation, CUDA-only staging facts on the host). Adding a fact an
engine reports is a field here, with its doc, and the line that sets it in the engine.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass
class Detail:
    """Base of the details: JSON without the fields left None, `kind` first."""

    kind: ClassVar[str]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is not None:
                out[f.name] = v
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Detail:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass
class SnapshotDetail(Detail):
    """cpu-single and cpu-double: how the snapshot went."""

    kind: ClassVar[str] = "snapshot"
    copy_s: float = 0.0  # the copy into staging alone, part of the stall (the engine's own timer)
    overlap: bool | None = None  # chunks written while later ones were copied; None: a ring
    staging_is_pinned: bool | None = None  # CUDA: torch sees the staging as pinned (DMA)
    torch_host_allocator: dict[str, int] | None = None  # CUDA: torch's own pinned host bytes


@dataclass
class GdsDetail(Detail):
    """gds: its back end, its bytes by path, its settings, registrations and label."""

    kind: ClassVar[str] = "gds"
    io: str = "emulated"  # kvikio or emulated
    device_bytes: int = 0  # bytes written from device memory
    coalesced_tensors: int = 0  # small tensors written through the coalescing buffer
    coalesced_bytes: int = 0  # their bytes
    coalesce_rounds: int = 0  # windows of the buffer they took
    # through kvikio only:
    kvikio: str | None = None  # its version
    num_threads: int | None = None  # kvikio's settings in force
    task_size: int | None = None
    gds_threshold: int | None = None
    settings_reset_in_save: bool | None = None  # someone changed them; set again in the save
    compat_mode: str | None = None  # how files were opened
    files: int | None = None
    host_bytes: int | None = None  # bytes handed to kvikio from host memory (POSIX path)
    registered_bytes: int | None = None  # of the CUDA allocations written from, registered
    unregistered_device_bytes: int | None = None
    register_note: str | None = None  # why some were not registered
    checksum: str | None = None  # where checksums were computed
    pinned_bytes_derived: str | None = None  # pinned_bytes counts kvikio's bounce buffers thus
    gds_evidence: str | None = None  # what decided the label: nvidia-fs counters or the fs list
    compat_reasons: list[str] | None = None  # why `compat`, each reason once


@dataclass
class DcpDetail(Detail):
    """dcp: how DCP was run."""

    kind: ClassVar[str] = "dcp"
    staging: str = ""  # cached or plain
    checkpointer: str = ""  # thread or process


@dataclass
class FastPersistDetail(Detail):
    """fastpersist: DeepSpeed's aio handle and its buffer."""

    kind: ClassVar[str] = "fastpersist"
    block_bytes: int = 0
    queue_depth: int = 0
    threads: int = 0
    buffer_bytes: int = 0
    workaround: str | None = None  # DeepSpeed's op the engine builds instead, and why


@dataclass
class NixlDetail(Detail):
    """nixl: the NIXL backend and its settings, and the parts of the save the engine can tell
    (its own timers; the clock's stall is the whole)."""

    kind: ClassVar[str] = "nixl"
    backend: str = ""  # NIXL plugin and its io queue: POSIX/URING, POSIX/AIO, GDS_MT, GDS
    nixl: str | None = None  # the wheel's version
    request_bytes: int = 0
    batch: int = 0
    buffer_bytes: int = 0  # the registered host buffer (0: from registered device memory)
    requests: int = 0  # transfer requests posted
    descriptors: int = 0  # descriptors in them (I/Os of at most request_bytes)
    copy_s: float = 0.0  # copying the state into the registered buffer
    post_s: float = 0.0  # posting the transfer requests (submission)
    poll_s: float = 0.0  # polling them to their end, beyond the copy they overlap
    fsync_s: float = 0.0  # fsync of the data file and the index


KINDS: dict[str, type[Detail]] = {
    d.kind: d for d in (SnapshotDetail, GdsDetail, DcpDetail, FastPersistDetail, NixlDetail)
}
# Rows written before `kind` was: a key only one kind has
_TELL = (
    ("io", "gds"),
    ("checkpointer", "dcp"),
    ("block_bytes", "fastpersist"),
    ("request_bytes", "nixl"),
    ("copy_s", "snapshot"),
)


def dumps(detail: Detail | None) -> str:
    """The row's io_detail: the detail's JSON, or "" for none."""
    return json.dumps(detail.to_json(), sort_keys=True) if detail is not None else ""


def read(text: str | None) -> Detail | None:
    """A row's io_detail read back typed; None for an empty one or one of no known kind."""
    if not text:
        return None
    d = json.loads(text)
    kind = d.get("kind") or next((k for key, k in _TELL if key in d), None)
    if kind is None and "overlap" in d:
        kind = "snapshot"  # the first rows of the snapshot engines had only `overlap`
    cls = KINDS.get(kind or "")
    return cls.from_json(d) if cls is not None else None
