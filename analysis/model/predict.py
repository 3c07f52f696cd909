"""The analytical model: stall, time to durability and host memory of each engine's checkpoint
when g GPUs of one host checkpoint at once (the case the paper is about), and the SSD count per
GPU that GPUDirect Storage needs to stall no longer than a CPU-centric snapshot. One function,
`predict`, gives every number: the tables, the headline, Figure 2 and Figure 4.

Symbols (bandwidths in B/s):

    S     checkpoint size of one GPU (its shard)
    b     device-to-host bandwidth of one GPU's link (D2H)
    L     the GPU's link for peer-to-peer GDS writes (defaults to b: the same x16 link)
    C     what the host's memory takes in, all GPUs together (memory-copy bandwidth)
    w     sequential write bandwidth of one SSD; W(m) that of m SSDs (m w, or as measured; w
          when every target is on one device)
    P(m)  the page-cache path's own rate to durability over m SSDs (buffered write + fsync;
          min(C, W(m)) unless measured); P1(m) the same with one writer (torch.save and
          safetensors write with one thread), P(m) unless measured
    z     serialisation rate of a library that turns tensors into a file format on the CPU
          (torch.save's zip, DCP's items); unlimited unless measured or given
    g     GPUs of the host checkpointing at once, sharing its m SSDs (m = n g for n per GPU)

    per GPU:  d = min(b, C / g)        its snapshot bandwidth (its share of the host's intake)
              W_g = W(m) / g           its share of the storage (striped over all m SSDs)
              w_1 = w / g              its share of the first SSD (engines that do not stripe,
                                       with targets shared; min(w, W_g) with dedicated ones)

    engine (traits)                        write rate r                  stall        durable
    from device (gds)                      W_g                           S/min(L,r)   = stall
    snapshot, O_DIRECT (cpu-single)        W_g                           S/d          S/d + S/r
    snapshot, page cache (cpu-double)      min(P(m)/g, C/g)              S/d          S/d + S/r
    durable, page cache, 1 SSD (torch-save) 1/(1/min(P1(1)/g, C/g) + 1/z) S/d + S/r   = stall
    snapshot, page cache, 1 SSD (dcp)      1/(1/min(P1(1)/g, C/g) + 1/z) S/d          S/d + S/r
    durable, O_DIRECT, 1 SSD (fastpersist) 1/(1/w_1 + 1/z)               S/d + S/r    = stall

    An engine whose trait `write_overlaps_copy` is set copies the state out in chunks while
    earlier chunks are written (a double buffer): its time to durability is S / min(d, r),
    not S/d + S/r.

    An engine that serialises (trait `serializes`: torch.save's zip, DCP's items, FastPersist's
    torch.save into its writer) takes S/z for the format and then S/(write rate) for the bytes:
    the thread that serialises an item also issues its write, so the two do not overlap, and
    under the GIL the serialisation of several writer threads does not either: its page-cache
    rate is the one-writer P1.

    host memory = host copies x S (0 gds, 1 cpu-single and torch-save, 2 cpu-double and dcp)

Restore (a restart: the checkpoint read back from a cold page cache into the device), with

    R(m)  O_DIRECT read of m SSDs (m r for one SSD's r, or as measured; r on one device)
    Q(m)  the page-cache path's read of m SSDs (as measured, else R(m))
    h     the GPU's host-to-device link (CUDA; none on a host-emulated run, whose restores
          land in host memory)

    per GPU:  R_g = R(m) / g, its share of the first SSD R(1)/g as for the writes
              h_g = min(h, C / g)  its share of the host's memory into its link

    engine (traits)                      read rate q                       restore
    from device (gds)                    R_g                               S / min(q, h)
    O_DIRECT (cpu-single, fastpersist)   R_g (first SSD: R_1)              S / min(q, h_g)
    page cache (cpu-double)              min(Q(m)/g, C/g)                  S / min(q, h_g)
    page cache, 1 SSD (dcp, torch-save,  min(Q(1)/g, C/g)                  S / min(q, h_g)
      safetensors)

    The CPU paths overlap the read with the copy to the device (so the slower bounds it),
    unless an engine's trait `read_overlaps_copy` is False: then the whole read lands in host
    memory first and the restore is S/q + S/h_g (DeepNVMe's one-process bounce buffer). GDS
    reads into the device over its own link, not through host memory. The read kind is
    the one the engine's restore is judged against (bench.measure.ceilings: O_DIRECT for an
    engine without page cache, buffered otherwise). A loader's own work (torch.load's
    unpickling) is not modelled. Restore unknown (NaN) where the profile has no read figure.

    GDS restore gain: CPU-centric restore / GDS restore = min(n r, h) / min(n r, h_g) with n
    SSDs per GPU; it exceeds 1 from n = h_g / r on, where h > h_g (`restore_gain`).

    GDS stall / CPU-centric stall   R = d / min(L, n w) with n SSDs per GPU
    break-even                      n* = d / w = min(b, C/g) / w (infinite if L < d, or if all
                                    targets share one device and w < d)

Every engine is placed by its traits (bench.common.traits), read from the run's env.json, so a
new engine gets its line without a change here. On a measured run (`from_run`) the inputs are
the run's device ceilings, never the engines' own rows: b and C the copy (or device-to-host)
ceiling, W(n) and P(n) the O_DIRECT and buffered ceilings of n targets, z the torch.save
ceiling; the model then predicts every engine's rows (`model_vs_measured`).

Assumptions: the snapshot and persist phases run one after the other (as the engines do); every
GPU gets a fair share of the host's intake and storage; interference beyond bandwidth (locks,
page-cache reclaim, a memory balloon) is not modelled.

Inputs come from hardware profiles (analysis.model.profiles: `configs/hardware/*.yaml`, every
figure with its kind and source) or from a measured run (analysis.model.calibrate.from_run).

The model's modules: profiles (the inputs), predict (this), host (what a checkpoint costs the
host), planning (how often to checkpoint), calibrate (a run's profile), render (the text).
This module imports analysis.model.profiles only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from analysis.model.profiles import Profile
from bench.common.errors import UserError
from bench.common.traits import BUILTIN, Traits

ENGINES = tuple(BUILTIN)  # engines the profile tables show (a run's own come with its traits)


@dataclass(frozen=True)
class Prediction:
    engine: str
    stall_s: float
    durable_s: float
    host_bytes: float
    restore_s: float = math.nan  # the checkpoint read back into the device (NaN: unknown)


def traits_of(engine: str, traits: Traits | None = None) -> Traits:
    """An engine's traits: as given (from a run's env.json), else the built-in engines'."""
    t = traits or BUILTIN.get(engine)
    if t is None:
        raise UserError(f"model: no traits for engine {engine!r} (known: {', '.join(ENGINES)})")
    return t


def predict(
    p: Profile,
    engine: str,
    ssds: float | None = None,
    size: float | None = None,
    traits: Traits | None = None,
    g: int | None = None,
    mapping: str = "shared",
) -> Prediction:
    """One GPU's stall, time to durability and host memory when `g` GPUs of the host (default:
    the profile's `gpus_sharing_host`) checkpoint at once over `ssds` SSDs they share (default:
    `ssds_per_gpu` for each of them). `mapping` (shared or dedicated targets) matters only for
    the engines that write one target. The module docstring gives the formulas."""
    t = traits_of(engine, traits)
    g = g or p.gpus_sharing_host
    m = float(p.ssds_per_gpu * g if ssds is None else ssds)
    s = float(p.size_bytes if size is None else size)
    copy = p.host_copy_Bps / g
    d = min(p.d2h_Bps, copy)
    if t.stripes:
        direct, cache = p.storage_Bps(m) / g, p.page_cache_Bps(m) / g
    else:
        w_r = p.storage_Bps(m) / g
        direct = p.storage_Bps(1) / g if mapping == "shared" else min(p.storage_Bps(1), w_r)
        one = p.page_cache_Bps(1, t.single_writer or t.serializes)
        cache = one / g if mapping == "shared" else min(one, w_r)
    rate = min(cache, copy) if t.page_cache else direct
    if t.serializes and p.serialize_Bps:  # serialise, then write: one after the other
        rate = 1 / (1 / rate + 1 / p.serialize_Bps)
    back = restore_s(p, t, m, s, g, mapping)
    if t.from_device:  # straight from device memory: no snapshot, stalls until durable
        dur = s / min(p.link, rate)
        return Prediction(engine, dur, dur, t.host_copies * s, back)
    snap = s / d
    # the snapshot and the writes one after the other, or side by side (write_overlaps_copy)
    durable = s / min(d, rate) if t.write_overlaps_copy else snap + s / rate
    stall = snap if t.stall == "snapshot" else durable
    return Prediction(engine, stall, durable, t.host_copies * s, back)


def read_Bps(p: Profile, t: Traits, m: float, g: int, mapping: str = "shared") -> float | None:
    """q: one GPU's read rate from its m SSDs when g GPUs restore at once (the module
    docstring), None where the profile has no read figure."""
    rate = p.page_cache_read_Bps if t.page_cache else p.read_Bps
    all_m, first = rate(m), rate(1)
    if all_m is None or first is None:
        return None
    if t.stripes:
        q = all_m / g
    else:
        q = first / g if mapping == "shared" else min(first, all_m / g)
    return min(q, p.host_copy_Bps / g) if t.page_cache else q


def restore_s(p: Profile, t: Traits, m: float, s: float, g: int, mapping: str = "shared") -> float:
    """One GPU's restore of its S bytes from m SSDs, g GPUs at once: S / min(q, h) from the
    device (GDS), S / min(q, h_g) through host memory; NaN where the read is unknown."""
    q = read_Bps(p, t, m, g, mapping)
    if q is None:
        return math.nan
    if p.h2d_Bps is None:  # a host-emulated run: the restore lands in host memory
        return s / q
    link = p.h2d_Bps if t.from_device else min(p.h2d_Bps, p.host_copy_Bps / g)
    if t.from_device or t.read_overlaps_copy:
        return s / min(q, link)
    return s / q + s / link  # the whole read first, then one copy to the device


def predict_shared(
    p: Profile,
    engine: str,
    ranks: int,
    ssds_host: float | None = None,
    size: float | None = None,
    mapping: str = "shared",
    traits: Traits | None = None,
) -> Prediction:
    """`predict` for `ranks` GPUs of one host sharing its `ssds_host` SSDs (default: all the
    host's); kept for the multi-rank analysis."""
    if ranks < 1:
        raise UserError(f"model: ranks must be at least 1, got {ranks}")
    m = p.host_ssds if ssds_host is None else ssds_host
    return predict(p, engine, m, size, traits, g=ranks, mapping=mapping)


def predict_all(
    p: Profile, n_per_gpu: float, size: float | None = None, g: int | None = None
) -> list[Prediction]:
    """Every built-in engine with n SSDs per GPU, g GPUs at once (default: the profile's)."""
    g = g or p.gpus_sharing_host
    return [predict(p, e, n_per_gpu * g, size, g=g) for e in ENGINES]


def snapshot_Bps(p: Profile, g: int | None = None) -> float:
    """d = min(b, C / g): one GPU's snapshot bandwidth when g GPUs checkpoint at once."""
    return min(p.d2h_Bps, p.host_copy_Bps / (g or p.gpus_sharing_host))


def stall_ratio(p: Profile, n_ssds: Any, g: int | None = None) -> Any:
    """R = GDS stall / CPU-centric stall with n SSDs per GPU and g GPUs at once (`predict` of
    gds over cpu-single); works on arrays."""
    g = g or p.gpus_sharing_host
    n = np.atleast_1d(np.asarray(n_ssds, dtype=float))
    r = np.array(
        [
            predict(p, "gds", x * g, 1.0, g=g).stall_s
            / predict(p, "cpu-single", x * g, 1.0, g=g).stall_s
            for x in n
        ]
    )
    return float(r[0]) if np.ndim(n_ssds) == 0 else r


def restore_gain(p: Profile, n_ssds: Any, g: int | None = None) -> Any:
    """CPU-centric restore / GDS restore (cpu-single over gds, `predict`) with n SSDs per GPU
    and g GPUs at once: how many times faster GDS loads a checkpoint (1: no faster); NaN where
    the profile has no read figure; works on arrays."""
    g = g or p.gpus_sharing_host
    n = np.atleast_1d(np.asarray(n_ssds, dtype=float))
    r = np.array(
        [
            predict(p, "cpu-single", x * g, 1.0, g=g).restore_s
            / predict(p, "gds", x * g, 1.0, g=g).restore_s
            for x in n
        ]
    )
    return float(r[0]) if np.ndim(n_ssds) == 0 else r


def restore_break_even(p: Profile, g: int | None = None) -> float:
    """SSDs per GPU from which GDS restores faster than a CPU-centric path, n = h_g / r with
    g GPUs at once (inf: never, when the host's share is the whole link, h <= C/g, or there
    is no link or no read figure)."""
    g = g or p.gpus_sharing_host
    if p.h2d_Bps is None or p.ssd_read_Bps is None:
        return math.inf
    h_g = min(p.h2d_Bps, p.host_copy_Bps / g)
    if h_g >= p.h2d_Bps or p.shared_device:
        return math.inf
    return h_g / p.ssd_read_Bps


def break_even(p: Profile, g: int | None = None) -> float:
    """n*: SSDs per GPU from which GDS stalls no longer than a CPU-centric snapshot, with g
    GPUs at once (may be inf); the closed form of `stall_ratio` = 1."""
    d = snapshot_Bps(p, g)
    if p.link < d:
        return math.inf
    n = d / p.ssd_write_Bps
    if p.shared_device:
        return 1.0 if stall_ratio(p, 1, g) <= 1 else math.inf
    if p.direct_by_n:  # measured W(n): the fewest measured SSDs per GPU that break even
        per_gpu = sorted({k // (g or p.gpus_sharing_host) for k, _ in p.direct_by_n} - {0})
        return next((float(x) for x in per_gpu if stall_ratio(p, x, g) <= 1), math.inf)
    return n


def break_even_ssds(p: Profile, g: int | None = None) -> int | None:
    """The whole number of SSDs per GPU for the break-even (None: never)."""
    n = break_even(p, g)
    return None if math.isinf(n) else max(1, math.ceil(n - 1e-9))
