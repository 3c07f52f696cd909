"""The report's section on MLPerf Storage's checkpoint workload (configs/mlperf.yaml): the fastest
durable write in a sentence, how it was scaled, MLPerf's metrics both ways beside ckptbench's own
(analysis.mlperf), what ran and whether each engine ran in MLPerf's order."""

from __future__ import annotations

from typing import Any

import pandas as pd

from analysis import mlperf
from analysis.report.doc import Doc
from analysis.runs import Run


def _gib(n: float) -> str:
    return f"{n / (1 << 30):,.2f} GiB"


def headline(t: pd.DataFrame) -> str:
    """MLPerf's answer in one sentence: the fastest durable write, the slowest rank's, and
    against dlio-style."""
    got = t[t["write_GiBps"].notna()] if not t.empty else t
    if got.empty:
        return "0 engines wrote a checkpoint the device witnessed as durable."
    r = got.nlargest(1, "write_GiBps").iloc[0]
    x = r["x_dlio_write"]
    return (
        f"The fastest durable write of MLPerf's checkpoint is by {r['engine']}, "
        f"{r['write_GiBps']:.3f} GiB/s (slowest rank)"
        + (f", {x:.2f}x dlio-style" if pd.notna(x) and r["engine"] != mlperf.DLIO else "")
        + "."
    )


def mlperf_section(d: Doc, run: Run) -> None:
    """The answer, its caveats, MLPerf's metrics of each engine, and what they stand on."""
    m = run.env.get("mlperf", {})
    lay = m.get("layout", {})
    t = mlperf.table(run.rows)
    d.h(2, "MLPerf Storage checkpointing")
    d.p(headline(t))
    if m.get("scaled"):
        d.warn(
            f"Scaled: every rank's bytes x {m.get('scale'):g} ({m.get('scale_note', '')}): "
            f"{_gib(m.get('host_bytes_run', 0))} a checkpoint instead of "
            f"{_gib(m.get('host_bytes_full', 0))}. These are not MLPerf results: a submission "
            "writes the full size, and small files favour caches and per-file costs differently."
        )
    if run.emulated:
        d.warn("host-emulated device: no GPU took part; no figure here is a real GDS figure.")
    if not t.empty:
        d.table(*mlperf.rows_of(t))
    ranks = m.get("host_ranks", [])
    n_hosts = int(m.get("hosts", 1))
    who = f"These {n_hosts} hosts" if n_hosts > 1 else "This host"
    d.p(
        f"MLPerf Storage v2.0's {m.get('preset', '?')} checkpoint: TP x PP x DP = "
        f"{lay.get('tp')} x {lay.get('pp')} x {lay.get('dp')} ({m.get('world')} ranks), ZeRO "
        f"{lay.get('zero')}; {_gib(m.get('total_bytes', 0))} in all by DLIO's arithmetic (the "
        f"rules publish {m.get('published', '?')}"
        + (f"; {m['published_note']}" if m.get("published_note") else "")
        + f"). {who} ran MLPerf's "
        f"{m.get('mode', '?')} mode: ranks {ranks[0] if ranks else '?'}-"
        f"{ranks[-1] if ranks else '?'} of the layout, {_gib(m.get('host_bytes_full', 0))} a "
        "checkpoint at full size, each rank one file of its fp16 model states and one of its "
        "fp32 optimizer states under dlio-style (its own layout under the other engines). "
        f"Source: {m.get('source', '?')}."
    )
    if n_hosts > 1:
        across(d, run, m)
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
    if t.empty:
        d.p("No successful checkpoint to report.")
        return
    d.p(
        "'DLIO v2.0 as run' is what DLIO v2.0 times and reports, NOT durable: "
        + m.get("dlio_fsync", "")
        + " A write whose device said no is left out of the GiB/s; the Glossary has each "
        "column."
    )


def across(d: Doc, run: Run, m: dict[str, Any]) -> None:
    """Across hosts: how the metrics above span them, and each host's share (analysis.mlperf
    `hosts`)."""
    shares = "; ".join(
        f"host {h}: ranks {b['ranks'][0]}-{b['ranks'][-1]}"
        for h, b in sorted(m.get("by_host", {}).items(), key=lambda kv: int(kv[0]))
        if b.get("ranks")
    )
    d.p(
        f"Across {m.get('hosts')} hosts, {m.get('host_procs')} ranks each, laid out as DLIO "
        f"lays them out ({shares}: consecutive ranks a host, host 0 first, as mpirun places "
        "them by slot): each checkpoint's bytes are every host's ranks', its duration the "
        "slowest rank on any host, to durability (the rules' maximum across all GPUs; their "
        "throughput, the minimum across all GPUs, is the bytes over it); DLIO's own figure "
        "divides the same bytes by rank 0's duration, on host 0. Each host's share, and how "
        "often its slowest rank set the job's duration:"
    )
    h = mlperf.hosts(run.rows)
    if h.empty:
        d.p("No successful checkpoint on more than one host to show.")
        return
    d.table(*mlperf.host_rows_of(h))
