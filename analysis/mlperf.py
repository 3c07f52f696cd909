"""MLPerf Storage's checkpoint metrics from the rows of an MLPerf run (configs/mlperf.yaml,
bench.workloads.mlperf for the sources). Reads results files only.

For each engine and checkpoint, from the per-rank rows (aggregate rows are left aside):
- the checkpoint's bytes = every rank's bytes, on every host (DLIO's "Total checkpoint size",
  allreduced over all ranks, base_checkpointing.py lines 164-170);
- its duration as MLPerf's rules define it = the slowest rank's, on any host
  (Submission_guidelines.md lines 188-189: the maximum time across all GPUs; the throughput,
  the minimum across all GPUs, is the bytes over that), to durability for a write (total_s)
  and for a read restore_s;
- its duration as DLIO v2.0 computes it = rank 0's own (it stamps start and end on rank 0 with no
  barrier after the save: main.py lines 283-287, checkpoint_rank_sync default False,
  config.py line 114; statscounter.py lines 352-376, summary on rank 0, lines 146-168).
Throughput = bytes / duration in GiB/s (DLIO divides bytes by 1024^3 and prints "GB"), the mean
over the checkpoints of each checkpoint's throughput (statscounter.py lines 159-167).

Durable or not: every engine's write ends durable (total_s), except in DLIO v2.0 itself, whose
timed write is torch.save without fsync (bench.engines.dlio_style): for dlio-style the table also
gives that number, from rank 0's stall_s, and says it is not durable.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from analysis.runs import Run, order_engines

GiB = float(1 << 30)
DLIO = "dlio-style"


def present(run: Run) -> bool:
    """Whether this is an MLPerf run."""
    return "mlperf" in run.env and "rank" in run.rows


def _ok(rows: pd.DataFrame) -> pd.DataFrame:
    r = rows[~rows["aggregate"].astype(bool) & ~rows["warmup"].astype(bool)]
    return r[r["error"].fillna("").astype(str) == ""]


def checkpoints(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per engine and checkpoint: its bytes, and each duration of it (see the module)."""
    r = _ok(rows)
    out = []
    for (engine, rep), g in r.groupby(["engine", "rep"], sort=False):
        zero = g[g["rank"] == 0]
        if zero.empty:
            continue
        z = zero.iloc[0]
        out.append(
            {
                "engine": engine,
                "checkpoint": int(str(rep)),
                "ranks": len(g),
                "bytes": int(g["total_bytes"].sum()),
                "write_slowest_s": float(g["total_s"].max(skipna=False)),
                "write_rank0_s": float(z["total_s"]),
                "write_rank0_stall_s": float(z["stall_s"]),
                "stall_slowest_s": float(g["stall_s"].max()),
                "read_slowest_s": float(g["restore_s"].max(skipna=False)),
                "read_rank0_s": float(z["restore_s"]),
                "witness": _all_ranks(g, "durable_witness"),
                "witness_as_run": str(z.get("return_witness", "") or ""),
            }
        )
    return pd.DataFrame(out)


def _all_ranks(g: pd.DataFrame, column: str) -> str:
    """One checkpoint's witness over its ranks: `yes` when every rank's is, else the first
    other verdict (rows before the witness: empty)."""
    if column not in g:
        return ""
    said = [str(x) for x in g[column].fillna("")]
    return next((x for x in said if x != "yes"), "yes") if any(said) else ""


def said(verdicts: pd.Series) -> str:
    """The device's word on an engine's checkpoints: 'yes 10/10', or the first other verdict
    with how many said it; '-' for rows written before the witness."""
    v = [str(x) for x in verdicts if str(x)]
    if not v:
        return "-"
    other = [x for x in v if x != "yes"]
    if not other:
        return f"yes {len(v)}/{len(v)}"
    first = other[0]
    kind = first.split(":", 1)[0]
    return f"{kind} {sum(x.startswith(kind) for x in v)}/{len(v)}: {first.split(': ', 1)[-1]}"


def table(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per engine: MLPerf's write and read throughput both ways (GiB/s, the mean over
    its checkpoints), its durations, ckptbench's stall, durability and restore (medians of the
    slowest rank), and the multiple of dlio-style's throughput."""
    c = checkpoints(rows)
    if c.empty:
        return pd.DataFrame()

    def rate(col: str) -> pd.Series:
        return c["bytes"] / GiB / c[col]

    c = c.assign(
        write_rules=rate("write_slowest_s"),
        write_dlio=rate("write_rank0_s"),
        write_dlio_as_run=rate("write_rank0_stall_s"),
        read_rules=rate("read_slowest_s"),
        read_dlio=rate("read_rank0_s"),
    )
    g = c.groupby("engine", sort=False)
    out = g.agg(
        checkpoints=("checkpoint", "size"),
        ranks=("ranks", "max"),
        bytes=("bytes", "median"),
        write_s=("write_slowest_s", "mean"),
        read_s=("read_slowest_s", "mean"),
        write_GiBps=("write_rules", "mean"),
        write_GiBps_rank0=("write_dlio", "mean"),
        write_GiBps_not_durable=("write_dlio_as_run", "mean"),
        read_GiBps=("read_rules", "mean"),
        read_GiBps_rank0=("read_dlio", "mean"),
        stall_s=("stall_slowest_s", "median"),
        durable_s=("write_slowest_s", "median"),
        restore_s=("read_slowest_s", "median"),
        witness=("witness", said),
        witness_as_run=("witness_as_run", said),
    )
    # the not-durable figure is DLIO's own timing: only dlio-style writes as it does
    out.loc[out.index != DLIO, "write_GiBps_not_durable"] = float("nan")
    out.loc[out.index != DLIO, "witness_as_run"] = "-"
    if DLIO in out.index:
        out["x_dlio_write"] = out["write_GiBps"] / out.loc[DLIO, "write_GiBps"]
        out["x_dlio_read"] = out["read_GiBps"] / out.loc[DLIO, "read_GiBps"]
    else:
        out["x_dlio_write"] = out["x_dlio_read"] = float("nan")
    return out.loc[order_engines(out.index)].reset_index()


def hosts(rows: pd.DataFrame) -> pd.DataFrame:
    """Across hosts: one row per engine and host (`node`, its node rank first): its ranks, its
    share of a checkpoint, the mean over checkpoints of its slowest rank's write (durable) and
    read, its share's GiB/s over those, and in how many checkpoints its slowest rank set the
    job's write duration (the rules' maximum across all GPUs). Empty with one host."""
    r = _ok(rows)
    if r.empty or r["node"].nunique() < 2:
        return pd.DataFrame()
    out = []
    for engine in order_engines(list(r["engine"].unique())):
        e = r[r["engine"] == engine]
        slowest = e.groupby("rep")["total_s"].max()
        for (node_rank, node), h in e.groupby(["node_rank", "node"]):
            by = h.groupby("rep")
            write, read = by["total_s"].max(), by["restore_s"].max()
            nbytes = by["total_bytes"].sum()
            out.append(
                {
                    "engine": engine,
                    "node_rank": int(str(node_rank)),
                    "host": str(node),
                    "ranks": f"{int(h['rank'].min())}-{int(h['rank'].max())}",
                    "checkpoints": len(by),
                    "share_GiB": float(nbytes.median()) / GiB,
                    "write_s": float(write.mean()),
                    "read_s": float(read.mean()),
                    "write_GiBps": float((nbytes / GiB / write).mean()),
                    "read_GiBps": float((nbytes / GiB / read).mean()),
                    "sets_write": int((write >= slowest.loc[write.index]).sum()),
                }
            )
    return pd.DataFrame(out)


def host_rows_of(t: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """The per-host table's headers and cells."""
    headers = [
        "engine",
        "host",
        "its ranks",
        "share GiB",
        "write s (its slowest rank)",
        "read s (its slowest rank)",
        "its share's write GiB/s",
        "its share's read GiB/s",
        "sets the job's write duration",
    ]
    cells = [
        [
            str(r.engine),
            str(r.host),
            str(r.ranks),
            _f(r.share_GiB),
            _f(r.write_s, "{:.4f}"),
            _f(r.read_s, "{:.4f}"),
            _f(r.write_GiBps),
            _f(r.read_GiBps),
            f"{r.sets_write}/{r.checkpoints}",
        ]
        for r in t.itertuples()
    ]
    return headers, cells


def _f(x: Any, fmt: str = "{:.3f}") -> str:
    return "-" if x is None or pd.isna(x) else fmt.format(x)


HEADERS = [
    "engine",
    "ckpts",
    "write GiB/s (slowest rank, durable)",
    "write GiB/s (DLIO: rank 0, durable)",
    "write GiB/s (DLIO v2.0 as run: rank 0, not durable)",
    "read GiB/s (slowest rank)",
    "read GiB/s (DLIO: rank 0)",
    "x DLIO-style write",
    "x DLIO-style read",
    "stall s",
    "durable s",
    "restore s",
    "device: durable",
    "device: DLIO v2.0 as run",
]


def rows_of(t: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """The table's headers and cells for the report and the terminal."""
    cells = [
        [
            str(r.engine),
            str(r.checkpoints),
            _f(r.write_GiBps),
            _f(r.write_GiBps_rank0),
            _f(r.write_GiBps_not_durable),
            _f(r.read_GiBps),
            _f(r.read_GiBps_rank0),
            _f(r.x_dlio_write, "{:.2f}"),
            _f(r.x_dlio_read, "{:.2f}"),
            _f(r.stall_s, "{:.4f}"),
            _f(r.durable_s, "{:.4f}"),
            _f(r.restore_s, "{:.4f}"),
            str(r.witness),
            str(r.witness_as_run),
        ]
        for r in t.itertuples()
    ]
    return HEADERS, cells


def order_ok(env: dict[str, Any], engine: str) -> bool:
    """Whether the engine ran in MLPerf's order: every write, then the cache cleared, then every
    read, each phase in checkpoint order (env.json `mlperf.order`, rank 0's record)."""
    ev = env.get("mlperf", {}).get("order", {}).get(engine, [])
    kinds = [e["event"] for e in ev]
    n = kinds.count("write")
    want = ["write"] * n + ["clear cache"] + ["read"] * n
    times = [e["t_ns"] for e in ev]
    steps = [e["checkpoint"] for e in ev if e["event"] != "clear cache"]
    return n > 0 and kinds == want and times == sorted(times) and steps == list(range(n)) * 2
