"""How often to checkpoint through each engine (Young's optimum refined by Daly, with the
engine's stall as the cost of a checkpoint) and the fraction of training time it loses.
Imports analysis.model.profiles and predict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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


def plan(
    p: Profile,
    mtbf_s: float,
    restart_s: float = 0.0,
    g: int | None = None,
    traits: dict[str, Traits] | None = None,
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
        f = delta / (tau + delta) + (tau / 2 + lag + restart_s) / m
        out.append(Plan(e, tau, min(f, 1.0), delta, pr.durable_s, pr.host_bytes, limited))
    return out
