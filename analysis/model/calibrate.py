"""'This machine' calibrated from a measured run (`from_run`): the model's inputs from the
run's device ceilings, never from the engines' own rows, so that `model_vs_measured` is a
prediction; `near` narrows them to the ceilings probed around one workload. Imports
analysis.cost, analysis.model.profiles and the typed ceilings (bench.measure.ceilings).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from analysis import cost
from analysis.model.profiles import GB, THIS_MACHINE, Profile
from bench.common.errors import UserError
from bench.measure.ceilings import (
    BUFFERED_READ,
    BUFFERED_WRITE,
    BUFFERED_WRITE_1,
    COPY,
    D2H,
    DIRECT_READ,
    DIRECT_WRITE,
    H2D,
    KINDS,
    SERIALIZE,
    Ceilings,
    Kind,
    Probe,
    RunCeilings,
)


def _best(c: Ceilings, kind: Kind, n: int = 1) -> float | None:
    """The ceiling (B/s) of `kind` (of n targets) in `c`, if it has one."""
    m = c.at(kind, n)
    return float(m.Bps) if m is not None and m.Bps > 0 else None


def from_run(run: Any) -> Profile:
    """'This machine' calibrated from a measured run (analysis.runs.Run): from its device
    ceilings (what each typically did: the median of its runs, the mean of before and after the
    sweep), never from the engines' own rows, so that
    `model_vs_measured` is a prediction. b: the device-to-host ceiling (host-emulated: the copy
    ceiling, with the snapshot's threads); C: the copy ceiling; W(n) and P(n): the O_DIRECT and
    buffered + fsync ceilings of n targets; z: the torch.save ceiling. A run without ceilings
    (made before they were measured) falls back on its single-copy engine's rows, and says so.
    """
    measured = RunCeilings.from_env(run.env)
    c, after = measured.before, measured.after
    if c is None or not c.counts:
        return _from_rows(run)
    rid, tag = run.run_id, "from run"
    shared = bool(run.shared_device)

    def typical(kind: Kind, n: int | None = None) -> list[float]:
        """What the device typically did before and after the sweep (the median of the chosen
        configuration's runs), not the best run the efficiencies are judged against: the
        model predicts medians."""
        got = (m.median() for b in (c, after) if b is not None and (m := b.at(kind, n)))
        return [v for v in got if v]

    def both(n: int, kind: Kind) -> float | None:
        vals = typical(kind, n)
        return float(np.mean(vals)) if vals else None

    per_n = sorted(c.counts)
    direct = tuple((n, v) for n in per_n if (v := both(n, DIRECT_WRITE)))
    buffered = tuple((n, v) for n in per_n if (v := both(n, BUFFERED_WRITE)))
    single = []
    for n in per_n:
        ones = [
            v for b in (c, after) if b is not None and (v := _point(b, n).get(BUFFERED_WRITE_1))
        ]
        if ones:
            single.append((n, float(np.mean(ones))))
    copies = typical(COPY)
    if not direct or not copies:  # a ceiling that failed (env.json ceilings_error)
        return _from_rows(run)
    # The restore's: R(n) and Q(n), the O_DIRECT and buffered reads of a cold file, h the
    # host-to-device copy (CUDA only).
    reads = tuple((n, v) for n in per_n if (v := both(n, DIRECT_READ)))
    buffered_reads = tuple((n, v) for n in per_n if (v := both(n, BUFFERED_READ)))
    h2d = typical(H2D)
    copy = float(np.mean(copies))
    d2h = float(np.mean(typical(D2H) or [copy]))
    ser = typical(SERIALIZE)
    n_min, w_min = direct[0]
    emu = " (host-emulated: a host memory copy)" if run.emulated else ""
    threads = c.method.copy_threads or 1
    sources = {
        "d2h_GBps": (
            tag,
            f"env.json ceilings of run {rid}: "
            + (
                "the device-to-host runs"
                if _best(c, D2H)
                else f"the copy runs{emu}, {threads} threads as the snapshot"
            )
            + ", the median of before and after the sweep",
        ),
        "ssd_write_GBps": (
            tag,
            f"env.json ceilings: the {DIRECT_WRITE.label} ceiling of {n_min} target(s), run {rid}"
            + (" (all targets on one device)" if shared else f", divided by {n_min}"),
        ),
        "ssds_per_gpu": (tag, "distinct devices under the run's targets (env.json storage)"),
        "gpus_sharing_host": ("assumed", "one process checkpoints at a time"),
        "host_copy_GBps": (tag, f"env.json ceilings: the copy runs of run {rid} (median)"),
        "checkpoint_size": (tag, "the largest checkpoint of the run"),
    }
    if reads:
        n_r = reads[0][0]
        sources["ssd_read_GBps"] = (
            tag,
            f"env.json ceilings: the {DIRECT_READ.label} ceiling of {n_r} target(s), run {rid}"
            + (" (all targets on one device)" if shared else f", divided by {n_r}"),
        )
    if h2d:
        sources["h2d_GBps"] = (tag, f"env.json ceilings: the {H2D.label} runs of run {rid}")
    n_dev = int(run.env.get("storage", {}).get("distinct_devices") or 1)
    z = _best(c, SERIALIZE)
    notes = [
        f"W(n) and P(n) as measured for n = {', '.join(str(n) for n, _ in direct)} "
        "target(s); z = torch.save into memory " + (f"{z / GB:.2f} GB/s" if z else "(not measured)")
    ]
    if shared:
        notes.append("all targets share one device: SSD-count scaling is not real")
    if run.emulated:
        notes.append("host-emulated run: 'D2H' is a host memory copy, gds is O_DIRECT from memory")
    host = _host_from_run(run, copy, sources)
    return Profile(
        **host,
        name=THIS_MACHINE,
        description=f"this machine ({run.env.get('host', '?')}, "
        f"{run.env.get('cpu', {}).get('model', '?')}), from the ceilings of run {rid}",
        d2h_Bps=d2h,
        ssd_write_Bps=w_min if shared else w_min / n_min,
        ssds_per_gpu=max(1, n_dev),
        gpus_sharing_host=1,
        host_copy_Bps=copy,
        size_bytes=int(run.ok["total_bytes"].max()),
        shared_device=shared,
        sources=sources,
        notes=tuple(notes),
        direct_by_n=direct,
        buffered_by_n=buffered,
        buffered_single_by_n=tuple(single),
        serialize_Bps=float(np.mean(ser)) if ser else None,
        ssd_read_Bps=(reads[0][1] if shared else reads[0][1] / reads[0][0]) if reads else None,
        h2d_Bps=float(np.mean(h2d)) if h2d else None,
        direct_read_by_n=reads,
        buffered_read_by_n=buffered_reads,
    )


def _point(c: Ceilings, n: int) -> dict[Kind, float]:
    """What the ceilings measured before or after the sweep say of n targets at that point in
    time, as a probe would: each kind's median of the runs it kept (measured or derived)."""
    out = {}
    for kind in KINDS:
        m = c.at(kind, n)
        if m is not None and m.runs:
            out[kind] = m.median()
    return out


def _probed(p: Probe) -> dict[Kind, float]:
    """What a probe says: each kind's ceiling as the probe settled it."""
    return {kind: float(m.Bps) for kind in KINDS if (m := p.at(kind)) is not None and m.Bps}


def near(p: Profile, run: Any, workload: str, n: int) -> Profile:
    """`p` (from_run) with the ceilings measured around one workload of the run: the probe taken
    just before its saves (env.json `ceilings_probes`) and its neighbours in time over the same
    target count (the ceilings before the sweep, the probes of the workloads before and after,
    the ceilings after), the median of those three. The disk of a VM drifts 2x within the
    hour; a model calibrated once for the whole run misses by that much. `p` unchanged when
    the run has no probes (older runs, probes off, multi-rank runs)."""
    measured = RunCeilings.from_env(run.env)
    probes = [q for q in measured.probes if q.n_targets == n]
    at = [i for i, q in enumerate(probes) if q.workload == workload]
    if not at:
        return p
    before, after = (_point(c, n) if c else {} for c in (measured.before, measured.after))
    seq = [before, *(_probed(q) for q in probes), after]
    k = at[-1] + 1
    window = seq[k - 1 : k + 2]

    def med(kind: Kind) -> float | None:
        vals = [q[kind] for q in window if q.get(kind)]
        return float(np.median(vals)) if vals else None

    def put(pairs: tuple[tuple[int, float], ...], v: float | None) -> tuple[tuple[int, float], ...]:
        if v is None:
            return pairs
        return tuple(sorted({**dict(pairs), n: v}.items()))

    copy = med(COPY) or p.host_copy_Bps
    d2h = med(D2H) or (copy if run.emulated else p.d2h_Bps)
    return replace(
        p,
        direct_read_by_n=put(p.direct_read_by_n, med(DIRECT_READ)),
        buffered_read_by_n=put(p.buffered_read_by_n, med(BUFFERED_READ)),
        h2d_Bps=med(H2D) or p.h2d_Bps,
        direct_by_n=put(p.direct_by_n, med(DIRECT_WRITE)),
        buffered_by_n=put(p.buffered_by_n, med(BUFFERED_WRITE)),
        buffered_single_by_n=put(p.buffered_single_by_n, med(BUFFERED_WRITE_1)),
        host_copy_Bps=copy,
        d2h_Bps=d2h,
        serialize_Bps=med(SERIALIZE) or p.serialize_Bps,
    )


def _from_rows(run: Any) -> Profile:
    """'This machine' from the single-copy engine's rows of a run without ceilings.

    d2h and host copy: the env.json ceilings when present, else the median snapshot bandwidth
    of cpu-single (total_bytes / stall_s), which stands for D2H (and, host-emulated, for a host
    memory copy). Per-SSD write: the ceiling `direct_write_Bps` when present, else cpu-single's
    median persist bandwidth (total_bytes / persist_s) at its smallest SSD count.
    """
    ok = run.ok
    single = run.first_with(stall="snapshot", o_direct=True, baseline=False)
    cs = ok[ok["engine"] == single]
    if cs.empty:
        raise UserError(
            f"{run.path}: no rows of a single-copy engine (cpu-single): cannot calibrate the "
            "model from this run"
        )
    snap = float(np.median(cs["total_bytes"] / cs["stall_s"]))
    n_min = int(cs["n_targets"].min())
    at_min = cs[cs["n_targets"] == n_min]
    # a save the device denied durable has no persist time (analysis.runs.deny)
    persist = float(np.nanmedian(at_min["total_bytes"] / at_min["persist_s"]))
    shared = bool(run.shared_device)
    per_ssd = persist if shared else persist / n_min
    tag = "from run"
    rid = run.run_id
    snap_src = f"median total_bytes / stall_s of cpu-single over {len(cs)} rows of run {rid}"
    before = RunCeilings.from_env(run.env).before or Ceilings()
    d2h, copy, direct = (_best(before, kind) for kind in (D2H, COPY, DIRECT_WRITE))
    emu = " (host-emulated: a host memory copy)" if run.emulated else ""
    sources = {
        "d2h_GBps": (tag, f"env.json ceilings: the {D2H.label} ceiling of run {rid}")
        if d2h
        else (tag, f"snapshot bandwidth{emu}: {snap_src}"),
        "ssd_write_GBps": (
            tag,
            f"env.json ceilings: the {DIRECT_WRITE.label} ceiling of 1 target, run {rid}",
        )
        if direct
        else (
            tag,
            f"median total_bytes / persist_s of cpu-single at {n_min} target(s), run {rid}"
            + (" (all targets on one device)" if shared else f", divided by {n_min}"),
        ),
        "ssds_per_gpu": (tag, "distinct devices under the run's targets (env.json storage)"),
        "gpus_sharing_host": ("assumed", "one process checkpoints at a time"),
        "host_copy_GBps": (tag, f"env.json ceilings: the copy ceiling of run {rid}")
        if copy
        else (tag, "assumed equal to the snapshot bandwidth (no copy ceiling in env.json)"),
        "checkpoint_size": (tag, "the largest checkpoint of the run"),
    }
    n_dev = int(run.env.get("storage", {}).get("distinct_devices") or 1)
    table = run.env.get("ranks", {}).get("table") or []
    per_node = [
        sum(1 for t in table if t.get("node_rank") == n)
        for n in {t.get("node_rank") for t in table}
    ]
    if per_node:
        sources["gpus_per_host"] = (tag, f"ranks per node of run {rid} (env.json ranks.table)")
        sources["ssds_per_host"] = (tag, "distinct devices under the run's targets")
    notes = []
    if shared:
        notes.append("all targets share one device: W(n) = w, SSD-count scaling is not real")
    if run.emulated:
        notes.append("host-emulated run: 'D2H' is a host memory copy, gds is O_DIRECT from memory")
    host = _host_from_run(run, copy, sources)
    return Profile(
        **host,
        name=THIS_MACHINE,
        description=f"this machine ({run.env.get('host', '?')}, {run.env.get('cpu', {}).get('model', '?')}), from run {rid}",
        d2h_Bps=d2h or snap,
        ssd_write_Bps=direct or per_ssd,
        ssds_per_gpu=max(1, n_dev),
        gpus_sharing_host=1,
        host_copy_Bps=copy or d2h or snap,
        size_bytes=int(ok["total_bytes"].max()),
        shared_device=shared,
        sources=sources,
        notes=tuple(notes),
        gpus_per_host=max(per_node) if per_node else None,
        ssds_per_host=max(1, n_dev) if per_node else None,
    )


def _host_from_run(
    run: Any, copy_Bps: float | None, sources: dict[str, tuple[str, str]]
) -> dict[str, Any]:
    """The host inputs of 'this machine' from a run: its CPUs (env.json cpu.logical_cores,
    the CPUs the CPU-seconds were counted on), its DRAM bandwidth where the run shows one (a
    host-emulated run's copy ceiling moves 2 bytes of DRAM per byte copied: twice it is what
    the memory moved at least; a CUDA run's copy ceiling is the device link, not DRAM), and the
    CPU-seconds per GB each engine took in the run's own rows."""
    rid = run.run_id
    cores = run.env.get("cpu", {}).get("logical_cores")
    out: dict[str, Any] = {
        "host_cores": float(cores) if cores else None,
        "dram_Bps": None,
        "dram_lower_bound": False,
    }
    if cores:
        sources["host_cores"] = ("from run", f"env.json cpu.logical_cores of run {rid}")
    if run.emulated and copy_Bps:
        out["dram_Bps"], out["dram_lower_bound"] = 2 * copy_Bps, True
        sources["dram_GBps"] = (
            "from run",
            f"2 x the copy ceiling of run {rid} (a memcpy reads and writes each byte): what "
            "the memory moved with the snapshot's threads, a lower bound of its bandwidth",
        )
    per = cost.cpu_cost(run)
    out["cpu_cost"] = tuple((e, t, p) for e, (t, p, _) in per.items())
    whats = sorted({w for _, _, w in per.values()})
    out["cpu_cost_source"] = (
        f"run {rid}: median CPU-seconds per GB durable of each engine's rows ("
        + ", ".join(
            "whole host, others and baseline taken away" if w == "host" else "process only"
            for w in whats
        )
        + ")"
        + (
            "; host-emulated: the snapshot is a CPU copy here, a DMA on a GPU"
            if run.emulated
            else ""
        )
    )
    return out
