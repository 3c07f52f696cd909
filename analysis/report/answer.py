"""The report's answer to "Is GDS worth it here?": a sentence (the measured stall ratio, the
SSDs per GPU the profiled servers would need), Figure 4, the profiles' first columns, then the
model's break-even here, the servers and restores in a line each.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis import stats
from analysis.model.predict import (
    break_even,
    break_even_ssds,
    restore_break_even,
    restore_gain,
    stall_ratio,
)
from analysis.model.profiles import THIS_MACHINE, Profile
from analysis.model.render import describe_break_even
from analysis.report.captions import CAPTIONS
from analysis.report.doc import Doc, columns
from analysis.runs import Run


def stall_ratios(run: Run) -> pd.DataFrame:
    """Measured median stall of the GDS path (from device memory, until durable) over the
    single-copy CPU path (snapshot, then O_DIRECT) per (workload, n_targets)."""
    st = stats.case_stats(run.ok, "stall_s").set_index(["workload", "n_targets", "engine"])
    gds = run.first_with(from_device=True)
    single = run.first_with(stall="snapshot", o_direct=True, baseline=False)
    rows = []
    for (wl, n), _ in st.groupby(level=[0, 1], sort=False):
        try:
            g = st.loc[(wl, n, gds), "median"]
            c = st.loc[(wl, n, single), "median"]
        except KeyError:
            continue
        rows.append(
            {
                "workload": wl,
                "n_targets": n,
                "gds_stall_s": g,
                "cpu_single_stall_s": c,
                "ratio": g / c,
            }
        )
    return pd.DataFrame(rows)


def profile_rows(profiles: list[Profile]) -> tuple[list[str], list[list[str]]]:
    headers = [
        "profile",
        "b: D2H GB/s",
        "w: SSD write GB/s",
        "SSDs per GPU today",
        "GDS / CPU-centric stall at that count",
        "break-even SSDs per GPU (n*)",
        "r: SSD read GB/s",
        "CPU-centric / GDS restore at that count",
    ]
    rows = []
    for p in profiles:
        be = break_even(p)
        be_txt = (
            ("never (one shared device)" if p.shared_device else "never")
            if math.isinf(be)
            else f"{break_even_ssds(p)} ({be:.2f})"
        )
        rows.append(
            [
                p.name,
                f"{p.d2h_Bps / 1e9:.2f}",
                f"{p.ssd_write_Bps / 1e9:.2f}",
                str(p.ssds_per_gpu),
                f"{stall_ratio(p, p.ssds_per_gpu):.2f}",
                be_txt,
                "-"
                if p.ssd_read_Bps is None
                else f"{p.ssd_read_Bps / 1e9:.2f}"
                + (" (assumed)" if p.assumed("ssd_read_GBps") else ""),
                _gain_text(p),
            ]
        )
    return headers, rows


def _gain_text(p: Profile) -> str:
    """CPU-centric restore / GDS restore at the profile's SSDs per GPU, or why there is none."""
    gain = restore_gain(p, p.ssds_per_gpu)
    if not math.isfinite(gain):
        return "not modelled (no read figure)"
    if p.h2d_Bps is None:
        return f"{gain:.2f} (no host-to-device link)"
    return f"{gain:.2f}" + (" (assumed)" if p.assumed("ssd_read_GBps", "h2d_GBps") else "")


PROFILE_FIRST = [
    "profile",
    "SSDs per GPU today",
    "GDS / CPU-centric stall at that count",
    "break-even SSDs per GPU (n*)",
    "CPU-centric / GDS restore at that count",
]


def headline(run: Run, profiles: list[Profile]) -> str:
    """The answer in one sentence: the stall measured here, and the SSDs per GPU the profiled
    servers would need for GDS to stall no longer."""
    sr = stall_ratios(run)
    emu = ", host-emulated" if run.emulated else ""
    parts = []
    if not sr.empty:
        med = sr["ratio"].median()
        parts.append(
            f"here gds stalled training {med:.2f}x as long as cpu-single (median of {len(sr)} "
            f"case{'s' if len(sr) != 1 else ''}{emu})"
        )
    servers = [p for p in profiles if p.name != THIS_MACHINE]
    finite = [b for p in servers if (b := break_even_ssds(p)) is not None]
    if finite:
        today = int(np.median([p.ssds_per_gpu for p in servers]))
        worth = _worth(servers)
        parts.append(
            f"the profiled servers would need {min(finite)}-{max(finite)} SSDs per GPU for GDS "
            f"to stall no longer, and carry about {today}"
            + (f" (it breaks even on {', '.join(worth)})" if worth else "")
        )
    if not parts:
        return (
            f"This run's {len(run.engines)} engine(s) hold no gds and cpu-single pair, and no "
            "server profile breaks even: the tables below have what was measured."
        )
    text = "; ".join(parts)
    return text[0].upper() + text[1:] + "."


def _worth(servers: list[Profile]) -> list[str]:
    """The servers on which GDS stalls no longer than a CPU-centric snapshot at their SSDs."""
    return [
        p.name for p in servers if (b := break_even_ssds(p)) is not None and b <= p.ssds_per_gpu
    ]


def answer(run: Run, this: Profile | None, profiles: list[Profile]) -> list[str]:
    """The lines under the answer that say how it was reached."""
    out = []
    sr = stall_ratios(run)
    emu = " (host-emulated: an O_DIRECT emulation of GDS, not GDS)" if run.emulated else ""
    if not sr.empty:
        lo, hi = sr["ratio"].min(), sr["ratio"].max()
        verdict = "longer" if sr["ratio"].median() > 1 else "shorter"
        out.append(
            f"**Measured here{emu}:** {lo:.2f}-{hi:.2f}x over the cases: the GDS path stalls "
            f"{verdict}, because it holds the tensors until they are durable while the "
            "CPU-centric path stalls only for the snapshot into host memory."
        )
    if this is not None:
        out.append(f"**The model calibrated from this run:** {describe_break_even(this)}.")
    servers = [p for p in profiles if p.name != THIS_MACHINE]
    if servers:
        finite = [b for p in servers if (b := break_even_ssds(p)) is not None]
        ratios = [stall_ratio(p, p.ssds_per_gpu) for p in servers]
        worth = _worth(servers)
        if finite:
            out.append(
                f"**On the profiled servers** at their SSD count GDS stalls {min(ratios):.1f}-"
                f"{max(ratios):.1f}x as long as a CPU-centric snapshot; "
                + (
                    f"GDS breaks even on: {', '.join(worth)}."
                    if worth
                    else "on none of them is GDS worth it for the stall."
                )
            )
        gains = [restore_gain(p, p.ssds_per_gpu) for p in servers]
        known = [(p, x) for p, x in zip(servers, gains, strict=True) if math.isfinite(x)]
        if known:
            faster = [restore_break_even(p) for p, _ in known]
            n_from = sorted({max(1, math.floor(n) + 1) for n in faster if math.isfinite(n)})
            out.append(
                f"**Loading a checkpoint** (a restart, all GPUs at once) GDS is "
                f"{min(x for _, x in known):.2f}-{max(x for _, x in known):.2f}x as fast as "
                "the CPU-centric O_DIRECT path on the profiled servers at their SSD count"
                + (
                    f"; it loads faster from {n_from[0]}-{n_from[-1]} SSDs per GPU on, where "
                    "a GPU's SSDs read faster than its share of the host's memory (C/g) feeds "
                    "its link, which bounds the CPU path and not GDS"
                    if n_from
                    else ""
                )
                + " (Figure 4 (b); the section Restores has what this run measured)."
            )
    out.append(
        "Figure 4 (feasibility) answers the question; Figure 2 (Summary) shows the measured "
        "stall beside the model, Figure 3 (the host's section) the host memory the CPU-centric "
        "paths pay for it."
    )
    return out


def gds_section(d: Doc, run: Run, this: Profile | None, profiles: list[Profile]) -> None:
    """The answer in a sentence, Figure 4, the profiles' first columns, how it was reached."""
    d.h(2, "Is GDS worth it here?")
    d.p(headline(run, profiles))
    d.img("feasibility.png", CAPTIONS["feasibility"])
    d.table(*columns(profile_rows(profiles), PROFILE_FIRST))
    d.ul(answer(run, this, profiles))
