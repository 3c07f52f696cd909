"""`ckptbench report RUN_DIR`: the five figures (PNG + PDF), summary.csv, report.md and
report.html in RUN_DIR/report/.

The report answers "is GDS worth it for checkpointing here, and on the servers we might buy?":
the measured summary, the model calibrated from the run beside the hardware profiles, the
break-even SSD count per GPU, and the environment the numbers come from. Each section opens
with its answer in a sentence, then its figure, then the columns a reader needs first; the
whole tables and a glossary close it. Emulated and compat rows are marked in every table and
figure.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from analysis import contention, cost, mlperf, runs, scaling, stats, stragglers, training
from analysis.figures.bandwidth import bandwidth_vs_tensor_size
from analysis.figures.common import save
from analysis.figures.contention import contention as contention_figure
from analysis.figures.feasibility import feasibility
from analysis.figures.host import host_cpu, host_memory
from analysis.figures.planning import lost_fraction
from analysis.figures.restore import restore_figure
from analysis.figures.scaling import memory_figure, times_figure
from analysis.figures.stall import stall_vs_ssds
from analysis.figures.timeline import timeline
from analysis.figures.training import training_stall
from analysis.model.calibrate import from_run
from analysis.model.planning import measured_restores
from analysis.model.profiles import PROFILES_DIR, Profile, load_profiles
from analysis.report.answer import gds_section, profile_rows
from analysis.report.caveats import warnings_for
from analysis.report.contention import contention_section
from analysis.report.doc import Doc, write_doc
from analysis.report.environment import env_rows, training_env_rows
from analysis.report.glossary import glossary_section
from analysis.report.host import host_columns, host_section
from analysis.report.mlperf import mlperf_section
from analysis.report.model import (
    MODEL_CSV,
    model_frame,
    model_section,
    published_headline,
    published_summary,
)
from analysis.report.restore import restore_columns, restore_section
from analysis.report.scaling import scaling_section
from analysis.report.stragglers import stragglers_section
from analysis.report.summary import summary_columns, summary_section
from analysis.report.training import training_section
from analysis.report.tuning import present as tuning_present
from analysis.report.tuning import tuning_section
from analysis.runs import Run
from analysis.tables import text_table
from bench.common.errors import UserError


@dataclass(frozen=True)
class Report:
    """What `report` wrote."""

    outdir: str
    paths: list[str]
    summary: pd.DataFrame
    summary_text: str
    notes: list[str]
    seconds: float


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
        "bandwidth_vs_tensor_size": bandwidth_vs_tensor_size(run),
        "stall_vs_ssds": stall_vs_ssds(run, this),
        "host_memory": host_memory(run),
        "feasibility": feasibility(profiles, run),
        "timeline": timeline(run),
        "restore": restore_figure(run),
    }
    if tr is not None:
        made["training_stall"] = training_stall(tr)
    if contention.present(run):
        made["contention"] = contention_figure(run, this)
    if scaling.present(run):
        made["scaling"] = times_figure(run, this)
        made["scaling_memory"] = memory_figure(run)
    made["host_cpu"] = host_cpu(run)
    if this is not None:
        made["lost_fraction"] = lost_fraction(
            this,
            {e: t for e in run.engines if (t := run.traits(e)) is not None},
            run=run,
            restores=measured_restores(run),
        )
    paths: list[str] = []
    for stem, fig in made.items():
        paths += save(fig, outdir, stem)

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


# The sections at the end that answer no question: what the numbers stand on, every column,
# and what the columns mean. Every other section opens with its answer, in a sentence.
APPENDIX = ("Environment", "All columns", "Glossary")


def document(
    run: Run,
    table: pd.DataFrame,
    this: Profile | None,
    profiles: list[Profile],
    tr: training.TrainingRun | None = None,
) -> Doc:
    """The report's content: the caveats, a section per question (its answer in a sentence,
    its figure, its table's first columns), then the appendix."""
    d = Doc()
    d.h(1, f"ckptbench report: {run.run_id}")
    for w in warnings_for(run):
        d.warn(w)
    d.p(
        f"{len(run.ok)} timed repetitions ({run.excluded.get('warm-up', 0)} warm-ups left out), "
        f"{table.shape[0]} cases, engines: {', '.join(run.engines)}. The Glossary at the end "
        "says what each column means."
    )
    gds_section(d, run, this, profiles)
    summary_section(d, table, trained=tr is not None)
    if tr is not None:
        training_section(d, tr)
    restore_section(d, run, table)
    host_section(d, run, profiles)
    if contention.present(run):
        contention_section(d, run, this)
    if stragglers.present(run):
        stragglers_section(d, run)
    if scaling.present(run):
        scaling_section(d, run)
    if mlperf.present(run):
        mlperf_section(d, run)
    if tuning_present(run):
        tuning_section(d, run)
    model_section(d, run, this, profiles)

    d.h(2, "Environment")
    d.table(["", "value"], env_rows(run.env))
    d.h(2, "All columns")
    d.p(
        "The tables above show the columns a reader needs first; here are the whole tables. "
        "summary.csv, host_cost.csv and model_vs_measured.csv hold the unrounded numbers."
    )
    summary_columns(d, table)
    d.h(3, "Hardware profiles, every column")
    d.table(*profile_rows(profiles))
    restore_columns(d, run, table)
    host_columns(d, run)
    glossary_section(d)
    return d


def build_training(tr: training.TrainingRun, outdir: str, figures_only: bool, t0: float) -> Report:
    """The report of a run directory that holds only a training-loop run."""
    os.makedirs(outdir, exist_ok=True)
    clock = runs.clock_note(tr.env)  # a run with results.csv says it among its caveats
    paths = save(training_stall(tr), outdir, "training_stall")
    table = training.summary(tr)
    summary_text = text_table(*training.summary_rows(table))
    if not figures_only:
        csv_path = os.path.join(outdir, "training_summary.csv")
        table.to_csv(csv_path, index=False)
        d = Doc()
        d.h(1, f"ckptbench report: {tr.run_id}")
        if clock is not None:
            d.warn(clock)
        training_section(d, tr)
        d.h(2, "The model against published measurements")
        d.p(published_headline())
        d.p(published_summary() + " `ckptbench model --validate` prints the table.")
        d.h(2, "Environment")
        d.table(["", "value"], training_env_rows(tr.env))
        glossary_section(d)
        paths += [csv_path, *write_doc(d, outdir, tr.run_id)]
    notes = ([clock] if clock is not None else []) + training.notes(tr)
    return Report(outdir, paths, table, summary_text, notes, time.perf_counter() - t0)


def build_and_say(run_dir: str, output: str | None = None, figures_only: bool = False) -> int:
    """`ckptbench report RUN_DIR` (and `run --report`): build the report and print its summary,
    its notes and the files written; 0."""
    rep = build(run_dir, output, figures_only=figures_only)
    print(rep.summary_text)
    for note in rep.notes:
        print(f"note: {note}")
    print(f"wrote {len(rep.paths)} files to {rep.outdir} in {rep.seconds:.1f} s:")
    for path in rep.paths:
        print(f"  {os.path.relpath(path)}")
    return 0


def after_run(run_dir: str) -> int:
    """`run --report`: the report of the run just made (never another run found by a glob);
    1, said in one line, where it could not be built."""
    from bench.common.errors import UserError

    try:
        return build_and_say(run_dir)
    except UserError as e:
        print(f"ckptbench: the report of {run_dir} could not be built: {e}", file=sys.stderr)
        return 1
