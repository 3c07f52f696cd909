"""What an engine is, declared by the engine itself (as fio's ioengines declare their flags), so
that the run core, the efficiency columns, the analytical model and the report never switch on
engine names. A run records every engine's traits in env.json (`engines`); analysis reads them
from there, and from `BUILTIN` for runs made before traits were recorded.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class Traits:
    """An engine's data path in the terms the model and the core need."""

    # What save() waits for before it returns: the bytes durable ("durable"), or only the state
    # copied out of the training memory ("snapshot"), the rest persisting in the background.
    stall: Literal["durable", "snapshot"]
    # Reads the tensors' device memory itself, with no device-to-host snapshot (GDS).
    from_device: bool
    # Writes with O_DIRECT: every target must accept it (checked before the run), and its
    # writes are judged against the O_DIRECT ceiling.
    o_direct: bool
    # Its bytes pass through the page cache (buffered writes): judged against the buffered
    # ceiling, and the host's memory-copy bandwidth bounds it.
    page_cache: bool
    # Spreads a checkpoint over all its targets; else it writes into the first target only and
    # runs once per workload, at the smallest SSD count.
    stripes: bool
    # Host copies of the state while it persists, in units of the checkpoint (pinned staging,
    # page cache): 0 for GDS, 1 single-copy, 2 double-copy.
    host_copies: int
    # A library users would otherwise pick, as opposed to one of the paper's data paths.
    baseline: bool
    # Its restore may change key types (DCP: int keys come back as str): verified tensor by
    # tensor under the same key paths rather than node by node.
    loose_keys: bool = False
    # Its library turns the tensors into a file format on the CPU before writing (torch.save's
    # zip archive, DCP's items): bounded by the serialisation rate the run measures.
    serializes: bool = False
    # Writes its one file with a single thread (torch.save, safetensors): its page-cache rate is
    # the one-writer buffered ceiling, not the best writer count's.
    single_writer: bool = False
    # One line for reports: what it does.
    summary: str = ""
    # CPU copies of the whole checkpoint inside host memory after it lands there, each reading
    # and writing every byte: the copy into the page cache of a buffered write, FastPersist's
    # copy into its pinned buffer. None: one for a page-cache path, none otherwise.
    host_passes: int | None = None
    # How its copy between device and host memory meets its storage I/O (the CPU paths only;
    # the model's bounce terms, held against published measurements in configs/published.yaml).
    # write_overlaps_copy: it copies the state out in chunks while earlier chunks are written
    # (a double buffer, several threads), so the slower of the two bounds the save rather than
    # their sum. read_overlaps_copy: its restore copies chunks to the device while later chunks
    # are read; False: the whole read lands in host memory before one copy to the device
    # (DeepNVMe's ds_io bounce buffer, one process), so the two add up.
    write_overlaps_copy: bool = False
    read_overlaps_copy: bool = True
    # How it restores into a model that already exists (a restart, bench.run.restart): True,
    # its API reads the checkpoint into the destination's own tensors (DCP's load into the
    # state dict, the striped engines' reads); False, its loader builds the state anew and the
    # copy into the destination follows, inside the timed restore, which is what
    # `model.load_state_dict(torch.load(f))` costs.
    restore_in_place: bool = False

    def dram_per_byte(self, emulated: bool = False) -> tuple[float, float]:
        """(stall, persist) bytes of host DRAM traffic per checkpoint byte, derived from the
        path's copies (the `derived` figure where no memory-controller counter is read):

        - landing in host memory: on a GPU the device-to-host DMA writes each byte once (1); on
          a host-emulated device the "device" is host memory and a snapshot is a memcpy (read
          + write: 2), while an engine that serialises from the tensors in place lands nothing;
        - each host pass (`host_passes`): read + write, 2;
        - the storage reading it back: the SSD's DMA reads host memory once (1); GDS on a GPU
          reads device memory instead (0).

        A snapshot engine's landing is in its stall and the rest in its persist phase; an
        engine that stalls until durable has it all in the stall. Copies a library makes inside
        itself (torch.save's pageable device-to-host bounce, safetensors' byte buffers) and
        checksum reads (one more read of the staging for cpu-single and cpu-double with
        checksums on the host) are not counted: a lower bound."""
        passes = (1 if self.page_cache else 0) if self.host_passes is None else self.host_passes
        if emulated:
            land = 2.0 if self.stall == "snapshot" and not self.from_device else 0.0
            back = 1.0
        else:
            land = 0.0 if self.from_device else 1.0
            back = 0.0 if self.from_device else 1.0
        rest = 2.0 * passes + back
        return (land, rest) if self.stall == "snapshot" else (land + rest, 0.0)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Traits:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


# The engines of runs made before env.json recorded traits (and a check for the engines of today:
# tests/test_engines.py asserts each engine still declares these).
BUILTIN: dict[str, Traits] = {
    "gds": Traits(
        "durable",
        True,
        True,
        False,
        True,
        0,
        False,
        restore_in_place=True,
        summary="kvikio CuFile.pwrite straight from device memory (GPUDirect Storage)",
    ),
    "cpu-single": Traits(
        "snapshot",
        False,
        True,
        False,
        True,
        1,
        False,
        restore_in_place=True,
        summary="device -> aligned pinned staging; background O_DIRECT + fsync",
    ),
    "cpu-double": Traits(
        "snapshot",
        False,
        False,
        True,
        True,
        2,
        False,
        restore_in_place=True,
        summary="device -> pinned staging; background buffered write + fsync",
    ),
    "torch-save": Traits(
        "durable",
        False,
        False,
        True,
        False,
        1,
        True,
        serializes=True,
        single_writer=True,
        summary="torch.save to one file in the first target, fsync",
    ),
    "dcp": Traits(
        "snapshot",
        False,
        False,
        True,
        False,
        2,
        True,
        loose_keys=True,
        serializes=True,
        restore_in_place=True,
        summary="torch.distributed.checkpoint.async_save, FileSystemWriter(sync_files=True)",
    ),
}
