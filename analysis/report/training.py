"""The report's section on a training-loop run (`ckptbench train`): what a checkpoint costs the
loop, in a sentence, then Figure 6, the training summary table (analysis.training), what it
says and the restart.
"""

from __future__ import annotations

import math

import pandas as pd

from analysis import stats, training
from analysis.report.captions import CAPTIONS
from analysis.report.doc import Doc
from bench.common.sizes import format_size


def headline(table: pd.DataFrame) -> str:
    """What a checkpoint costs a real training loop, in one sentence: the engine whose
    checkpoints inflate the steps least, against its own stall_s."""
    t = table[(table["engine"] != training.NONE) & table["inflation_s"].notna()]
    if t.empty:
        return "0 checkpoints were timed against quiet steps in this loop."
    r = t.nsmallest(1, "inflation_s").iloc[0]
    ratio = (
        f" ({r['inflation_s'] / r['stall_s']:.1f}x its {stats.fmt(r['stall_s'])} s stall_s)"
        if math.isfinite(r["stall_s"]) and r["stall_s"] > 0
        else ""
    )
    return (
        f"In a real training loop {r['label']} costs training least, "
        f"{stats.fmt(r['inflation_s'])} s of step time a checkpoint against its quiet "
        f"steps{ratio}."
    )


def training_section(d: Doc, tr: training.TrainingRun) -> None:
    """The answer, the loop's caveats, Figure 6, the training summary table, what it says, the
    restart table."""
    table = training.summary(tr)
    cfg = tr.env.get("config", {})
    m = cfg.get("model", {})
    info = tr.env.get("training", {})
    d.h(2, "Stall in a real training loop")
    d.p(headline(table))
    for n in training.notes(tr):
        d.warn(n)
    d.img("training_stall.png", CAPTIONS["training_stall"])
    d.table(*training.summary_rows(table))
    if m:
        d.p(
            f"A {m.get('n_layers')}-layer transformer (d_model {m.get('d_model')}, vocab "
            f"{m.get('vocab')}, {info.get('params', 0) / 1e6:.1f}M parameters) trained with "
            f"AdamW on synthetic tokens (batch {m.get('batch_size')} x {m.get('seq_len')}), "
            f"{cfg.get('steps')} timed steps per engine with a save every "
            f"{cfg.get('checkpoint_every')} steps of the model and optimizer state "
            f"({format_size(int(info.get('state_bytes', 0)))}); torch threads "
            f"{info.get('torch_threads', '?')}. The step-time inflation is what training "
            "really feels: the engine's stall plus the contention the background persist "
            "causes in the steps beside it."
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
    restart = restart_rows(tr)
    if restart[1]:
        d.p("The restart, from a failure to the first training step after the load:")
        d.table(*restart)


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
