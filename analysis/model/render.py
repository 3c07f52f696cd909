"""What `ckptbench model PROFILE` prints, and the model's text the report quotes: the inputs with
their sources, the feasibility table, the break-even headline, the sharing table, the host's
cost table, the checkpoint plan as text and as JSON (`--json`). Imports analysis.tables and
every other module of analysis.model but calibrate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from analysis.model.host import HostNeed, host_needs
from analysis.model.planning import plan
from analysis.model.predict import (
    ENGINES,
    break_even,
    break_even_ssds,
    predict,
    predict_all,
    restore_break_even,
    restore_gain,
    snapshot_Bps,
    stall_ratio,
)
from analysis.model.profiles import GB, Profile
from analysis.tables import text_table

FORMULAS_MD = """\
g GPUs of one host checkpoint at once; each has d = min(b, C/g) into host memory, W_g = W(m)/g of
the storage (m SSDs shared), and writes through the page cache at up to C/g.

| engine | write rate r | stall | time to durability | host memory |
|---|---|---|---|---|
| gds (from device) | W_g | S / min(L, r) | = stall | 0 |
| cpu-single (snapshot, O_DIRECT) | W_g | S / d | S/d + S/r | S (pinned staging) |
| cpu-double (snapshot, page cache) | min(P(m)/g, C/g) | S / d | S/d + S/r | 2 S (staging + page cache) |
| torch-save (durable, page cache, 1 SSD, one writer) | min(P1(1)/g, C/g, z) | S/d + S/r | = stall | S (page cache) |
| dcp (snapshot, page cache, 1 SSD) | min(P(1)/g, C/g, z) | S / d | S/d + S/r | 2 S (staging + page cache) |

S: checkpoint size of one GPU; b: its device-to-host link; L: its link for GDS (= b unless
given); C: what the host's memory takes in from all GPUs; w: one SSD's write bandwidth, W(m) of
m SSDs (m w; w when all targets share one device; as measured on this machine); P(m): the
page-cache path to durability (as measured, else W(m)); P1(m): the same with one writer, for
engines that write with one thread (as measured, else P(m)); z: the serialisation rate of torch.save
and DCP (as measured). GDS stall / CPU-centric stall R = d / min(L, n w) with n SSDs per GPU;
break-even n* = d / w. Every engine is placed by its traits, so a new one gets its row."""

# --- the terminal table ----------------------------------------------------------------------

INPUT_LABELS = {
    "d2h_GBps": "device-to-host b",
    "gds_link_GBps": "GDS link L",
    "ssd_write_GBps": "SSD write w",
    "ssd_read_GBps": "SSD read r",
    "h2d_GBps": "host-to-device h",
    "ssds_per_gpu": "SSDs per GPU n",
    "gpus_sharing_host": "GPUs sharing host g",
    "gpus_per_host": "GPUs per host",
    "ssds_per_host": "SSDs per host m",
    "host_copy_GBps": "host copy C",
    "checkpoint_size": "checkpoint S",
    "host_cores": "host CPU cores",
    "dram_GBps": "host DRAM bandwidth",
}


def fmt_bytes(n: float) -> str:
    """Decimal GB for model tables (the profiles quote GB and GB/s)."""
    return f"{n / GB:.3g} GB" if n else "0"


def input_rows(p: Profile) -> list[tuple[str, str, str, str]]:
    """(input, value, kind, source) for the profile's inputs."""
    values = {
        "d2h_GBps": f"{p.d2h_Bps / GB:.2f} GB/s",
        "gds_link_GBps": f"{p.link / GB:.2f} GB/s",
        "ssd_write_GBps": f"{p.ssd_write_Bps / GB:.2f} GB/s",
        "ssd_read_GBps": "unknown" if p.ssd_read_Bps is None else f"{p.ssd_read_Bps / GB:.2f} GB/s",
        "h2d_GBps": "none" if p.h2d_Bps is None else f"{p.h2d_Bps / GB:.2f} GB/s",
        "ssds_per_gpu": str(p.ssds_per_gpu),
        "gpus_sharing_host": str(p.gpus_sharing_host),
        "gpus_per_host": str(p.host_gpus),
        "ssds_per_host": str(p.host_ssds),
        "host_copy_GBps": f"{p.host_copy_Bps / GB:.1f} GB/s (c = {p.copy_per_gpu / GB:.1f} GB/s a GPU)",
        "checkpoint_size": fmt_bytes(p.size_bytes),
        "host_cores": "unknown" if p.host_cores is None else f"{p.host_cores:g}",
        "dram_GBps": "unknown" if p.dram_Bps is None else f"{p.dram_Bps / GB:.1f} GB/s",
    }
    src = p.sources or {}
    out = []
    for k, label in INPUT_LABELS.items():
        if k in ("host_cores", "dram_GBps") and k not in src:
            out.append((label, values[k], "unknown", "no cited figure in the profile"))
            continue
        if k == "ssd_read_GBps" and k not in src:
            out.append((label, values[k], "unknown", "no read figure: restores not modelled"))
            continue
        if k == "h2d_GBps" and k not in src:
            what = "no link: restores land in host memory" if p.h2d_Bps is None else ""
            out.append((label, values[k], "derived" if what else "", what))
            continue
        if k == "gds_link_GBps" and k not in src:
            out.append((label, values[k], "derived", "= b (the GPU's own x16 link)"))
            continue
        if k == "gpus_per_host" and k not in src:
            out.append((label, values[k], "derived", "= g (the GPUs sharing the host)"))
            continue
        if k == "ssds_per_host" and k not in src:
            out.append((label, values[k], "derived", "= n x GPUs per host"))
            continue
        kind, source = src.get(k, ("", ""))
        out.append((label, values[k], kind, source))
    return out


def ratio_counts(p: Profile) -> list[int]:
    """SSD counts for the ratio row: powers of two to 16, plus the break-even and n."""
    counts = {1, 2, 4, 8, 16, p.ssds_per_gpu}
    be = break_even_ssds(p)
    if be is not None and be <= 64:
        counts.add(be)
    return sorted(counts)


def describe_break_even(p: Profile, g: int | None = None) -> str:
    """The headline: break-even SSDs per GPU with g GPUs at once (default: the profile's)."""
    g = g or p.gpus_sharing_host
    n = break_even(p, g)
    d, w = snapshot_Bps(p, g) / GB, p.ssd_write_Bps / GB
    at = f" with {g} GPU(s) checkpointing at once" if g > 1 else ""
    most = max((k for k, _ in p.direct_by_n), default=0)
    if math.isinf(n):
        if p.shared_device:
            return (
                f"break-even{at}: never on this storage (all targets share one device: "
                f"{w:.2f} GB/s < d = {d:.2f} GB/s, and adding targets does not add bandwidth)"
            )
        if p.direct_by_n and p.link >= d:
            return (
                f"break-even{at}: not within the measured target counts (W({most}) = "
                f"{p.storage_Bps(most) / GB:.2f} GB/s < d = {d:.2f} GB/s)"
            )
        return f"break-even{at}: never (GDS link L = {p.link / GB:.2f} GB/s < d = {d:.2f} GB/s)"
    if p.direct_by_n and not p.shared_device:
        return (
            f"break-even{at}: {break_even_ssds(p, g)} SSDs per GPU (the fewest measured target "
            f"count where GDS stalls no longer than a CPU-centric snapshot; d = {d:.2f} GB/s)"
        )
    return (
        f"break-even{at}: {break_even_ssds(p, g)} SSDs per GPU (n* = d / w = {d:.2f} / {w:.2f} "
        f"= {n:.2f}, d = min(b, C/g)); GDS stalls {stall_ratio(p, p.ssds_per_gpu, g):.2f}x as "
        f"long as a CPU-centric snapshot with the {p.ssds_per_gpu} SSD(s) per GPU of this host"
    )


def describe_restore_break_even(p: Profile, g: int | None = None) -> str:
    """Whether GDS loads faster, and from how many SSDs per GPU (g GPUs at once)."""
    g = g or p.gpus_sharing_host
    n = restore_break_even(p, g)
    if p.h2d_Bps is None:
        return "restore: no host-to-device link on this run: GDS reads no faster than O_DIRECT"
    h_g = min(p.h2d_Bps, p.host_copy_Bps / g) / GB
    if math.isinf(n):
        return (
            f"restore: GDS never loads faster (the host's share h_g = {h_g:.2f} GB/s is the whole "
            f"host-to-device link)"
        )
    return (
        f"restore: GDS loads faster from {max(1, math.floor(n) + 1)} SSDs per GPU "
        f"(n > h_g / r = {h_g:.2f} / {(p.ssd_read_Bps or 0) / GB:.2f} = {n:.2f}; "
        f"h_g = min(h, C/g))"
    )


def feasibility_text(p: Profile) -> str:
    """What `ckptbench model PROFILE` prints."""
    lines = [f"profile {p.name}: {p.description}", ""]
    rows, sources = [], []
    for name, value, kind, source in input_rows(p):
        if source not in sources:
            sources.append(source)
        rows.append([name, value, kind, f"[{sources.index(source) + 1}]"])
    lines.append(text_table(["input", "value", "kind", "source"], rows))
    lines += [f"  [{i}] {s}" for i, s in enumerate(sources, 1)]
    for note in p.notes:
        lines.append(f"note: {note}")
    n, g = p.ssds_per_gpu, p.gpus_sharing_host
    lines += [
        "",
        f"each GPU's checkpoint of {fmt_bytes(p.size_bytes)}, {g} GPU(s) at once, "
        f"{n} SSD(s) per GPU:",
    ]
    rows = []
    for pr in predict_all(p, n):
        rows.append(
            [
                pr.engine,
                f"{pr.stall_s:.3g}",
                f"{pr.durable_s:.3g}",
                f"{fmt_bytes(pr.host_bytes)} ({pr.host_bytes / p.size_bytes:.0f} x S)",
                "unknown" if math.isnan(pr.restore_s) else f"{pr.restore_s:.3g}",
            ]
        )
    lines.append(text_table(["engine", "stall s", "durable s", "host memory", "restore s"], rows))
    counts = ratio_counts(p)
    ratios = stall_ratio(p, counts)
    lines += ["", f"GDS stall / CPU-centric stall, by SSDs per GPU ({g} GPU(s) at once):"]
    lines.append(
        text_table(
            ["SSDs per GPU", *[str(c) for c in counts]],
            [["ratio", *[f"{r:.2f}" for r in ratios]]],
        )
    )
    lines += ["", describe_break_even(p)]
    if p.ssd_read_Bps is not None or p.direct_read_by_n:
        gains = restore_gain(p, counts)
        assumed = " (read figures assumed)" if p.assumed("ssd_read_GBps", "h2d_GBps") else ""
        lines += [
            "",
            f"restore: CPU-centric / GDS restore time, by SSDs per GPU ({g} GPU(s) at once)"
            f"{assumed}:",
            text_table(
                ["SSDs per GPU", *[str(c) for c in counts]],
                [["gain", *[f"{r:.2f}" for r in gains]]],
            ),
            "",
            describe_restore_break_even(p),
        ]
    lines += ["", sharing_text(p)]
    lines += ["", host_text(p)]
    return "\n".join(lines)


def sharing_counts(p: Profile) -> list[int]:
    """GPUs checkpointing at once for the sharing table: powers of two up to the host's GPUs."""
    g = p.host_gpus
    return sorted({1, g} | {x for x in (2, 4, 8, 16) if x < g})


def sharing_text(p: Profile) -> str:
    """Per-rank stall and the host's aggregate write bandwidth when g GPUs of one host save
    their shards at once over its SSDs (shared targets; predict_shared)."""
    m, counts = p.host_ssds, sharing_counts(p)
    head = (
        f"g GPUs of one host saving their {fmt_bytes(p.size_bytes)} shards at once over "
        f"its {m} SSD(s), shared targets: per-rank stall s (aggregate GB/s to durability)"
    )
    rows = []
    for g in counts:
        cells = []
        for e in ENGINES:
            pr = predict(p, e, m, g=g)
            cells.append(f"{pr.stall_s:.3g} ({g * p.size_bytes / pr.durable_s / GB:.3g})")
        rows.append([str(g), *cells])
    return head + "\n" + text_table(["g GPUs", *ENGINES], rows)


def host_text(p: Profile) -> str:
    """The host's cost table of `ckptbench model PROFILE`."""

    def f(v: float | None, fmt: str) -> str:
        return "unknown" if v is None else fmt.format(v)

    needs = host_needs(p)
    rate = needs[0].rate_Bps if needs else p.storage_Bps(p.host_ssds)
    head = (
        f"what the host pays to checkpoint all {p.host_gpus} GPU(s) at its {p.host_ssds} SSDs' "
        f"{rate / GB:.3g} GB/s (host: {f(p.host_cores, '{:g}')} cores, "
        f"{f(None if p.dram_Bps is None else p.dram_Bps / GB, '{:.0f} GB/s')} "
        + (
            "of DRAM traffic seen, a lower bound of its bandwidth, so the share lost is an upper "
            "bound"
            if p.dram_lower_bound
            else "DRAM peak"
        )
        + "): cores = "
        "CPU-seconds per GB durable x GB/s; DRAM = bytes moved per checkpoint byte (derived "
        "from the path's copies) x GB/s; 'persisting' = the part beside training"
    )
    rows = []
    for n in needs:
        share = n.dram_share_persist
        rows.append(
            [
                n.engine,
                f(n.cpu_s_per_GB, "{:.2f}"),
                f(n.host_cores, "{:.1f}"),
                f(n.host_cores_persist, "{:.1f}"),
                f"{n.dram_per_byte:g}",
                f"{n.dram_Bps / GB:.1f}",
                f(None if share is None else 100 * share, "{:.1f}"),
                n.verdict,
            ]
        )
    table = text_table(
        [
            "engine",
            "CPU s/GB",
            "cores",
            "cores persisting",
            "DRAM B/B",
            "DRAM GB/s",
            "DRAM % lost persisting",
            "verdict",
        ],
        rows,
    )
    src = f"CPU-seconds per GB: {p.cpu_cost_source or 'none measured'}"
    # indented under its heading (and so never read as the per-engine table above it)
    return head + "\n" + "\n".join("  " + ln for ln in table.splitlines()) + "\n" + src


RESTORE_FROM = {"measured": "", "model": " (model)", "unknown": " (unknown: 0)"}


def plan_text(
    p: Profile, mtbf_h: float, restart_s: float = 0.0, restores: Mapping[str, float] | None = None
) -> str:
    """The checkpoint plan as a table; `restores`: each engine's measured restore (a run's)."""
    g = p.gpus_sharing_host
    rows = []
    for pl in plan(p, mtbf_h * 3600, restart_s, restores=restores):
        rows.append(
            [
                pl.engine,
                f"{pl.stall_s:.3g}",
                f"{pl.durable_s:.3g}",
                f"{pl.restore_s:.3g}{RESTORE_FROM[pl.restore_from]}",
                f"{pl.interval_s / 60:.3g}" + (" (persist)" if pl.limited_by_persist else ""),
                f"{100 * pl.lost_fraction:.2f}",
                fmt_bytes(pl.host_bytes),
            ]
        )
    head = (
        f"checkpoint interval for an MTBF of {mtbf_h:g} h ({g} GPU(s) at once, "
        f"{fmt_bytes(p.size_bytes)} each, restart {restart_s:g} s + the path's restore): "
        "Young/Daly with the stall as the cost; restore s: measured in the run"
        + ("" if restores else " (none here)")
        + ", '(model)' the model's; '(persist)': held back to the time to persist"
    )
    return (
        head
        + "\n"
        + text_table(
            [
                "engine",
                "stall s",
                "durable s",
                "restore s",
                "interval min",
                "lost %",
                "host memory",
            ],
            rows,
        )
    )


def plan_json(
    p: Profile, mtbf_h: float, restart_s: float = 0.0, restores: Mapping[str, float] | None = None
) -> dict[str, Any]:
    """The plan as JSON (`restore_s` each engine's restart read, `restore_from` measured or
    model: `restores` are a run's measured ones); each engine also says what checkpointing every GPU at the SSDs'
    rate costs the host (`host_need`): `host_cores` and `dram_GBps` needed (null: unknown),
    beside the host's own (`host`)."""
    needs = {n.engine: n for n in host_needs(p)}
    rate = next(iter(needs.values())).rate_Bps if needs else p.storage_Bps(p.host_ssds)
    src = p.sources or {}
    return {
        "profile": p.name,
        "mtbf_hours": mtbf_h,
        "restart_s": restart_s,
        "gpus_at_once": p.gpus_sharing_host,
        "checkpoint_bytes": p.size_bytes,
        "host": {
            "cores": p.host_cores,
            "dram_GBps": None if p.dram_Bps is None else p.dram_Bps / GB,
            "ssd_rate_GBps": rate / GB,
            "cores_source": src.get("host_cores", ("unknown", "no cited figure"))[1],
            "dram_source": src.get("dram_GBps", ("unknown", "no cited figure"))[1],
            "cpu_cost_source": p.cpu_cost_source or None,
        },
        "engines": {
            pl.engine: {
                "interval_s": pl.interval_s,
                "lost_fraction": pl.lost_fraction,
                "stall_s": pl.stall_s,
                "durable_s": pl.durable_s,
                "host_bytes": pl.host_bytes,
                "limited_by_persist": pl.limited_by_persist,
                "restore_s": pl.restore_s,
                "restore_from": pl.restore_from,
                **_need_json(needs[pl.engine]),
            }
            for pl in plan(p, mtbf_h * 3600, restart_s, restores=restores)
        },
    }


def _need_json(n: HostNeed) -> dict[str, Any]:
    return {
        "host_cores": n.host_cores,
        "host_cores_persisting": n.host_cores_persist,
        "cpu_s_per_GB": n.cpu_s_per_GB,
        "dram_GBps": n.dram_Bps / GB,
        "dram_GBps_persisting": n.dram_Bps_persist / GB,
        "dram_bytes_per_byte": n.dram_per_byte,
        "dram_source": "derived",
        "dram_share_lost_persisting": n.dram_share_persist,
        "host_verdict": n.verdict,
    }
