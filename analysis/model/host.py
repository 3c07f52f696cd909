"""What checkpointing costs the host (`host_need`): every GPU of the host checkpointing at the
rate R = W(m) its m SSDs write together, cores = CPU-seconds per GB durable (measured by a run:
configs/hardware/cpu-cost/reference.yaml, or the run's own) x R, DRAM = the path's bytes moved
per checkpoint byte (derived from its copies, bench.common.traits.Traits.dram_per_byte) x R,
against the host's cores and DRAM bandwidth as the profile cites them ("unknown" without).
Imports analysis.model.profiles and predict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from analysis.model.predict import ENGINES, traits_of
from analysis.model.profiles import GB, THIS_MACHINE, Profile
from bench.common.traits import Traits


@dataclass(frozen=True)
class HostNeed:
    """What checkpointing every GPU of the host at its SSDs' aggregate rate costs it, through
    one engine: cores (CPU-seconds per GB x GB/s), DRAM bandwidth (bytes moved per checkpoint
    byte x B/s), against what the host has. None: not known (no measured CPU cost for the
    engine, no cited figure for the host)."""

    engine: str
    rate_Bps: float  # the host's SSDs together: W(m) for all m of them
    cpu_s_per_GB: float | None
    cpu_s_per_GB_persist: float | None
    host_cores: float | None  # needed, the whole save
    host_cores_persist: float | None  # needed while persisting (beside training)
    cores_available: float | None
    dram_per_byte: float  # derived from the path's copies (bench.common.traits)
    dram_per_byte_persist: float
    dram_Bps: float
    dram_Bps_persist: float
    dram_available_Bps: float | None
    verdict: str  # "affordable", "cannot afford: ...", or "unknown: ..."

    @property
    def dram_share_persist(self) -> float | None:
        """The share of the host's DRAM bandwidth training loses while the checkpoint
        persists beside it (None: the bandwidth is unknown; an upper bound where the profile's
        bandwidth is a lower bound, as a run's is)."""
        if not self.dram_available_Bps:
            return None
        return self.dram_Bps_persist / self.dram_available_Bps


def host_need(p: Profile, engine: str, traits: Traits | None = None) -> HostNeed:
    """`HostNeed` of one engine on profile p: every GPU of the host checkpointing at the rate
    its SSDs write together (W(m), m = the host's SSDs), whatever the engine's own rate, so
    that the engines compare at the same work. Cores = CPU-seconds per GB (measured: the
    reference run's for a server profile, the run's own for this machine) x that rate; DRAM =
    the path's derived bytes per byte (on a GPU; on this machine's emulation when the profile
    is a host-emulated run's) x that rate. A path the host cannot afford needs more cores or
    more DRAM bandwidth than it has (peak bandwidth: what it can use is less)."""
    t = traits_of(engine, traits)
    rate = p.storage_Bps(p.host_ssds)
    cost = {e: (tot, per) for e, tot, per in p.cpu_cost}
    tot, per = cost.get(engine, (None, None))
    per = None if per is None or math.isnan(per) else per
    cores = None if tot is None else tot * rate / GB
    cores_p = None if per is None else per * rate / GB
    emulated = p.name == THIS_MACHINE and any("host-emulated" in n for n in p.notes)
    stall_b, persist_b = t.dram_per_byte(emulated)
    dram, dram_p = (stall_b + persist_b) * rate, persist_b * rate
    short, unknown = [], []
    if cores is None:
        unknown.append(f"no measured CPU cost of {engine}")
    elif p.host_cores is None:
        unknown.append("no cited host cores")
    elif cores > p.host_cores:
        short.append(f"{cores:.0f} cores of {p.host_cores:g}")
    if p.dram_Bps is None:
        if dram > 0:
            unknown.append("no cited DRAM bandwidth")
    elif dram > p.dram_Bps and p.dram_lower_bound:
        unknown.append(
            f"{dram / GB:.0f} GB/s of DRAM, more than the {p.dram_Bps / GB:.0f} it was seen to move"
        )
    elif dram > p.dram_Bps:
        short.append(f"{dram / GB:.0f} GB/s of DRAM of {p.dram_Bps / GB:.0f}")
    if short:
        verdict = "cannot afford: " + ", ".join(short)
    elif unknown:
        verdict = "unknown: " + ", ".join(unknown)
    else:
        verdict = "affordable"
    return HostNeed(
        engine,
        rate,
        tot,
        per,
        cores,
        cores_p,
        p.host_cores,
        stall_b + persist_b,
        persist_b,
        dram,
        dram_p,
        p.dram_Bps,
        verdict,
    )


def host_needs(p: Profile, traits: dict[str, Traits] | None = None) -> list[HostNeed]:
    return [host_need(p, e, (traits or {}).get(e)) for e in (traits or ENGINES)]
