"""Before an MLPerf Storage run launches its ranks (bench.run.launch): whether this host holds
its share. Every rank of the host is judged as the sweep's preflight judges it (its shard, every
engine's staging, save and restore against its part of the host's memory, bench.run.preflight),
and the first target must hold all the checkpoints of one engine at once (MLPerf writes them
all before it reads one). What does not fit is refused in one line, with the largest
`mlperf.scale` that would, before any process starts."""

from __future__ import annotations

import shutil

from bench.common import sizes
from bench.common.errors import UserError
from bench.config import sweep as config_mod
from bench.run import plan, preflight
from bench.workloads import mlperf as mlperf_mod


def host_check(cfg: config_mod.Config, host_avail: int | None = None) -> None:
    """Refuse (UserError) an MLPerf run whose host share does not fit here."""
    m = cfg.mlperf
    assert m is not None
    wl = plan.workloads(cfg)[0]
    ranks = mlperf_mod.host_ranks(mlperf_mod.model(m.preset), m.host_procs)
    have = preflight.host_available() if host_avail is None else host_avail
    avail = have // len(ranks) - preflight.HEADROOM
    options = plan.resolved_engine_options(cfg, cfg.engines)
    for r in ranks:
        size = wl.size(cfg, False, 1, rank=r)
        verdicts = preflight.judge(
            f"{wl.id} rank {r}", cfg.engines, size, options, avail, None, None, cfg.restore
        )
        refused = [v for v in verdicts if v.restore is None]
        if len(refused) == len(verdicts) or (refused and cfg.on_error == "stop"):
            need = min(  # what the least demanding engine would need alone, unbounded
                v.host_need
                for e in cfg.engines
                for how in ("fresh", "in-place")
                for v in preflight.judge(wl.id, [e], size, options, 1 << 62, None, None, how)
                if v.restore is not None
            )
            fit = m.scale * max(avail, 0) / need if need else m.scale
            raise UserError(
                f"mlperf: {m.preset} at scale {m.scale:g} does not fit this host: rank {r} of "
                f"{len(ranks)} holds {sizes.format_size(size.nbytes)} and needs "
                f"{sizes.format_size(need)} at least, {sizes.format_size(max(avail, 0))} is its "
                f"share of host memory; way out: --set mlperf.scale={_below(fit)} or smaller"
            )
    target = cfg.resolved_targets()[0]
    need = wl.total_bytes * cfg.repetitions * 105 // 100
    free = _free(target)
    if free is not None and free < need:
        fit = m.scale * free / need
        raise UserError(
            f"mlperf: {m.preset} at scale {m.scale:g}: {cfg.repetitions} checkpoints of "
            f"{sizes.format_size(wl.total_bytes)} need {sizes.format_size(need)} on {target}, "
            f"{sizes.format_size(free)} is free; way out: --set mlperf.scale={_below(fit)}"
        )


def _free(target: str) -> int | None:
    """Free bytes where the target is, or will be (its nearest existing parent)."""
    import os

    path = os.path.abspath(target)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent
    return shutil.disk_usage(path).free


def _below(x: float) -> str:
    """A power of two at or below x (a scale to give), as 1/N."""
    n = 1
    while n < 1 << 30 and 1 / n > x:
        n *= 2
    return "1" if n == 1 else f"{1 / n:g}"
