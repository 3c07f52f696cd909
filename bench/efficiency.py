"""Efficiency: what a row achieved over the device ceiling that judges it, defined once for the
CSV columns, the terminal summary, the report and the model's calibration (torch-free, so that
analysis uses the very same function)."""

from __future__ import annotations

from typing import Any

from bench.engines.traits import Traits

BEATEN = 1.05  # an efficiency above this is a finding about the ceiling, not a score


def efficiency(
    row: dict[str, Any], ceilings: dict[str, Any] | None, traits: Traits | None = None
) -> tuple[Any, Any]:
    """(write, snapshot) efficiency of a row against the ceilings, each None where it has none.
    The one definition every table, figure and the model's calibration use:

    - write efficiency: total_bytes / total_s (save() called until durable: the write end to
      end) over the ceiling of the engine's kind of write (`traits.write_ceiling()`: O_DIRECT, or
      buffered + fsync for page-cache paths) for the targets it wrote (one unless it stripes);
    - snapshot efficiency, for an engine whose stall is a snapshot: total_bytes / stall_s over
      the copy ceiling (device-to-host on CUDA).
    """
    if not ceilings or not row.get("total_s"):
        return None, None
    if traits is None:
        from bench.engines import REGISTRY

        traits = REGISTRY[row["engine"]].traits
    tr = traits
    n = int(row["n_targets"]) if tr.stripes else 1
    c = ceilings.get("per_ssd_count", {}).get(str(n))
    key = f"{tr.write_ceiling()}_Bps"
    write = None
    if c and c.get(key):
        write = round(row["total_bytes"] / row["total_s"] / c[key], 4)
    snapshot = None
    copy = ceilings.get("d2h_Bps") or ceilings.get("copy_Bps")
    if tr.stall == "snapshot" and not tr.from_device and copy and row.get("stall_s"):
        snapshot = round(row["total_bytes"] / row["stall_s"] / copy, 4)
    return write, snapshot


def beaten(*effs: Any) -> bool:
    """Whether an efficiency exceeds its ceiling by more than the noise allows (the ceiling,
    not the engine, is then in question)."""
    return any(e is not None and e == e and e > BEATEN for e in effs)
