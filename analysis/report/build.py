"""`ckptbench report RUN_DIR`: the five figures (PNG + PDF), summary.csv, report.md and
report.html in RUN_DIR/report/.

The report answers "is GDS worth it for checkpointing here, and on the servers we might buy?":
the measured summary, the model calibrated from the run beside the hardware profiles, the
break-even SSD count per GPU, and the environment the numbers come from. Emulated and compat
rows are marked in every table and figure.
"""

from __future__ import annotations

import html
import math
import os
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis import contention, cost, figures, runs, scaling, stats, training
from analysis.model.calibrate import from_run, near
from analysis.model.host import host_needs
from analysis.model.predict import break_even, break_even_ssds, predict, stall_ratio
from analysis.model.profiles import PROFILES_DIR, THIS_MACHINE, Profile, load_profiles
from analysis.model.render import FORMULAS_MD, describe_break_even, input_rows
from analysis.runs import Run
from analysis.tables import text_table
from bench.errors import UserError
from bench.sizes import format_size

CAPTIONS = {
    "bandwidth_vs_tensor_size": "Figure 1. Bandwidth against tensor size, one line per engine: "
    "(a) write bandwidth to durability = checkpoint bytes / total_s, (b) restore = bytes / "
    "restore_s; GB/s = 1e9 B/s; median of repetitions, error bars the interquartile range.",
    "stall_vs_ssds": "Figure 2. Stall (training waits) against the number of SSDs (targets), "
    "one panel per checkpoint, one colour per engine; markers measured (IQR bars), dashed lines "
    "the model calibrated from this run.",
    "host_memory": "Figure 3. Host memory per engine as multiples of the checkpoint size S: "
    "pinned staging and the page-cache peak (growth of Cached during the save), with the model's "
    "estimate.",
    "feasibility": "Figure 4. Feasibility: GDS stall / CPU-centric stall against SSDs per GPU for "
    "each hardware profile (model), with the break-even SSD count and today's ~1 data SSD per GPU. "
    "This figure answers 'is GDS worth it'.",
    "timeline": "Figure 5. One checkpoint per engine on a time axis: the stall (training waits) "
    "and the background persist phase, with checksum time inside persist (its position "
    "indicative); from the median repetition.",
    "host_cpu": "Figure 9. What each path costs the host: CPU-seconds per GB made durable "
    "against write bandwidth to durability, one line per engine through the tensor sizes of the "
    "largest checkpoint, (a) in the stall and (b) while persisting; filled markers the whole "
    "host (/proc/stat busy time less other processes' CPU and the run's idle baseline: kernel "
    "writeback and interrupts count), hollow this process and its children; medians of "
    "repetitions.",
    "lost_fraction": "Figure 8. What checkpointing costs training on this machine: the expected "
    "fraction of training time lost (stalls plus rework after a failure) against the mean time "
    "between failures, each engine at its best interval (Young/Daly with its stall as the cost; "
    "`ckptbench model PROFILE --mtbf HOURS`).",
    "contention": "Figure 7. Many ranks at once (a multi-rank run): (a) the stall of the slowest "
    "rank and (b) the aggregate write bandwidth (every rank's bytes / the slowest rank's total_s) "
    "against the number of ranks checkpointing at once, solid for shared targets and dashed "
    "(hollow markers) for dedicated ones; dotted: the model's fair share of the host's SSDs and "
    "memory bandwidth, calibrated from the one-rank cases of the same run.",
    "training_stall": "Figure 6. Stall in a real training loop. (a) Wall time of every training "
    "step (forward, backward, AdamW step, and the save() call in the marked steps) against the "
    "step number, one panel per engine; shaded: the checkpoint persisting in the background; "
    "dashed: the median step of the same loop without checkpoints (none). (b) Per engine, per "
    "checkpoint: the step-time inflation against none (sum of its step times - sum of none's over "
    "the same steps); against the engine's own quiet steps (no save, no persist beside them), "
    "split into the step with the save() call and the contention in the steps beside the "
    "background persist; and the engine's median stall_s.",
}


# --- a small document model rendered to Markdown and HTML ------------------------------------


@dataclass
class Doc:
    """Blocks of a report, rendered to Markdown and HTML alike."""

    blocks: list[tuple[str, Any]] = field(default_factory=list)

    def h(self, level: int, text: str) -> None:
        self.blocks.append(("h", (level, text)))

    def p(self, text: str) -> None:
        self.blocks.append(("p", text))

    def warn(self, text: str) -> None:
        self.blocks.append(("warn", text))

    def ul(self, items: list[str]) -> None:
        self.blocks.append(("ul", items))

    def table(self, headers: list[str], rows: list[list[str]]) -> None:
        self.blocks.append(("table", (headers, rows)))

    def img(self, path: str, caption: str) -> None:
        self.blocks.append(("img", (path, caption)))

    def pre(self, text: str) -> None:
        self.blocks.append(("pre", text))

    def markdown(self) -> str:
        out: list[str] = []
        for kind, v in self.blocks:
            if kind == "h":
                out.append(f"{'#' * v[0]} {v[1]}")
            elif kind == "p":
                out.append(v)
            elif kind == "warn":
                out.append(f"> **{v}**")
            elif kind == "ul":
                out.append("\n".join(f"- {i}" for i in v))
            elif kind == "table":
                out.append(md_table(*v))
            elif kind == "img":
                out.append(f"![{v[1].split('.')[0]}]({v[0]})\n\n*{v[1]}*")
            elif kind == "pre":
                out.append(f"```\n{v}\n```")
        return "\n\n".join(out) + "\n"

    def html(self, title: str) -> str:
        out = [f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title>", CSS]
        for kind, v in self.blocks:
            if kind == "h":
                out.append(f"<h{v[0]}>{_inline(v[1])}</h{v[0]}>")
            elif kind == "p":
                out.append(f"<p>{_inline(v)}</p>")
            elif kind == "warn":
                out.append(f"<p class='warn'>{_inline(v)}</p>")
            elif kind == "ul":
                out.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in v) + "</ul>")
            elif kind == "table":
                head = "".join(f"<th>{_inline(h)}</th>" for h in v[0])
                body = "".join(
                    "<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in v[1]
                )
                out.append(f"<table><tr>{head}</tr>{body}</table>")
            elif kind == "img":
                out.append(
                    f"<figure><img src='{html.escape(v[0])}' alt=''>"
                    f"<figcaption>{_inline(v[1])}</figcaption></figure>"
                )
            elif kind == "pre":
                out.append(f"<pre>{html.escape(v)}</pre>")
        return "\n".join(out) + "\n"


CSS = """<style>
body{font-family:sans-serif;max-width:75em;margin:1em auto;padding:0 1em;font-size:14px}
table{border-collapse:collapse;font-size:12px;margin:.5em 0}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}th{background:#f3f3f3}
img{max-width:100%}.warn{color:#a00;font-weight:bold}code{background:#f3f3f3}
figure{margin:1em 0}figcaption{font-size:12px;color:#444}
</style>"""


def _inline(text: str) -> str:
    t = html.escape(text)
    t = re.sub(r"`([^`]+)`", r"<code>\1</code>", t)
    return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", t)


def md_table(headers: list[str], rows: list[list[str]]) -> str:
    def cell(c: str) -> str:
        return str(c).replace("|", "\\|")

    lines = [
        "| " + " | ".join(cell(h) for h in headers) + " |",
        "|" + "|".join("---" for _ in headers) + "|",
    ]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


# --- what the report says ---------------------------------------------------------------------


def warnings_for(run: Run) -> list[str]:
    """Loud lines: what the numbers are not."""
    out = []
    if (left := run.unfinished) is not None:
        out.append(
            f"This run did not finish: {left[0]} of {left[1]} saves recorded; its numbers cover "
            f"only the cases that ran. `ckptbench run CONFIG --resume {run.path}` finishes it."
        )
    if run.emulated:
        out.append(
            "HOST-EMULATED run (no GPU): host memory stands in for GPU memory in every "
            "row; these are not GPU numbers."
        )
    says = {
        "emulated": "rows are a host emulation (O_DIRECT from host memory), NOT GPUDirect Storage.",
        "compat": "rows marked compat ran in kvikio compat mode: NOT GPUDirect Storage.",
    }
    for mode, text in says.items():
        names = sorted(set(run.ok.loc[run.ok["gds_mode"] == mode, "engine"]))
        if names:
            out.append(f"{', '.join(names)} {text}")
    if run.shared_device:
        out.append(
            "All targets share one device: SSD-count scaling on this run is not real scaling."
        )
    if scaling.present(run):
        out += scaling.loud_lines(scaling.fits(run))
    if "restore_resident_bytes" in run.ok:
        # More than 0.1 % of a checkpoint still cached (a page or two of DCP's files stays
        # resident after eviction here: 4 KiB of 256 MiB is no memory read worth a word).
        resident = pd.to_numeric(run.ok["restore_resident_bytes"], errors="coerce").fillna(0)
        cached = resident > 0.001 * run.ok["total_bytes"]
        if cached.any():
            out.append(
                f"{int(cached.sum())} restore(s) began with more than 0.1 % of the checkpoint "
                f"still in the page cache (up to {resident.max() / 2**20:.1f} MiB, mincore after "
                "eviction): their restore bandwidth is partly a memory read."
            )
    bad = {k: v for k, v in run.excluded.items() if k != "warm-up" and v}
    if bad:
        out.append(
            "Rows left out of the statistics: "
            + ", ".join(f"{v} with {k}" for k, v in bad.items())
            + "."
        )
    return out


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
            ]
        )
    return headers, rows


def answer(run: Run, this: Profile | None, profiles: list[Profile]) -> list[str]:
    """The paragraphs that answer 'is GDS worth it here'."""
    out = []
    sr = stall_ratios(run)
    emu = " (host-emulated: an O_DIRECT emulation of GDS, not GDS)" if run.emulated else ""
    if not sr.empty:
        lo, hi, med = sr["ratio"].min(), sr["ratio"].max(), sr["ratio"].median()
        verdict = "longer" if med > 1 else "shorter"
        out.append(
            f"**Measured here{emu}:** gds stalled training {med:.2f}x as long as cpu-single "
            f"(median over {len(sr)} cases, range {lo:.2f}-{hi:.2f}x): the GDS path stalls "
            f"{verdict}, because it holds the tensors until they are durable while the "
            "CPU-centric path stalls only for the snapshot into host memory."
        )
    if this is not None:
        out.append(f"**The model calibrated from this run:** {describe_break_even(this)}.")
    servers = [p for p in profiles if p.name != THIS_MACHINE]
    if servers:
        bes = [break_even_ssds(p) for p in servers]
        finite = [b for b in bes if b is not None]
        today = [p.ssds_per_gpu for p in servers]
        ratios = [stall_ratio(p, p.ssds_per_gpu) for p in servers]
        worth = [
            p.name
            for p, b in zip(servers, bes, strict=True)
            if b is not None and b <= p.ssds_per_gpu
        ]
        if finite:
            out.append(
                f"**On the profiled servers** GDS needs {min(finite)}-{max(finite)} SSDs per GPU "
                f"to stall no longer than a CPU-centric snapshot; they carry about "
                f"{int(np.median(today))} per GPU, where GDS stalls {min(ratios):.1f}-"
                f"{max(ratios):.1f}x as long. "
                + (
                    f"GDS breaks even on: {', '.join(worth)}."
                    if worth
                    else "On none of them is GDS worth it for the stall."
                )
            )
    out.append(
        "Figure 4 (feasibility) answers the question; Figure 2 shows the measured stall "
        "beside the model, Figure 3 the host memory the CPU-centric paths pay for it."
    )
    out.append(host_answer(run, servers))
    return out


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


def model_frame(run: Run, this: Profile) -> pd.DataFrame:
    """Predicted vs measured median stall and time to durability for every measured case (the
    columns of model_vs_measured.csv)."""
    table = stats.summary_table(run)
    rows = []
    for _, r in table.iterrows():
        t = run.traits(r["engine"])
        if t is None:
            continue
        n = int(r["n_targets"]) if t.stripes else 1
        here = near(this, run, r["workload"], int(r["n_targets"]))
        pr = predict(here, r["engine"], n, float(r["total_bytes"]), t, g=1)
        rows.append(
            {
                "workload": r["workload"],
                "n_targets": int(r["n_targets"]),
                "engine": r["engine"],
                "mode": r["mode"],
                "stall_model_s": pr.stall_s,
                "stall_measured_s": r["stall_s"],
                "durable_model_s": pr.durable_s,
                "durable_measured_s": r["total_s"],
            }
        )
    return pd.DataFrame(rows, columns=[*MODEL_CSV[:3], "mode", *MODEL_CSV[3:]])


MODEL_CSV = [
    "workload",
    "n_targets",
    "engine",
    "stall_model_s",
    "stall_measured_s",
    "durable_model_s",
    "durable_measured_s",
]


def model_vs_measured(frame: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """The model-against-measurement table of the report."""
    headers = [
        "workload",
        "SSDs",
        "engine",
        "mode",
        "stall s: model",
        "measured",
        "error %",
        "durable s: model",
        "measured",
        "error %",
    ]
    rows = []
    for _, r in frame.iterrows():
        e1 = 100 * (r["stall_model_s"] / r["stall_measured_s"] - 1)
        e2 = 100 * (r["durable_model_s"] / r["durable_measured_s"] - 1)
        rows.append(
            [
                r["workload"],
                str(r["n_targets"]),
                r["engine"],
                (r["mode"] or "").upper() or "-",
                stats.fmt(r["stall_model_s"]),
                stats.fmt(r["stall_measured_s"]),
                f"{e1:+.0f}",
                stats.fmt(r["durable_model_s"]),
                stats.fmt(r["durable_measured_s"]),
                f"{e2:+.0f}",
            ]
        )
    return headers, rows


def model_errors(frame: pd.DataFrame) -> pd.DataFrame:
    """Median absolute error per engine, stall and time to durability (fractions)."""
    f = frame.assign(
        stall_err=(frame["stall_model_s"] / frame["stall_measured_s"] - 1).abs(),
        durable_err=(frame["durable_model_s"] / frame["durable_measured_s"] - 1).abs(),
    )
    return f.groupby("engine", sort=False)[["stall_err", "durable_err"]].median()


def model_misses(frame: pd.DataFrame, run: Run) -> list[str]:
    """Where the model still misses by more than 20 % (median over an engine's cases), with the
    reason the run itself shows: the model assumes every engine reaches the device ceilings, so
    an engine's own efficiency (bench.efficiency, medians) says how far it fell short."""
    out = []
    ok = run.ok
    for e, r in model_errors(frame).iterrows():
        rows = ok[ok["engine"] == e]
        sub = frame[frame["engine"] == e]
        for what, col, eff in (
            ("stall", "stall", "snapshot_eff"),
            ("time to durability", "durable", "write_eff"),
        ):
            if r[f"{col}_err"] <= 0.2:
                continue
            under = (sub[f"{col}_model_s"] < sub[f"{col}_measured_s"]).mean() > 0.5
            why = []
            med = rows[eff].median() if eff in rows else float("nan")
            if eff == "snapshot_eff" and med == med:
                why.append(f"its snapshots ran at {med:.2f} of the copy ceiling")
            elif eff == "write_eff" and med == med:
                why.append(f"it wrote at {med:.2f} of its ceiling end to end")
                multi = rows[rows["n_targets"] > 1]
                if run.shared_device and len(multi) and multi[eff].median() < med:
                    why.append(
                        f"{multi[eff].median():.2f} over several targets that share one device"
                    )
            if what == "stall" and not why:
                why.append("its stall includes its library's own work, which no ceiling measures")
            out.append(
                f"{e}: the model {'under' if under else 'over'}estimates the {what} by "
                f"{100 * r[f'{col}_err']:.0f} % ({'; '.join(why)})"
            )
    return out


def _ceilings_text(c: Any, prefix: str = "") -> str:
    """env.json ceilings, flattened, with *_Bps in GB/s."""
    if not isinstance(c, dict):
        return str(c)
    parts = []
    for k, v in c.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            parts.append(_ceilings_text(v, f"{name}."))
        elif k.endswith("_Bps") and isinstance(v, int | float):
            parts.append(f"{name[:-4]} {v / 1e9:.2f} GB/s")
        elif k.endswith("_runs") and isinstance(v, list):
            parts.append(f"{name} {' '.join(f'{x / 1e9:.2f}' for x in v)} GB/s")
        else:
            parts.append(f"{name} {v}")
    return "; ".join(parts)


def env_rows(env: dict[str, Any]) -> list[list[str]]:
    """The environment as (key, value) rows."""
    rows: list[list[str]] = []

    def add(k: str, v: Any) -> None:
        if v not in (None, "", [], {}):
            rows.append([k, str(v)])

    cpu = env.get("cpu", {})
    add("host", env.get("host"))
    add("os / kernel", f"{env.get('os', '?')} / {env.get('kernel', '?')}")
    add("python", env.get("python"))
    add("CPU", f"{cpu.get('model', '?')}, {cpu.get('logical_cores', '?')} logical cores")
    if env.get("memory_bytes"):
        add("memory", format_size(int(env["memory_bytes"])))
    dev = env.get("device", {})
    add("device", f"{dev.get('kind', '?')}" + (" (EMULATED)" if dev.get("emulated") else ""))
    gpu = env.get("gpu", {})
    if gpu.get("present"):
        add(
            "GPU",
            f"{gpu.get('name', '?')}, driver {gpu.get('driver', '?')}, PCIe gen "
            f"{gpu.get('pcie_gen', '?')} x{gpu.get('pcie_width', '?')}",
        )
    else:
        add("GPU", "none")
    kv = env.get("kvikio", {})
    add("kvikio", ", ".join(f"{k}={v}" for k, v in kv.items()))
    st = env.get("storage", {})
    for i, t in enumerate(st.get("targets", [])):
        b = t.get("block", {})
        add(
            f"target {i}",
            f"{t.get('path')}: {t.get('fstype')} on {t.get('source')} "
            f"(disk {b.get('disk', '?')}, rotational={b.get('rotational', '?')}, "
            f"mount {t.get('mount')})",
        )
    if "shared_device" in st:
        add(
            "targets share one device",
            "YES: SSD-count scaling is not real" if st["shared_device"] else "no",
        )
    if env.get("ceilings"):
        add("device ceilings", _ceilings_text(env["ceilings"]))
    g = env.get("git", {})
    add("git", f"{g.get('commit', '?')}" + (" (dirty)" if g.get("dirty") else ""))
    add("packages", ", ".join(f"{k} {v}" for k, v in env.get("packages", {}).items()))
    cfg = env.get("config", {})
    if cfg:
        add(
            "config",
            f"engines {cfg.get('engines')}, total_sizes "
            f"{[format_size(s) for s in cfg.get('total_sizes', [])]}, tensor_sizes "
            f"{[format_size(s) for s in cfg.get('tensor_sizes', [])]}, models "
            f"{cfg.get('models')}, ssd_counts {cfg.get('ssd_counts')}, repetitions "
            f"{cfg.get('repetitions')}, warmups {cfg.get('warmups')}",
        )
    for n in env.get("notes", []):
        add("note", n)
    return rows


@dataclass(frozen=True)
class Report:
    """What `report` wrote."""

    outdir: str
    paths: list[str]
    summary: pd.DataFrame
    summary_text: str
    notes: list[str]
    seconds: float


def write_doc(doc: Doc, outdir: str, run_id: str) -> list[str]:
    """report.md and report.html of `doc` in `outdir`; their paths."""
    md = os.path.join(outdir, "report.md")
    with open(md, "w") as f:
        f.write(doc.markdown())
    html_path = os.path.join(outdir, "report.html")
    with open(html_path, "w") as f:
        f.write(doc.html(f"ckptbench report {run_id}"))
    return [md, html_path]


def build(
    run_dir: str,
    outdir: str | None = None,
    figures_only: bool = False,
    profiles_dir: str | None = None,
) -> Report:
    """Write the figures (and unless figures_only, summary.csv, report.md, report.html).

    A training-loop run (training_steps.csv, `ckptbench train`) adds Figure 6 and its section;
    a run directory with only those files gets a report of that section alone."""
    t0 = time.perf_counter()
    tr = training.load(run_dir) if training.present(run_dir) else None
    has_results = os.path.isfile(os.path.join(run_dir, "results.csv"))
    if tr is not None and not has_results:
        return build_training(tr, outdir or os.path.join(run_dir, "report"), figures_only, t0)
    run = runs.load(run_dir)
    outdir = outdir or os.path.join(run_dir, "report")
    os.makedirs(outdir, exist_ok=True)
    pdir = PROFILES_DIR if profiles_dir is None else Path(profiles_dir)
    servers = load_profiles(pdir)
    try:
        this: Profile | None = from_run(run)
    except UserError:
        this = None
    profiles = servers + ([this] if this is not None else [])

    made = {
        "bandwidth_vs_tensor_size": figures.bandwidth_vs_tensor_size(run),
        "stall_vs_ssds": figures.stall_vs_ssds(run, this),
        "host_memory": figures.host_memory(run),
        "feasibility": figures.feasibility(profiles, run),
        "timeline": figures.timeline(run),
    }
    if tr is not None:
        made["training_stall"] = figures.training_stall(tr)
    if contention.present(run):
        made["contention"] = figures.contention(run, this)
    if scaling.present(run):
        made["scaling"] = scaling.times_figure(run, this)
        made["scaling_memory"] = scaling.memory_figure(run)
    made["host_cpu"] = figures.host_cpu(run)
    if this is not None:
        made["lost_fraction"] = figures.lost_fraction(
            this, {e: t for e in run.engines if (t := run.traits(e)) is not None}, run=run
        )
    paths: list[str] = []
    for stem, fig in made.items():
        paths += figures.save(fig, outdir, stem)

    table = stats.summary_table(run)
    headers, rows = stats.summary_rows(table)
    summary_text = text_table(headers, rows)
    if tr is not None:
        summary_text += "\n\n" + text_table(*training.summary_rows(training.summary(tr)))
    if not figures_only:
        csv_path = os.path.join(outdir, "summary.csv")
        table.to_csv(csv_path, index=False)
        host_csv = os.path.join(outdir, "host_cost.csv")
        cost.table(run).to_csv(host_csv, index=False)
        paths.append(host_csv)
        if this is not None:
            mvm = os.path.join(outdir, "model_vs_measured.csv")
            model_frame(run, this)[MODEL_CSV].to_csv(mvm, index=False)
            paths.append(mvm)
        doc = document(run, table, this, profiles, tr)
        paths += [csv_path, *write_doc(doc, outdir, run.run_id)]
    notes = warnings_for(run) + (training.notes(tr) if tr is not None else [])
    if contention.present(run):
        notes += [
            f"aggregate write bandwidth, {n}" for n in contention.notes(contention.table(run, this))
        ]
    return Report(outdir, paths, table, summary_text, notes, time.perf_counter() - t0)


def document(
    run: Run,
    table: pd.DataFrame,
    this: Profile | None,
    profiles: list[Profile],
    tr: training.TrainingRun | None = None,
) -> Doc:
    """The report's content."""
    d = Doc()
    d.h(1, f"ckptbench report: {run.run_id}")
    for w in warnings_for(run):
        d.warn(w)
    n_rows = len(run.ok)
    d.p(
        f"{n_rows} timed repetitions ({run.excluded.get('warm-up', 0)} warm-ups left out), "
        f"{table.shape[0]} cases, engines: {', '.join(run.engines)}. GB/s = 1e9 B/s; write "
        "bandwidth = checkpoint bytes / total_s (until durable)."
    )

    d.h(2, "Is GDS worth it here?")
    for para in answer(run, this, profiles):
        d.p(para)
    d.table(*profile_rows(profiles))
    d.img("feasibility.png", CAPTIONS["feasibility"])

    d.h(2, "Summary")
    d.p(
        "Per case: n timed repetitions; medians with their interquartile range (IQR); "
        "'durable s' = median total_s; pinned and page cache as multiples of the checkpoint "
        "size S; 'x torch-save' = torch-save's median (same workload, its one SSD) over this "
        "engine's, for the stall and for the time to durability; 'x best baseline' the same "
        "against the best of the libraries users would otherwise pick (torch.save, DCP, "
        "safetensors, FastPersist: whichever ran), each by its shortest median on the workload. "
        "Mode: EMULATED = host-emulated "
        "device (and for gds the O_DIRECT emulation), COMPAT = kvikio compat mode."
        + (
            " Write eff = bytes / (save() called until durable) over the ceiling of the engine's "
            "kind of write for the targets it wrote; snapshot eff = bytes / stall over the copy "
            "(device-to-host) ceiling; both against the best ceilings measured before and after "
            "the sweep (env.json). 'ceiling beaten' marks a median above 1.05: the ceiling, not "
            "the engine, is then in question."
            if table["write_eff"].notna().any()
            else " No device ceilings in env.json: no efficiency column."
        )
    )
    d.table(*stats.summary_rows(table))

    host_section(d, run, profiles)

    d.h(2, "Figures")
    for stem in figures.FIGURES:
        if stem != "feasibility":
            d.img(f"{stem}.png", CAPTIONS[stem])
    if this is not None:
        d.img("lost_fraction.png", CAPTIONS["lost_fraction"])
    if tr is not None:
        d.p(
            "PDF versions sit beside the PNGs. Figure 5 times one checkpoint alone; Figure 6 "
            "(below) shows checkpoint phases against the steps of a training loop."
        )
        training_section(d, tr)
    else:
        d.p(
            "PDF versions sit beside the PNGs. Figure 5 times one checkpoint alone; checkpoint "
            "phases against the steps of a real training loop come from `ckptbench train "
            "configs/training.yaml`, whose report draws them (Figure 6)."
        )
    if contention.present(run):
        contention_section(d, run, this)
    if scaling.present(run):
        scaling.section(d, run)

    d.h(2, "The model")
    d.p(
        "`analysis/model.py`: each GPU's checkpoint when g GPUs of a host checkpoint at once "
        "(`model.predict`); the same function gives the headline, the tables and Figures 2-4."
    )
    d.p(FORMULAS_MD)
    if this is not None:
        d.h(3, "This machine, calibrated from this run")
        d.table(["input", "value", "kind", "source"], [list(r) for r in input_rows(this)])
        for note in this.notes:
            d.p(f"Note: {note}.")
        d.h(3, "Model against measurement")
        frame = model_frame(run, this)
        errs = model_errors(frame)
        d.p(
            "Predicted vs measured medians per case (error = (model - measured) / measured), "
            "the model built from this run's device ceilings alone (never from the engines' "
            "rows); model_vs_measured.csv has the numbers. Median absolute error per engine: "
            + "; ".join(
                f"{e} stall {100 * r['stall_err']:.0f} %, durable {100 * r['durable_err']:.0f} %"
                for e, r in errs.iterrows()
            )
            + "."
        )
        misses = model_misses(frame, run)
        d.p(
            "Where it still misses: " + "; ".join(misses) + "."
            if misses
            else "Every engine's median error is within 20 %."
        )
        d.table(*model_vs_measured(frame))
    d.h(3, "Hardware profiles")
    d.p(
        "From `configs/hardware/*.yaml`; every figure cites shared/reference/figures.md or is "
        "marked assumed. `ckptbench model PROFILE` prints each one's inputs and sources."
    )
    for p in profiles:
        if p.name != THIS_MACHINE:
            d.p(f"**{p.name}**: {p.description}")
            d.ul([f"{k}: {v} ({kind}; {src})" for k, v, kind, src in input_rows(p)])

    d.h(2, "Environment")
    d.table(["", "value"], env_rows(run.env))
    return d


def host_section(d: Doc, run: Run, profiles: list[Profile]) -> None:
    """What each path costs the host: the per-engine table, Figure 9 and the servers."""
    d.h(2, "What each path costs the host")
    host = cost.has_host(run)
    d.p(
        "Per engine, medians over every timed repetition, per GB made durable (1e9 B): CPU "
        "seconds of this process (every thread and the children it ran) and of the whole host "
        "(/proc/stat busy time less other processes' CPU time and the run's idle baseline, so "
        "kernel writeback, journal threads and interrupts count), the host's part in the stall "
        "and while persisting; cores busy while persisting (a path that persists inside its "
        "stall: over the whole save); host DRAM bytes moved per checkpoint byte, measured from "
        "the memory controllers' counters where the run read them, else derived from the path's "
        "copies (`derived`; on this run's device, and on a GPU server beside it). host_cost.csv "
        "has the numbers."
        + ("" if host else " This run predates the host columns: the process figure alone.")
    )
    d.table(*cost.rows_md(cost.table(run)))
    d.img("host_cpu.png", CAPTIONS["host_cpu"])
    d.p(
        "What it would cost each profiled host to checkpoint all its GPUs at its SSDs' "
        "aggregate rate, charged this run's CPU-seconds per GB (servers) or the profile's own "
        "(this machine): cores = CPU-s/GB x GB/s, DRAM = derived bytes per byte x GB/s, against "
        "the host's cores and DRAM peak as the profiles cite them (`unknown` where a profile "
        "cites none); 'DRAM % lost persisting' = the share of the peak the path takes beside "
        "training while it persists. `ckptbench model PROFILE` prints the same with the "
        "reference run's CPU cost (configs/hardware/cpu-cost/reference.yaml)."
    )
    d.table(*host_profile_rows(with_run_cost(profiles, run)))


# --- the training-loop run (`ckptbench train`) ------------------------------------------------


def training_section(d: Doc, tr: training.TrainingRun) -> None:
    """Figure 6, the training summary table and what it says."""
    table = training.summary(tr)
    cfg = tr.env.get("config", {})
    m = cfg.get("model", {})
    info = tr.env.get("training", {})
    d.h(2, "Stall in a real training loop")
    for n in training.notes(tr):
        d.warn(n)
    if m:
        d.p(
            f"A {m.get('n_layers')}-layer transformer (d_model {m.get('d_model')}, vocab "
            f"{m.get('vocab')}, {info.get('params', 0) / 1e6:.1f}M parameters) trained with "
            f"AdamW on synthetic tokens (batch {m.get('batch_size')} x {m.get('seq_len')}), "
            f"{cfg.get('steps')} timed steps per engine with a save every "
            f"{cfg.get('checkpoint_every')} steps of the model and optimizer state "
            f"({format_size(int(info.get('state_bytes', 0)))}); torch threads "
            f"{info.get('torch_threads', '?')}."
        )
    d.p(
        "The step-time inflation is what training really feels: the engine's stall plus the "
        "contention the background persist causes in the steps that run beside it (GIL, memory "
        "bandwidth, the writer threads' CPU time); it is compared here with the engine-level "
        "stall_s. Two estimates per checkpoint: against `none` (sum of the engine's step times - "
        "sum of none's), and against the engine's own quiet steps (neither a save nor beside a "
        "persist), which the drift of the machine's speed between the engines' runs does not "
        "reach. Times in seconds; stall_s and durable s are medians over the timed saves."
    )
    said = []
    for _, r in table[table["engine"] != training.NONE].iterrows():
        if math.isfinite(r["inflation_s"]) and math.isfinite(r["stall_s"]) and r["stall_s"] > 0:
            said.append(
                f"{r['label']} {stats.fmt(r['inflation_s'])} s against a "
                f"{stats.fmt(r['stall_s'])} s stall_s "
                f"({r['inflation_s'] / r['stall_s']:.1f}x)"
            )
    if said:
        d.p("Measured, per checkpoint against the quiet steps: " + "; ".join(said) + ".")
    for note in training.drift_notes(table):
        d.p(f"Note: {note}.")
    d.table(*training.summary_rows(table))
    d.img("training_stall.png", CAPTIONS["training_stall"])


def training_env_rows(env: dict[str, Any]) -> list[list[str]]:
    """env_rows with the training config in place of the sweep's."""
    rows = [r for r in env_rows({k: v for k, v in env.items() if k != "config"})]
    cfg = env.get("config", {})
    if cfg:
        keys = (
            "engines",
            "steps",
            "checkpoint_every",
            "warmup_steps",
            "warmup_checkpoints",
            "model",
            "lr",
            "weight_decay",
            "threads",
            "seed",
            "targets",
        )
        rows.append(["config", ", ".join(f"{k} {cfg.get(k)}" for k in keys)])
    return rows


def build_training(tr: training.TrainingRun, outdir: str, figures_only: bool, t0: float) -> Report:
    """The report of a run directory that holds only a training-loop run."""
    os.makedirs(outdir, exist_ok=True)
    paths = figures.save(figures.training_stall(tr), outdir, "training_stall")
    table = training.summary(tr)
    summary_text = text_table(*training.summary_rows(table))
    if not figures_only:
        csv_path = os.path.join(outdir, "training_summary.csv")
        table.to_csv(csv_path, index=False)
        d = Doc()
        d.h(1, f"ckptbench report: {tr.run_id}")
        training_section(d, tr)
        d.h(2, "Environment")
        d.table(["", "value"], training_env_rows(tr.env))
        paths += [csv_path, *write_doc(d, outdir, tr.run_id)]
    return Report(outdir, paths, table, summary_text, training.notes(tr), time.perf_counter() - t0)


# --- many ranks at once (`ckptbench run --nproc N`) -------------------------------------------


def contention_section(d: Doc, run: Run, this: Profile | None) -> None:
    """Figure 7, the measured aggregate bandwidth against one rank's, and the model beside it."""
    t = contention.table(run, this)
    r = run.env.get("ranks", {})
    d.h(2, "Many ranks at once")
    d.p(
        f"{r.get('world_size', '?')} ranks under torchrun ({r.get('backend', '?')}), each saving "
        f"its own shard ({'the total split evenly' if r.get('shard') == 'even' else 'a whole total each'}) "
        "into its own targets; every repetition starts at a barrier, so the ranks contend for "
        "the SSDs, the PCIe root complexes and the host's memory bandwidth for real. Aggregate "
        "rows: stall and time to durability = the slowest rank's, bytes = all ranks'. "
        "Mappings: " + ", ".join(r.get("mapping", [])) + "; with one rank a case runs once and "
        "stands for every mapping. env.json `ranks.layout` lists every rank's directories."
    )
    said = contention.notes(t)
    if said:
        d.p("**Measured aggregate write bandwidth against one rank alone:**")
        d.ul(said)
    if run.shared_device:
        d.warn(
            "All targets share one device: shared and dedicated targets divide the same "
            "device's bandwidth here; the difference between them is the cost of interleaving "
            "the ranks' files, not of more devices."
        )
    d.img("contention.png", CAPTIONS["contention"])
    d.p(
        "The model (dotted; `analysis.model.predict_shared`): g ranks of one host each get W(m) "
        "/ g of the host's m SSDs and C / g of its memory-copy bandwidth; per-rank stall = S_r / "
        "min(L, W(m)/g) for gds, S_r / min(b, C/g) for the CPU-centric snapshot. It gives shared "
        "and dedicated targets the same share: their measured difference is what it leaves out."
    )
    d.table(*contention.rows(t))
