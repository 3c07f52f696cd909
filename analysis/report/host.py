"""The report's section on what each path costs the host: the cheapest and dearest path in a
sentence, Figure 9, the per-engine table's first columns (analysis.cost), this run's figures and
the profiled hosts' verdicts charged this run's CPU cost, Figure 3 and the hosts' table.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from analysis import cost
from analysis.model.host import host_needs
from analysis.model.profiles import THIS_MACHINE, Profile
from analysis.report.captions import CAPTIONS
from analysis.report.doc import Doc, columns
from analysis.runs import Run


def with_run_cost(profiles: list[Profile], run: Run) -> list[Profile]:
    """The server profiles charged this run's CPU-seconds per GB (the report's verdicts
    measure the paths here, not the reference run's)."""
    per = cost.cpu_cost(run)
    if not per:
        return profiles
    rows = tuple((e, t, p) for e, (t, p, _) in per.items())
    src = f"run {run.run_id} (this report's run)"
    return [
        p if p.name == THIS_MACHINE else replace(p, cpu_cost=rows, cpu_cost_source=src)
        for p in profiles
    ]


def host_answer(run: Run, servers: list[Profile]) -> str:
    """The answer's line on what each path costs the host: CPU-seconds per GB here, and the
    servers' verdicts with this run's CPU cost."""
    t = cost.table(run)
    host = cost.has_host(run)
    col = "host_cpu_s_per_GB" if host else "process_cpu_s_per_GB"
    parts = [
        f"{r['engine']} {r[col]:.2f}" + (f" ({r['process_cpu_s_per_GB']:.2f})" if host else "")
        for _, r in t.iterrows()
        if not np.isnan(r[col])
    ]
    emu = ", host-emulated" if run.emulated else ""
    text = (
        f"**What it costs the host (this run{emu}):** CPU-seconds per GB made durable, "
        + (
            "the whole host (this process alone): "
            if host
            else "this process (no host figure in this run): "
        )
        + "; ".join(parts)
        + "."
    )
    if host:
        more, less = cost.kernel_beside(run)
        text += (
            f" The host paid more than the process (host - process per repetition, its "
            f"interquartile range above zero) for {', '.join(more)}: kernel work beside it."
            if more
            else " For no engine did the host pay more than the process beyond the "
            "measurement's noise (host - process per repetition, its interquartile range "
            "not above zero): kernel work beside the saves was below what the ticks resolve."
        )
        if less:
            text += (
                f" For {', '.join(less)} the baseline took away more than the kernel did beside "
                "them (its interquartile range below zero): their host figure is low by that."
            )
    verdicts = []
    for p in with_run_cost(servers, run):
        needs = host_needs(p)
        bad = [n.engine for n in needs if n.verdict.startswith("cannot")]
        unknown = [n.engine for n in needs if n.verdict.startswith("unknown")]
        top = max((n for n in needs), key=lambda n: n.dram_Bps_persist, default=None)
        line = f"{p.name}: " + (
            f"cannot afford {', '.join(bad)}"
            if bad
            else "affords every path"
            if not unknown
            else f"unknown for {', '.join(unknown)}"
        )
        if top is not None and top.dram_share_persist is not None:
            line += (
                f" (persisting, {top.engine} takes {100 * top.dram_share_persist:.0f} % of its "
                "DRAM peak from training)"
            )
        verdicts.append(line)
    if verdicts:
        text += (
            " Checkpointing every GPU at the SSDs' rate with these CPU costs (Figure 9, the "
            "host table below): " + "; ".join(verdicts) + "."
        )
    return text


def host_profile_rows(profiles: list[Profile]) -> tuple[list[str], list[list[str]]]:
    """Per profile and engine: cores and DRAM GB/s needed to checkpoint every GPU at the SSDs'
    rate, and the verdict."""
    headers = [
        "profile",
        "engine",
        "cores needed (host has)",
        "DRAM GB/s (host peak)",
        "DRAM % lost persisting",
        "verdict",
    ]
    out = []
    for p in profiles:
        for n in host_needs(p):
            have = "unknown" if p.host_cores is None else f"{p.host_cores:g}"
            peak = "unknown" if p.dram_Bps is None else f"{p.dram_Bps / 1e9:.0f}"
            share = n.dram_share_persist
            out.append(
                [
                    p.name,
                    n.engine,
                    ("unknown" if n.host_cores is None else f"{n.host_cores:.1f}") + f" ({have})",
                    f"{n.dram_Bps / 1e9:.1f} ({peak})",
                    "unknown" if share is None else f"{100 * share:.1f}",
                    n.verdict,
                ]
            )
    return headers, out


FIRST = [
    "engine",
    "n",
    "CPU s/GB, host",
    "host: stall",
    "host: persist",
    "DRAM B/B",
    "write GB/s",
]


def headline(run: Run) -> str:
    """What the paths cost the host, in one sentence: the cheapest and the dearest per GB."""
    t = cost.table(run)
    col = "host_cpu_s_per_GB" if cost.has_host(run) else "process_cpu_s_per_GB"
    t = t[t[col].notna()]
    if t.empty:
        return "0 repetitions recorded what they cost the host's CPUs."
    cheap, dear = t.nsmallest(1, col).iloc[0], t.nlargest(1, col).iloc[0]
    who = "the host" if col.startswith("host") else "this process"
    return (
        f"The cheapest path for {who} is {cheap['engine']}, {cheap[col]:.2f} CPU-s per GB made "
        f"durable; the dearest {dear['engine']}, {dear[col]:.2f}"
        + (f" ({dear[col] / cheap[col]:.1f}x)" if cheap[col] > 0 else "")
        + "."
    )


def host_section(d: Doc, run: Run, profiles: list[Profile]) -> None:
    """The answer, Figure 9, the per-engine table's first columns, this run's figures and the
    servers' verdicts in a paragraph, Figure 3 and the profiled hosts' table."""
    d.h(2, "What each path costs the host")
    d.p(headline(run))
    if not cost.has_host(run):
        d.p("This run predates the host columns: the process figure alone.")
    d.img("host_cpu.png", CAPTIONS["host_cpu"])
    d.table(*columns(cost.rows_md(cost.table(run)), FIRST))
    d.p(cost.floor_sentence(run))
    if cost.floor(run) is not None:
        d.table(*cost.floor_rows(cost.floor_table(run)))
    servers = [p for p in profiles if p.name != THIS_MACHINE]
    d.p(host_answer(run, servers))
    d.img("host_memory.png", CAPTIONS["host_memory"])
    d.p(
        "Each profiled host checkpointing all its GPUs at its SSDs' aggregate rate, charged "
        "this run's CPU-seconds per GB (servers) or the profile's own (this machine); "
        "`ckptbench model PROFILE` prints the same with the reference run's CPU cost "
        "(configs/hardware/cpu-cost/reference.yaml)."
    )
    d.table(*host_profile_rows(with_run_cost(profiles, run)))


def host_columns(d: Doc, run: Run) -> None:
    """The whole per-engine table (host_cost.csv has the unrounded numbers)."""
    d.h(3, "What each path costs the host, every column")
    d.table(*cost.rows_md(cost.table(run)))
