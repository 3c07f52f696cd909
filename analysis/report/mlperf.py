"""The report's section on MLPerf Storage's checkpoint workload (configs/mlperf.yaml): what ran,
how it was scaled, whether each engine ran in MLPerf's order, and MLPerf's metrics both ways
beside ckptbench's own (analysis.mlperf)."""

from __future__ import annotations

from analysis import mlperf
from analysis.report.doc import Doc
from analysis.runs import Run


def _gib(n: float) -> str:
    return f"{n / (1 << 30):,.2f} GiB"


def mlperf_section(d: Doc, run: Run) -> None:
    """MLPerf's metrics of each engine, and what they stand on."""
    m = run.env.get("mlperf", {})
    lay = m.get("layout", {})
    d.h(2, "MLPerf Storage checkpointing")
    ranks = m.get("host_ranks", [])
    d.p(
        f"MLPerf Storage v2.0's {m.get('preset', '?')} checkpoint: TP x PP x DP = "
        f"{lay.get('tp')} x {lay.get('pp')} x {lay.get('dp')} ({m.get('world')} ranks), ZeRO "
        f"{lay.get('zero')}; {_gib(m.get('total_bytes', 0))} in all by DLIO's arithmetic (the "
        f"rules publish {m.get('published', '?')}"
        + (f"; {m['published_note']}" if m.get("published_note") else "")
        + "). This host ran MLPerf's "
        f"{m.get('mode', '?')} mode: ranks {ranks[0] if ranks else '?'}-"
        f"{ranks[-1] if ranks else '?'} of the layout, {_gib(m.get('host_bytes_full', 0))} a "
        "checkpoint at full size, each rank one file of its fp16 model states and one of its "
        "fp32 optimizer states under dlio-style (its own layout under the other engines). "
        f"Source: {m.get('source', '?')}."
    )
    if m.get("scaled"):
        d.warn(
            f"Scaled: every rank's bytes x {m.get('scale'):g} ({m.get('scale_note', '')}): "
            f"{_gib(m.get('host_bytes_run', 0))} a checkpoint instead of "
            f"{_gib(m.get('host_bytes_full', 0))}. These are not MLPerf results: a submission "
            "writes the full size, and small files favour caches and per-file costs differently."
        )
    if run.emulated:
        d.warn("host-emulated device: no GPU took part; no figure here is a real GDS figure.")
    engines = list(m.get("order", {}))
    good = [e for e in engines if mlperf.order_ok(run.env, e)]
    bad = [e for e in engines if e not in good]
    d.p(
        f"Order, as MLPerf's rules require: each engine wrote its {m.get('checkpoints', '?')} "
        "checkpoints (each rank after a barrier), the page cache was cleared (dropped where the "
        "run may; each checkpoint's pages also evicted and checked gone before its read), then "
        "it read them back in turn. In that order: "
        + (", ".join(good) or "none")
        + (f"; not in that order: {', '.join(bad)}" if bad else "")
        + "."
    )
    t = mlperf.table(run.rows)
    if t.empty:
        d.p("No successful checkpoint to report.")
        return
    d.table(*mlperf.rows_of(t))
    d.p(
        "GiB/s = the host's bytes of a checkpoint / 1024^3 / its duration, the mean over the "
        "checkpoints, as DLIO computes it (it prints GB). 'slowest rank': the duration as MLPerf's "
        "rules define it, the maximum over the ranks; the read is the restore, from storage. "
        "'DLIO: rank 0': the same bytes over rank 0's own duration, as DLIO v2.0 computes its "
        "summary; durable for every engine here. 'DLIO v2.0 as run': rank 0's torch.save "
        "without fsync (dlio-style's stall), what DLIO v2.0 times and reports, NOT durable: "
        + m.get("dlio_fsync", "")
        + " 'x DLIO-style': an engine's slowest-rank throughput over dlio-style's (durable). "
        "stall s, durable s, restore s: ckptbench's own, the slowest rank's median: how long "
        "training is held, until the checkpoint is durable, and the restore. 'device': what "
        "the targets' block devices counted (bench.measure.witness): 'durable', whether every "
        "rank's bytes and a cache flush reached them by the time ckptbench timed it durable; "
        "'DLIO v2.0 as run', the same at the moment DLIO v2.0 stops its clock (dlio-style's "
        "return). The ranks share the host's devices, so in one rank's interval the others' "
        "writes and flushes count too: a 'no' is conclusive, a 'yes' only necessary. A write "
        "whose device said no is left out of the GiB/s."
    )
