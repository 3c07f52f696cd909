"""A training-loop run (`ckptbench train`) as analysis sees it: training_steps.csv,
training_checkpoints.csv and env.json, and the per-engine summary.

Step-time inflation is what training really feels. Two estimates, per checkpoint:
- against `none`: (sum of the engine's step times) - (sum of `none`'s over the same steps);
- against the engine's own quiet steps (neither a checkpoint step nor run beside a persist):
  sum over the checkpoint steps and the steps beside the persist of (step_s - median quiet
  step_s). Both come from the same loop, so it does not see the drift of the machine's speed
  between the engines' runs that the first one adds (on a shared machine it can exceed the
  effect). It splits into the step with the save() call (`save_step_s`) and the contention the
  background persist causes in the steps beside it (`contention_s`: GIL, memory bandwidth, the
  writer threads' CPU time).
Reads results files only.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import pandas as pd

from analysis.runs import label, mode_tag, order_engines, read_env
from analysis.stats import fmt
from bench.common.errors import UserError
from bench.measure import columns, results

STEPS_CSV, CKPTS_CSV = results.STEPS_CSV, results.CKPTS_CSV
NONE = "none"


def present(path: str) -> bool:
    """Whether `path` holds a training-loop run."""
    return os.path.isfile(os.path.join(path, STEPS_CSV))


@dataclass(frozen=True)
class TrainingRun:
    """One training-loop run: every timed step, every save (warm-ups flagged), the environment."""

    path: str
    run_id: str
    steps: pd.DataFrame
    ckpts: pd.DataFrame
    env: dict[str, Any]

    @property
    def timed_ckpts(self) -> pd.DataFrame:
        """Timed saves that succeeded."""
        c = self.ckpts
        return c[~c["warmup"] & (c["error"] == "")]

    @property
    def errors(self) -> pd.DataFrame:
        return self.ckpts[self.ckpts["error"] != ""]

    @property
    def emulated(self) -> bool:
        return bool(self.steps["emulated"].any()) or bool(
            self.env.get("device", {}).get("emulated")
        )

    @property
    def engines(self) -> list[str]:
        """`none` first, then the house order."""
        names = list(self.steps["engine"].unique())
        return ([NONE] if NONE in names else []) + order_engines(n for n in names if n != NONE)

    def label(self, engine: str) -> str:
        """'gds [emulated]', 'cpu-single [emulated]', 'none [emulated]', 'cpu-single' on a GPU."""
        rows = self.ckpts[self.ckpts["engine"] == engine]
        if rows.empty:
            rows = self.steps[self.steps["engine"] == engine]
        tags = {mode_tag(r) for _, r in rows.iterrows()} - {""}
        return label(engine, "/".join(sorted(tags)))


def _read(path: str, kind: type) -> pd.DataFrame:
    """A training file typed by its row type (bench.measure.results)."""
    try:
        return results.read_csv(path, kind)
    except results.MissingColumns as e:
        raise UserError(f"{path}: {e}") from None
    except (ValueError, OSError) as e:
        raise UserError(f"{path}: cannot read ({e})") from None


def load(path: str) -> TrainingRun:
    """Read a training-loop run directory; a missing or malformed one is a UserError."""
    sp, cp = os.path.join(path, STEPS_CSV), os.path.join(path, CKPTS_CSV)
    if not os.path.isfile(sp):
        raise UserError(f"{path}: no {STEPS_CSV} here; is this a `ckptbench train` run?")
    steps = _read(sp, results.StepRow)
    if steps.empty:
        raise UserError(f"{sp}: no rows")
    if os.path.isfile(cp):
        ckpts = _read(cp, results.CheckpointRow)
    else:
        ckpts = columns.frame(pd.DataFrame(columns=["engine"]), results.CheckpointRow)
    env = read_env(path)
    run_id = str(steps["run_id"].iloc[0]) if "run_id" in steps else os.path.basename(path)
    return TrainingRun(os.path.abspath(path), run_id, steps, ckpts, env)


def summary(tr: TrainingRun) -> pd.DataFrame:
    """Per engine: step times, the inflation per checkpoint (both estimates, see the module) and
    its parts, and what the engine reported (stall_s, total_s)."""
    base = tr.steps[tr.steps["engine"] == NONE]["step_s"].to_numpy()
    rows = []
    for e in tr.engines:
        st = tr.steps[tr.steps["engine"] == e].sort_values("step")
        ck = tr.timed_ckpts[tr.timed_ckpts["engine"] == e]
        n_ck = int(st["checkpoint"].sum())
        persist = st[st["during_persist"] & ~st["checkpoint"]]["step_s"]
        quiet = st[~st["during_persist"] & ~st["checkpoint"]]["step_s"]
        q = float(quiet.median()) if len(quiet) else math.nan
        n = min(len(st), len(base))
        vs_none = save_step = contention = math.nan
        if e != NONE and n_ck:
            if len(base):
                vs_none = (st["step_s"].iloc[:n].sum() - base[:n].sum()) / n_ck
            save_step = float((st.loc[st["checkpoint"], "step_s"] - q).sum()) / n_ck
            contention = float((persist - q).sum()) / n_ck
        rows.append(
            {
                "engine": e,
                "label": tr.label(e),
                "steps": len(st),
                "checkpoints": n_ck,
                "step_s": float(st["step_s"].median()),
                "quiet_step_s": q,
                "step_persist_s": float(persist.median()) if len(persist) else math.nan,
                "persist_steps": len(persist),
                "inflation_vs_none_s": vs_none,
                "inflation_s": save_step + contention,
                "save_step_s": save_step,
                "contention_s": contention,
                "save_call_s": float(ck["save_call_s"].median()) if len(ck) else math.nan,
                "stall_s": float(ck["stall_s"].median()) if len(ck) else math.nan,
                "persist_s": float(ck["persist_s"].median()) if len(ck) else math.nan,
                "total_s": float(ck["total_s"].median()) if len(ck) else math.nan,
                "bytes": int(ck["bytes"].median()) if len(ck) else 0,
                "overlap_steps": float(ck["overlap_steps"].median()) if len(ck) else math.nan,
            }
        )
    return pd.DataFrame(rows)


def summary_rows(table: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Headers and formatted rows for the terminal and report.md."""
    headers = [
        "engine",
        "ckpts",
        "step s (median)",
        "step s during persist",
        "inflation s / ckpt vs none",
        "vs quiet steps",
        "of it contention",
        "stall_s (median)",
        "durable s (median)",
    ]
    rows = []
    for _, r in table.iterrows():
        rows.append(
            [
                r["label"],
                str(int(r["checkpoints"])),
                fmt(r["step_s"]),
                fmt(r["step_persist_s"]),
                fmt(r["inflation_vs_none_s"]),
                fmt(r["inflation_s"]),
                fmt(r["contention_s"]),
                fmt(r["stall_s"]),
                fmt(r["total_s"]),
            ]
        )
    return headers, rows


def drift_notes(table: pd.DataFrame, threshold: float = 0.05) -> list[str]:
    """Engines whose quiet steps ran more than `threshold` faster or slower than none's: their
    estimate against none carries that drift (the machine's speed changed between runs)."""
    base = table.loc[table["engine"] == NONE, "quiet_step_s"]
    if base.empty or not math.isfinite(float(base.iloc[0])):
        return []
    b = float(base.iloc[0])
    out = []
    for _, r in table[table["engine"] != NONE].iterrows():
        q = r["quiet_step_s"]
        if math.isfinite(q) and abs(q - b) > threshold * b and r["checkpoints"]:
            drift = (q - b) * r["steps"] / r["checkpoints"]
            out.append(
                f"the quiet steps of {r['label']} ran {abs(q / b - 1):.0%} "
                f"{'slower' if q > b else 'faster'} than none's ({fmt(q)} s vs "
                f"{fmt(b)} s): its inflation against none carries about {fmt(drift)} s "
                "per checkpoint of that drift"
            )
    return out


def notes(tr: TrainingRun) -> list[str]:
    """What must be said beside the numbers."""
    out = []
    if tr.emulated:
        out.append(
            "HOST-EMULATED run (no GPU): the model trains in host memory; gds is an "
            "O_DIRECT emulation, NOT GPUDirect Storage."
        )
    if NONE not in tr.engines:
        out.append("no `none` engine in this run: no baseline, so no inflation or contention.")
    for e in tr.engines:
        st = tr.steps[tr.steps["engine"] == e]
        if e != NONE and st["checkpoint"].any() and (st["checkpoint"] | st["during_persist"]).all():
            out.append(
                f"{e}: every step saved or ran beside a persist: no quiet steps to "
                "measure its inflation against (raise checkpoint_every)"
            )
    for _, r in tr.errors.iterrows():
        out.append(f"{r['engine']}: {r['error']}")
    bad = tr.ckpts[(tr.ckpts.get("verified", pd.Series(dtype=object)).astype(str) == "False")]
    for _, r in bad.iterrows():
        out.append(f"{r['engine']}: the checkpoint of step {r['step']} did not verify")
    return out
