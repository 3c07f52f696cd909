"""The report's section on a training-loop run (`ckptbench train`): Figure 6, the training
summary table (analysis.training) and what it says.
"""

from __future__ import annotations

import math

import pandas as pd

from analysis import stats, training
from analysis.report.captions import CAPTIONS
from analysis.report.doc import Doc
from bench.common.sizes import format_size


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
    restart = restart_rows(tr)
    if restart[1]:
        d.p(
            "The restart, from a failure to the first training step after the load: the last "
            "checkpoint loaded with the page cache dropped, load_state_dict into a fresh model "
            "and optimizer (built before the clock starts), and one training step, device "
            "synchronised; the harness's clock, one restart per engine. `losses match`: the "
            "first steps after it had the uninterrupted run's losses, bit for bit."
        )
        d.table(*restart)
    d.img("training_stall.png", CAPTIONS["training_stall"])


def restart_rows(tr: training.TrainingRun) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of the restart table: one row per engine whose last checkpoint was
    restarted from (training_checkpoints.csv `restart_*`); none for a run written before."""
    headers = [
        "engine",
        "restart s",
        "of it load s",
        "load_state_dict s",
        "first step s",
        "losses match",
    ]
    c = tr.ckpts
    rows = []
    for e in tr.engines:
        r = c[(c["engine"] == e) & c["restart_s"].notna()]
        if r.empty:
            continue
        x = r.iloc[-1]
        apply_s = x["restart_s"] - x["restart_load_s"] - x["restart_first_step_s"]
        match = x["restart_loss_match"]
        rows.append(
            [
                tr.label(e),
                stats.fmt(x["restart_s"]),
                stats.fmt(x["restart_load_s"]),
                stats.fmt(apply_s),
                stats.fmt(x["restart_first_step_s"]),
                "-" if pd.isna(match) else ("yes" if match else "NO"),
            ]
        )
    return headers, rows
