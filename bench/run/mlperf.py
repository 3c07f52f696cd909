"""Before an MLPerf Storage run saves: whether each host holds its share, and whether the job
is the one the config asks for. Every rank of a host is judged as the sweep's preflight judges
any state (its shard, every engine's staging, save and restore against its part of the host's
memory, bench.run.preflight), and the host's first target must hold all its ranks' checkpoints
of one engine at once (MLPerf writes them all before it reads one). What does not fit is
refused in one line, with the largest `mlperf.scale` that would: by `ckptbench run` before any
process starts on one host, and on every host by its first rank before the run directory is
opened (bench.run.decide)."""

from __future__ import annotations

import shutil
from typing import Any

from bench.common import sizes
from bench.common.errors import UserError
from bench.config import sweep as config_mod
from bench.run import plan, preflight
from bench.workloads import mlperf as mlperf_mod


def host_check(cfg: config_mod.Config, host_avail: int | None = None, host: int = 0) -> None:
    """Refuse (UserError) an MLPerf run whose share of host `host` (its node rank) does not fit
    here."""
    m = cfg.mlperf
    assert m is not None
    wl = plan.workloads(cfg)[0]
    model = mlperf_mod.model(m.preset)
    ranks = mlperf_mod.host_ranks(model, m.host_procs, host)
    n_job = len(mlperf_mod.job_ranks(model, m.host_procs, m.hosts))
    here = f"host {host} of {m.hosts}" if m.hosts > 1 else "this host"
    have = preflight.host_available() if host_avail is None else host_avail
    avail = have // max(len(ranks), 1) - preflight.HEADROOM
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
                for how in ("fresh", "restart")
                for v in preflight.judge(wl.id, [e], size, options, 1 << 62, None, None, how)
                if v.restore is not None
            )
            fit = m.scale * max(avail, 0) / need if need else m.scale
            raise UserError(
                f"mlperf: {m.preset} at scale {m.scale:g} does not fit {here}: rank {r} of "
                f"{n_job} holds {sizes.format_size(size.nbytes)} and needs "
                f"{sizes.format_size(need)} at least, {sizes.format_size(max(avail, 0))} is its "
                f"share of host memory; way out: --set mlperf.scale={_below(fit)} or smaller"
            )
    target = cfg.resolved_targets()[0]
    share = sum(wl.size(cfg, False, 1, rank=r).nbytes for r in ranks)
    need = share * cfg.repetitions * 105 // 100
    free = _free(target)
    if free is not None and free < need:
        fit = m.scale * free / need
        raise UserError(
            f"mlperf: {m.preset} at scale {m.scale:g}: {cfg.repetitions} checkpoints of "
            f"{sizes.format_size(share)} (the share of {here}) need {sizes.format_size(need)} "
            f"on {target}, {sizes.format_size(free)} is free; way out: --set "
            f"mlperf.scale={_below(fit)}"
        )


def check_job(cfg: config_mod.Config, table: list[dict[str, Any]]) -> None:
    """Refuse (UserError) a torchrun job that is not the config's: `mlperf.hosts` nodes of
    `host_procs` ranks each, node h running ranks h x host_procs onwards (as DLIO lays them out
    across hosts, bench.workloads.mlperf [M])."""
    m = cfg.mlperf
    assert m is not None
    model = mlperf_mod.model(m.preset)
    got: dict[int, list[int]] = {}
    for t in table:
        got.setdefault(t["node_rank"], []).append(t["rank"])
    want = {h: mlperf_mod.host_ranks(model, m.host_procs, h) for h in range(m.hosts)}
    if {h: sorted(r) for h, r in got.items()} == want:
        return
    per = sorted({len(r) for r in got.values()})
    raise UserError(
        f"mlperf.hosts: {m.preset} runs on {m.hosts} host(s) of "
        f"{len(want[0])} ranks, this job has {len(table)} rank(s) on {len(got)} host(s) "
        f"({' or '.join(map(str, per))} a host); start one torchrun agent a host with "
        f"--nnodes {m.hosts} --nproc-per-node {len(want[0])}"
    )


def mlperf_block(cfg: config_mod.Config) -> dict[str, Any]:
    """env.json `mlperf`: the preset, its layout, the ranks of the job and of each host, the
    bytes of each rank at full size and as run (`host_bytes_*`: every host's, the checkpoint),
    how it was scaled, and what DLIO v2.0 does with its fsync setting."""
    m = cfg.mlperf
    assert m is not None
    model = mlperf_mod.model(m.preset)
    ranks = mlperf_mod.job_ranks(model, m.host_procs, m.hosts)
    full = {str(r): mlperf_mod.rank_shard(model, r) for r in ranks}
    run = {str(r): mlperf_mod.shard_at(m.preset, r, m.scale) for r in ranks}
    hosts = {
        str(h): {
            "ranks": (mine := mlperf_mod.host_ranks(model, m.host_procs, h)),
            "bytes_full": sum(full[str(r)].nbytes for r in mine),
            "bytes_run": sum(run[str(r)].nbytes for r in mine),
        }
        for h in range(m.hosts)
    }
    return {
        "preset": m.preset,
        "source": "mlcommons/storage v2.0-branch 0bfbd3aa configs/dlio/workload, "
        "Submission_guidelines.md 2.2 and mlpstorage/utils.py (ranks across hosts); "
        "argonne-lcf/dlio_benchmark mlperf_storage_v2.0 392621b2 "
        "dlio_benchmark/checkpointing/base_checkpointing.py and utils/utility.py",
        "layout": {"tp": model.tp, "pp": model.pp, "dp": model.dp, "zero": model.zero},
        "world": model.world,
        "host_procs": m.host_procs,
        "hosts": m.hosts,
        "host_ranks": ranks,  # every rank of the job (one host's in subset mode)
        "by_host": hosts,  # each host's ranks and its share of a checkpoint
        "mode": mlperf_mod.mode(model, len(ranks)),
        "total_bytes": mlperf_mod.total_bytes(model),
        "published": model.published,
        "published_note": mlperf_mod.NOTES.get(m.preset, ""),
        "host_bytes_full": sum(s.nbytes for s in full.values()),
        "scale": m.scale,
        "scaled": m.scale != 1,
        "scale_note": "every tensor of every rank holds `scale` of its elements (at least one)",
        "host_bytes_run": sum(s.nbytes for s in run.values()),
        "rank_bytes_full": {r: s.nbytes for r, s in full.items()},
        "rank_bytes_run": {r: s.nbytes for r, s in run.items()},
        "checkpoints": cfg.repetitions,
        "dlio_fsync": "DLIO v2.0 stores the config's checkpoint.fsync as checkpoint_sync "
        "(dlio_benchmark/utils/config.py line 879) and saves with checkpoint_fsync "
        "(line 110, default False; base_checkpointing.py lines 393-415): the writes it times "
        "are not durable. dlio-style's stall_s is that interval, its total_s the durable one.",
    }


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
