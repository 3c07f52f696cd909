"""How often to checkpoint through each engine (Young's optimum refined by Daly, with the
engine's stall as the cost of a checkpoint) and the fraction of training time it loses.
Imports analysis.model.profiles and predict.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from analysis.model.predict import ENGINES, predict
from analysis.model.profiles import Profile
from bench.common.errors import UserError
from bench.common.traits import BUILTIN, Traits


@dataclass(frozen=True)
class Plan:
    """How often to checkpoint through one engine, and what it costs (seconds, fractions)."""

    engine: str
    interval_s: float  # compute time between checkpoints
    lost_fraction: float  # expected fraction of wall time lost to stalls and rework
    stall_s: float
    durable_s: float
    host_bytes: float
    limited_by_persist: bool  # the optimum was shorter than the time to persist
    # The restart's read of the checkpoint (part of the restart cost, beside restart_s): the
    # path's measured restore where the run has one, else the model's; 0 where neither is known.
    restore_s: float = 0.0
    restore_from: str = "unknown"  # "measured", "model" or "unknown"


def plan(
    p: Profile,
    mtbf_s: float,
    restart_s: float = 0.0,
    g: int | None = None,
    traits: dict[str, Traits] | None = None,
    restores: Mapping[str, float] | None = None,
) -> list[Plan]:
    """The checkpoint interval that minimises lost time per engine, with the engine's stall as
    the checkpoint cost delta and failures every `mtbf_s` on average (Daly's higher-order
    estimate of Young's optimum, see analysis/README.md):

        tau = sqrt(2 delta M) (1 + sqrt(delta / 2M) / 3 + delta / 18M) - delta   (delta < 2M)
        tau = M                                                                   (else)

    A path that persists in the background never checkpoints faster than it persists
    (tau >= durable - stall), and a failure loses the work since the last *durable*
    checkpoint. Expected lost fraction, first order:

        f = delta / (tau + delta) + (tau / 2 + (durable - stall) + restart) / M
    """
    if not mtbf_s > 0:
        raise UserError(f"model: --mtbf must be positive, got {mtbf_s / 3600:g} hours")
    out = []
    for e in traits or {k: BUILTIN[k] for k in ENGINES}:
        t = (traits or {}).get(e)
        pr = predict(p, e, traits=t, g=g)
        delta, lag, m = pr.stall_s, pr.durable_s - pr.stall_s, mtbf_s
        if delta < 2 * m:
            x = delta / (2 * m)
            tau = math.sqrt(2 * delta * m) * (1 + math.sqrt(x) / 3 + x / 9) - delta
        else:
            tau = m
        limited = tau < lag
        tau = max(tau, lag, 1e-9)
        if restores is not None and e in restores:
            back, where = restores[e], "measured"
        elif math.isfinite(pr.restore_s):
            back, where = pr.restore_s, "model"
        else:
            back, where = 0.0, "unknown"
        f = delta / (tau + delta) + (tau / 2 + lag + restart_s + back) / m
        out.append(
            Plan(e, tau, min(f, 1.0), delta, pr.durable_s, pr.host_bytes, limited, back, where)
        )
    return out


def measured_restores(run: Any, size: float | None = None) -> dict[str, float]:
    """Each engine's median restore_s in a run (analysis.runs.Run) over its rows of the
    checkpoint of `size` bytes (default: the largest, the size `from_run` predicts) at the
    fewest targets it ran at: what a restart of that checkpoint took through each path."""
    ok = run.ok
    if ok.empty or "restore_s" not in ok:
        return {}
    size = float(ok["total_bytes"].max()) if size is None else size
    rows = ok[(ok["total_bytes"] == size) & ok["restore_s"].notna() & (ok["restore_s"] > 0)]
    out = {}
    for e, g in rows.groupby("engine", sort=False):
        fewest = g[g["n_targets"] == g["n_targets"].min()]
        out[str(e)] = float(np.median(fewest["restore_s"]))
    return out
