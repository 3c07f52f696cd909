"""The report's section on the model: its formulas, this machine calibrated from the run, the
model against the measurement (model_vs_measured.csv), the model against published GPU-server
measurements (configs/published.yaml) and the hardware profiles.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from analysis import stats
from analysis.model.calibrate import near
from analysis.model.predict import predict
from analysis.model.profiles import THIS_MACHINE, Profile
from analysis.model.published import PUBLISHED, Validation, source_list, validate
from analysis.model.published import summary as validation_summary
from analysis.model.published import table as validation_table
from analysis.model.render import FORMULAS_MD, input_rows
from analysis.report.captions import CAPTIONS
from analysis.report.doc import Doc
from analysis.runs import Run
from bench.common.errors import UserError


def model_frame(run: Run, this: Profile) -> pd.DataFrame:
    """Predicted vs measured median stall, time to durability and restore for every measured
    case (the columns of model_vs_measured.csv; the restore's model NaN where the run measured
    no read ceilings)."""
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
                "restore_model_s": pr.restore_s,
                "restore_measured_s": r["restore_s"],
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
    "restore_model_s",
    "restore_measured_s",
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
        "restore s: model",
        "measured",
        "error %",
    ]
    rows = []
    for _, r in frame.iterrows():
        e1 = 100 * (r["stall_model_s"] / r["stall_measured_s"] - 1)
        e2 = 100 * (r["durable_model_s"] / r["durable_measured_s"] - 1)
        e3 = 100 * (r["restore_model_s"] / r["restore_measured_s"] - 1)
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
                stats.fmt(r["restore_model_s"]),
                stats.fmt(r["restore_measured_s"]),
                f"{e3:+.0f}" if math.isfinite(e3) else "-",
            ]
        )
    return headers, rows


def model_errors(frame: pd.DataFrame) -> pd.DataFrame:
    """Median absolute error per engine, stall, time to durability and restore (fractions; the
    restore's NaN where it was not modelled)."""
    f = frame.assign(
        stall_err=(frame["stall_model_s"] / frame["stall_measured_s"] - 1).abs(),
        durable_err=(frame["durable_model_s"] / frame["durable_measured_s"] - 1).abs(),
        restore_err=(frame["restore_model_s"] / frame["restore_measured_s"] - 1).abs(),
    )
    return f.groupby("engine", sort=False)[["stall_err", "durable_err", "restore_err"]].median()


def model_misses(frame: pd.DataFrame, run: Run) -> list[str]:
    """Where the model still misses by more than 20 % (median over an engine's cases), with the
    reason the run itself shows: the model assumes every engine reaches the device ceilings, so
    an engine's own efficiency (bench.measure.efficiency, medians) says how far it fell short."""
    out = []
    ok = run.ok
    for e, r in model_errors(frame).iterrows():
        rows = ok[ok["engine"] == e]
        sub = frame[frame["engine"] == e]
        for what, col, eff in (
            ("stall", "stall", "snapshot_eff"),
            ("time to durability", "durable", "write_eff"),
            ("restore", "restore", "restore_eff"),
        ):
            if not r[f"{col}_err"] > 0.2:  # within 20 %, or not modelled (NaN)
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
            elif eff == "restore_eff" and med == med:
                why.append(f"it read at {med:.2f} of its read ceiling")
            if what == "stall" and not why:
                why.append("its stall includes its library's own work, which no ceiling measures")
            if what == "restore" and not why:
                why.append("no read ceiling judged its restores")
            out.append(
                f"{e}: the model {'under' if under else 'over'}estimates the {what} by "
                f"{100 * r[f'{col}_err']:.0f} % ({'; '.join(why)})"
            )
    return out


def _validation(path: Path) -> Validation | UserError:
    """The model against the published measurements of `path`, or why it is not available."""
    try:
        return validate(path)
    except UserError as e:
        return e


def published_headline(path: Path = PUBLISHED, v: Validation | UserError | None = None) -> str:
    """The model against published measurements in one sentence (`v`: already validated)."""
    v = _validation(path) if v is None else v
    if isinstance(v, UserError):
        return f"The model against published measurements: 0 points read ({v})."
    return (
        f"Against {len(v.independent)} independent published measurements the model's median "
        f"error is {100 * v.median_error:.0f} %."
    )


def headline(frame: pd.DataFrame | None, v: Validation | UserError) -> str:
    """How well the model holds, in one sentence: its median error against this run's cases
    (`frame`: model_frame, None without a calibrated profile), then against the published
    measurements."""
    pub = published_headline(v=v)
    if frame is None:
        return pub
    errs = model_errors(frame)
    if errs.empty:
        return pub
    return (
        f"Built from this run's device ceilings alone, the model predicts the stall within a "
        f"median {100 * errs['stall_err'].median():.0f} % and the time to durability within "
        f"{100 * errs['durable_err'].median():.0f} % over the {len(errs)} engines; "
        + pub[0].lower()
        + pub[1:]
    )


def model_section(d: Doc, run: Run, this: Profile | None, profiles: list[Profile]) -> None:
    """The answer, Figure 8, the formulas, this machine's inputs, the model against the
    measurement, the profiles."""
    d.h(2, "The model")
    frame = model_frame(run, this) if this is not None else None
    v = _validation(PUBLISHED)
    d.p(headline(frame, v))
    if this is not None:
        d.img("lost_fraction.png", CAPTIONS["lost_fraction"])
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
        assert frame is not None  # made above for this profile
        errs = model_errors(frame)
        d.p(
            "Predicted vs measured medians per case (error = (model - measured) / measured), "
            "the model built from this run's device ceilings alone (never from the engines' "
            "rows); model_vs_measured.csv has the numbers. Median absolute error per engine: "
            + "; ".join(
                f"{e} stall {100 * r['stall_err']:.0f} %, durable {100 * r['durable_err']:.0f} %"
                + (
                    f", restore {100 * r['restore_err']:.0f} %"
                    if math.isfinite(r["restore_err"])
                    else ""
                )
                for e, r in errs.iterrows()
            )
            + "."
            + (
                ""
                if frame["restore_model_s"].notna().any()
                else " Restores are not modelled: the run measured no read ceilings."
            )
        )
        misses = model_misses(frame, run)
        d.p(
            "Where it still misses: " + "; ".join(misses) + "."
            if misses
            else "Every engine's median error is within 20 %."
        )
        d.table(*model_vs_measured(frame))
    _published_section(d, v)
    d.h(3, "Hardware profiles")
    d.p(
        "From `configs/hardware/*.yaml`; every figure cites shared/reference/figures.md or is "
        "marked assumed. `ckptbench model PROFILE` prints each one's inputs and sources."
    )
    for p in profiles:
        if p.name != THIS_MACHINE:
            d.p(f"**{p.name}**: {p.description}")
            d.ul([f"{k}: {v} ({kind}; {src})" for k, v, kind, src in input_rows(p)])


def published_summary(path: Path = PUBLISHED) -> str:
    """The one-paragraph summary of the model against published measurements (median error,
    the worst point and why); a line saying why not where the file cannot be read."""
    try:
        return validation_summary(validate(path))
    except UserError as e:
        return f"The model against published measurements: not available ({e})."


def published_section(d: Doc, path: Path = PUBLISHED) -> None:
    """The model against published GPU-server measurements: the summary, the table with each
    point's hardware, the sources and what was left out (`ckptbench model --validate`)."""
    _published_section(d, _validation(path))


def _published_section(d: Doc, v: Validation | UserError) -> None:
    d.h(3, "Model against published measurements")
    if isinstance(v, UserError):
        d.warn(f"The model against published measurements: not available ({v})")
        return
    d.p(
        validation_summary(v)
        + " Each point's profile is built from its own source's figures (`ckptbench model "
        "--validate` prints the table, `--json` gives it); error = (predicted - measured) / "
        "measured, * a miss of more than 25 %, (fig.) a value read off a figure."
    )
    d.table(*validation_table(v))
    d.ul([f"[{i}] {s}" for i, s in enumerate(source_list(v), 1)])
    misses = [f"{r.point.id}: {r.point.why}" for r in v.rows if r.miss]
    if misses:
        d.p(
            "Where it misses by more than 25 % (independent points and consistency checks), and why:"
        )
        d.ul(misses)
    if v.left_out:
        d.p("Left out, too thin to build a profile or not what the model predicts:")
        d.ul([f"{x.source}: {x.why}" for x in v.left_out])
