"""`ckptbench compare RUN_A RUN_B [...]`: runs side by side for the cases they share.

Each later run is compared with the first (A): medians, the ratio run / A of a metric with a 95%
percentile-bootstrap confidence interval (scipy) and a Mann-Whitney U p-value, and "not
significant" unless the interval excludes 1 and p < 0.05, i.e. when the difference may be noise.

Runs whose essential environment differs are refused (unless forced, and then the report says so
loudly): a different device kind, host-emulated against real, or an engine that ran in another
mode (gds against compat or emulated); across hosts, another number of hosts, or a host whose
GPU or ranks' device kind differs from the same host's in the other run. Other differences (host, kernel, packages, storage, engine
options, whose clock timed the stalls) are listed as warnings; different storage is what a device
comparison is for. Runs whose stalls the engines timed themselves (before ckptbench 0.2.0) are
named in one note.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from analysis import external, runs, stats
from analysis.figures.common import save
from analysis.figures.compare import compare_bandwidth
from analysis.report.doc import Doc
from analysis.runs import Run
from analysis.tables import text_table
from bench.common.errors import UserError

# metric -> (column, label, higher is better)
METRICS: dict[str, tuple[str, str, bool]] = {
    "write": ("write_GBps", "write GB/s (bytes / total_s)", True),
    "stall": ("stall_s", "stall s", False),
    "durable": ("total_s", "time to durability s", False),
    "restore": ("restore_GBps", "restore GB/s", True),
}
CASE_KEY = ["engine", "workload", "total_bytes", "tensor_bytes", "n_targets", "dtype"]


def _letter(i: int) -> str:
    return chr(65 + i)


def _device(run: Run) -> tuple[str, bool]:
    dev = run.env.get("device", {})
    kinds = sorted(set(run.rows["device"].astype(str)))
    return str(dev.get("kind") or "/".join(kinds)), bool(run.emulated)


def essential_differences(a: Run, b: Run, la: str = "A", lb: str = "B") -> list[str]:
    """Differences that make the comparison meaningless (refused unless forced)."""
    out = []
    (ka, ea), (kb, eb) = _device(a), _device(b)
    if ka != kb:
        out.append(f"device kind differs: {la} {ka}, {lb} {kb}")
    if ea != eb:
        out.append(
            f"{la} is {'emulated' if ea else 'real'}, {lb} is {'emulated' if eb else 'real'}"
        )
    ma, mb = a.gds_modes(), b.gds_modes()
    for e in runs.order_engines(set(ma) & set(mb)):
        if ma[e] != mb[e]:
            out.append(f"engine {e} ran in another mode: {la} {ma[e]}, {lb} {mb[e]}")
    ha, hb = _hosts(a), _hosts(b)
    if (len(ha) > 1 or len(hb) > 1) and len(ha) != len(hb):
        na, nb = max(1, len(ha)), max(1, len(hb))
        out.append(f"hosts differ: {la} ran on {na} host(s), {lb} on {nb}")
    elif len(ha) > 1:
        for n, (x, y) in enumerate(zip(ha, hb, strict=True)):
            for what, key in HOST_ESSENTIAL.items():
                if _at(x, key) != _at(y, key):
                    out.append(f"host {n}'s {what} differs: {la} {_at(x, key)}, {lb} {_at(y, key)}")
    return out


# What a host of a run across hosts must share with the same host of another run (env.json
# ranks.nodes[N]): the GPU its ranks ran on, and the kind of device of its ranks.
HOST_ESSENTIAL = {"GPU": "env.gpu.name", "device": "device"}
# What is said of a host that differs, without refusing.
HOST_OTHER = {
    "CPU": "env.cpu.model",
    "kernel": "env.kernel",
    "memory": "env.memory_bytes",
    "storage": "disks",
}


def _at(d: Mapping[str, Any], key: str) -> Any:
    for part in key.split("."):
        d = d.get(part) if isinstance(d, Mapping) else None  # type: ignore[assignment]
    return d


def _hosts(run: Run) -> list[dict[str, Any]]:
    """Each host of a run across hosts, in node order (env.json ranks.nodes), with the device
    kind of its ranks and its targets' disks; [] for a run on one host."""
    r = run.env.get("ranks", {})
    nodes = r.get("nodes", {})
    if len(nodes) < 2:
        return []
    out = []
    for n in sorted(nodes, key=int):
        b = nodes[n]
        kinds = {
            str(t.get("device", "")).split(":")[0]
            for t in r.get("table", [])
            if str(t.get("node_rank")) == n
        }
        disks = [
            f"{t.get('fstype', '?')} on {t.get('block', {}).get('disk') or t.get('source', '?')}"
            for t in b.get("storage", {}).get("targets", [])
        ]
        out.append({**b, "device": "/".join(sorted(kinds)), "disks": ", ".join(disks)})
    return out


def _options(run: Run) -> dict[str, set[str]]:
    """Engine -> the distinct option sets it ran with (JSON, keys sorted)."""
    out: dict[str, set[str]] = {}
    if "options" not in run.rows:
        return out
    for e, s in run.rows.groupby("engine")["options"]:
        vals = set()
        for v in s.dropna().astype(str):
            try:
                vals.add(json.dumps(json.loads(v), sort_keys=True))
            except ValueError:
                vals.add(v)
        out[str(e)] = vals
    return out


def _storage(run: Run) -> str:
    st = run.env.get("storage", {})
    disks = [
        f"{t.get('fstype', '?')} on {t.get('block', {}).get('disk') or t.get('source', '?')}"
        for t in st.get("targets", [])
    ]
    return ", ".join(dict.fromkeys(disks)) or "?"


def other_differences(a: Run, b: Run, la: str = "A", lb: str = "B") -> list[str]:
    """Differences worth a warning; they do not stop the comparison."""
    out = []

    def diff(name: str, va: Any, vb: Any) -> None:
        if va != vb:
            out.append(f"{name} differs: {la} {va}, {lb} {vb}")

    ea, eb = a.env, b.env
    diff("host", ea.get("host"), eb.get("host"))
    diff("CPU", ea.get("cpu", {}).get("model"), eb.get("cpu", {}).get("model"))
    diff("kernel", ea.get("kernel"), eb.get("kernel"))
    diff("memory", ea.get("memory_bytes"), eb.get("memory_bytes"))
    diff("GPU", ea.get("gpu", {}).get("name"), eb.get("gpu", {}).get("name"))
    pa, pb = ea.get("packages", {}), eb.get("packages", {})
    for k in sorted(set(pa) | set(pb)):
        if k != "ckptbench":
            diff(f"package {k}", pa.get(k), pb.get(k))
    oa, ob = _options(a), _options(b)
    for e in runs.order_engines(set(oa) & set(ob)):
        if oa[e] != ob[e]:
            out.append(f"engine {e} options differ: {la} {sorted(oa[e])}, {lb} {sorted(ob[e])}")
    sa, sb = _storage(a), _storage(b)
    if sa != sb:
        out.append(f"storage differs (what a device comparison is for): {la} {sa}, {lb} {sb}")
    if a.harness_clock != b.harness_clock:
        old, new = (la, lb) if b.harness_clock else (lb, la)
        out.append(
            f"stall clock differs: {old} predates ckptbench 0.2.0 (each engine timed its own "
            f"stall, which could read short), {new} was timed by the harness around save(): "
            "a stall ratio between them mixes the two clocks"
        )
    ha, hb = _hosts(a), _hosts(b)
    if len(ha) > 1 and len(ha) == len(hb):
        for n, (x, y) in enumerate(zip(ha, hb, strict=True)):
            for what, key in HOST_OTHER.items():
                diff(f"host {n}'s {what}", _at(x, key), _at(y, key))
    if a.shared_device or b.shared_device:
        out.append("a run's targets share one device: its SSD-count scaling is not real scaling")
    return out


@dataclass(frozen=True)
class Comparison:
    """The runs (A first), one row per shared case and later run, and what differs."""

    runs: list[Run]
    metric: str
    table: pd.DataFrame
    refusals: list[str]
    warnings: list[str]
    forced: bool
    notes: list[str] = field(default_factory=list)  # what must be said of single runs
    # other tools' results (analysis.external), each with its letter after the runs'
    others: list[tuple[str, external.External]] = field(default_factory=list)
    external_table: pd.DataFrame | None = None


def compare(run_dirs: list[str], metric: str = "write", force: bool = False) -> Comparison:
    """Compare each run with the first on the cases both have, and each other tool's result
    file (fio, gdsio, MLPerf Storage: analysis.external) with every case of the first."""
    if len(run_dirs) < 2:
        raise UserError("compare: give at least two run directories, or a run and a result file")
    if metric not in METRICS:
        raise UserError(f"--metric: unknown metric {metric!r} (known: {', '.join(METRICS)})")
    if not external.is_run_dir(run_dirs[0]) and os.path.isfile(run_dirs[0]):
        raise UserError(
            f"{run_dirs[0]}: compare's first argument is the ckptbench run the others are set "
            "against; give the result file after it"
        )
    rs = [runs.load(run_dirs[0])]
    loaded = []
    for d in run_dirs[1:]:
        if external.is_run_dir(d):
            rs.append(runs.load(d))
        else:
            loaded.append(external.load(d))
    others = [(_letter(len(rs) + j), e) for j, e in enumerate(loaded)]
    if others and metric not in external.DIRECTION:
        raise UserError(
            f"--metric {metric}: another tool's result ({others[0][1].path}) gives bandwidth "
            f"only; use --metric {' or '.join(external.DIRECTION)}"
        )
    a = rs[0]
    refusals, warns = [], []
    for i, b in enumerate(rs[1:], 1):
        refusals += essential_differences(a, b, "A", _letter(i))
        warns += other_differences(a, b, "A", _letter(i))
    for i, r in enumerate(rs):
        warns += [f"{_letter(i)}: {line}" for line in runs.witness_lines(r.rows)]
    for lb, e in others:
        refusals += external.refusals(a.emulated, lb, e)
        warns += external.warnings(metric, lb, e)
    if refusals and not force:
        raise UserError(
            "runs not comparable: " + "; ".join(refusals) + " (use --force to compare anyway)"
        )
    col, _, higher = METRICS[metric]
    rows = []
    ga = {k: g for k, g in a.ok.groupby(CASE_KEY, sort=False)}
    for i, b in enumerate(rs[1:], 1):
        for key, gb in b.ok.groupby(CASE_KEY, sort=False):
            if key not in ga:
                continue
            g = ga[key]
            va, vb = _values(g, col), _values(gb, col)
            if not len(va) or not len(vb):  # every row of a side denied by the device
                continue
            rec = dict(zip(CASE_KEY, key, strict=True))
            rec.update(run=_letter(i), mode_a=_mode(g), mode_b=_mode(gb))
            rec.update(_ratio(va, vb, higher, _letter(i)))
            rows.append(rec)
    if len(rs) > 1 and not rows:
        raise UserError("compare: the runs share no case (engine, workload, SSD count)")
    table = stats.ordered(pd.DataFrame(rows)).reset_index(drop=True) if rows else pd.DataFrame()
    ext_table = _external_table(a, others, metric) if others else None
    return Comparison(rs, metric, table, refusals, warns, force, clock_notes(rs), others, ext_table)


def _values(g: pd.DataFrame, col: str) -> np.ndarray:
    """A case's values of the metric, without the rows it has none for: a save the block
    device denied durable has no time to durability (analysis.runs.deny)."""
    return g[col].dropna().to_numpy()


def _ratio(a: np.ndarray, b: Any, higher: bool, lb: str) -> dict[str, Any]:
    """Medians, B/A with its interval and p, and the verdict, of one case."""
    r = stats.ratio_ci(a, b)
    if not np.isfinite(r.low):
        verdict = "n < 2: no interval"
    elif not r.significant:
        verdict = "not significant"
    elif (r.ratio > 1) == higher:
        verdict = f"{lb} better"
    else:
        verdict = f"{lb} worse"
    return dict(
        n_a=r.n_a,
        n_b=r.n_b,
        median_a=float(np.median(a)),
        median_b=float(np.median(b)),
        ratio=r.ratio,
        ci_low=r.low,
        ci_high=r.high,
        p_value=r.p_value,
        significant=r.significant,
        verdict=verdict,
    )


def _external_table(
    a: Run, others: list[tuple[str, external.External]], metric: str
) -> pd.DataFrame:
    """Every case of A against every point of the other tools in the metric's direction."""
    col, _, higher = METRICS[metric]
    rows = []
    for lb, e in others:
        for p in e.points:
            if p.direction != external.DIRECTION[metric]:
                continue
            for key, g in a.ok.groupby(CASE_KEY, sort=False):
                if not len(va := _values(g, col)):
                    continue
                rec: dict[str, Any] = dict(zip(CASE_KEY, key, strict=True))
                rec.update(run=lb, source=p.label, path=p.path, durable=p.durable)
                rec.update(mode_a=_mode(g), detail=p.detail)
                rec.update(_ratio(va, np.asarray(p.GBps), higher, lb))
                rows.append(rec)
    return pd.DataFrame(rows)


def clock_notes(rs: list[Run]) -> list[str]:
    """One line naming the runs timed by the engines' own clocks (analysis.runs.clock_note)."""
    old = [(_letter(i), r) for i, r in enumerate(rs) if not r.harness_clock]
    if not old:
        return []
    who = " and ".join(x for x, _ in old)
    if len(old) == 1:
        line = runs.clock_note(old[0][1].env, f"Run {who}")
    else:
        line = runs.clock_note({}, f"Runs {who}", plural=True)
    return [line] if line else []


def _mode(g: pd.DataFrame) -> str:
    return "/".join(sorted(set(g["tag"]) - {""})).upper() or "-"


def _numbers(r: Mapping[Any, Any]) -> list[str]:
    """A row's counts, medians, ratio and interval, then its verdict."""
    ci = "-" if not np.isfinite(r["ci_low"]) else f"{r['ci_low']:.3f}-{r['ci_high']:.3f}"
    return [str(r["n_a"]), str(r["n_b"]), stats.fmt(r["median_a"]), stats.fmt(r["median_b"]),
            f"{r['ratio']:.3f}", ci, r["verdict"]]  # fmt: skip


DURABLE = {True: "yes", False: "no", None: "unknown"}


def _too_few(table: pd.DataFrame) -> str:
    """A sentence for the cases with too few repetitions for any verdict: the smallest two-sided
    Mann-Whitney p of n and m samples is 2 / C(n+m, n) (0.1 at 3 a side, 0.029 at 4)."""
    low = [
        (int(a), int(b))
        for a, b in zip(table["n_a"], table["n_b"], strict=True)
        if 2 / math.comb(int(a) + int(b), int(a)) >= 0.05
    ]
    if not low:
        return ""
    a, b = min(low, key=sum)
    return (
        f" {len(low)} of {len(table)} cases have so few repetitions (as few as {a} and {b}) that "
        "p cannot fall below 0.05, so they are never called significant: run 5 or more."
    )


def table_rows(c: Comparison) -> tuple[list[str], list[list[str]]]:
    _, unit, _ = METRICS[c.metric]
    headers = [
        "run",
        "engine",
        "workload",
        "SSDs",
        "mode A",
        "mode",
        "n A",
        "n",
        f"A: {unit}",
        "run: same",
        "run / A",
        "95% CI",
        "p (Mann-Whitney)",
        "verdict",
    ]
    rows = [
        [r["run"], r["engine"], r["workload"], str(r["n_targets"]), r["mode_a"], r["mode_b"],
         *_numbers(r)[:-1], stats.fmt(r["p_value"], 2), r["verdict"]]
        for r in c.table.to_dict("records")
    ]  # fmt: skip
    return headers, rows


def _run_env(run: Run) -> dict[str, str]:
    e = run.env
    gpu = e.get("gpu", {})
    mem = e.get("memory_bytes")
    return {
        "tool": f"ckptbench {e.get('packages', {}).get('ckptbench', '?')}",
        "when": run.run_id[:16],
        "host": str(e.get("host", "?")),
        "CPU": str(e.get("cpu", {}).get("model", "?")),
        "cores": str(e.get("cpu", {}).get("logical_cores", "?")),
        "memory": f"{mem / 2**30:.0f} GiB" if mem else "?",
        "GPU": str(gpu.get("name") or ("none: host-emulated" if run.emulated else "?")),
        "kernel": str(e.get("kernel", "?")),
        "storage": _storage(run),
    }


ENV_ROWS = ["tool", "when", "host", "hosts", "CPU", "cores", "memory", "GPU", "accelerators",
            "kernel", "storage"]  # fmt: skip


def environments(c: Comparison) -> tuple[list[str], list[list[str]]]:
    """What each side records of its machine, side by side ("-": the side does not say)."""
    cols = [(_letter(i), _run_env(r)) for i, r in enumerate(c.runs)]
    cols += [(lb, e.env) for lb, e in c.others]
    rows = [[k, *(env.get(k, "-") for _, env in cols)] for k in ENV_ROWS]
    return ["", *(lb for lb, _ in cols)], [r for r in rows if any(v != "-" for v in r[1:])]


def external_rows(c: Comparison) -> tuple[list[str], list[list[str]]]:
    _, unit, _ = METRICS[c.metric]
    headers = ["other", "measurement", "its path", "durable", "engine", "workload", "SSDs",
               "mode A", "n A", "n", f"A: {unit}", "other: same", "other / A", "95% CI",
               "verdict"]  # fmt: skip
    t = c.external_table
    rows = [
        [r["run"], r["source"], r["path"],
         DURABLE[r["durable"]] if c.metric == "write" else "-",
         r["engine"], r["workload"], str(r["n_targets"]), r["mode_a"], *_numbers(r)]
        for r in ([] if t is None else t.to_dict("records"))
    ]  # fmt: skip
    return headers, rows


def _legend(c: Comparison) -> list[str]:
    lines = [f"{_letter(i)} = {r.run_id} ({r.path})" for i, r in enumerate(c.runs)]
    return lines + [f"{lb} = {e.tool}: {e.path}" for lb, e in c.others]


EXTERNAL_NOTE = (
    "Other tools' results: each point against every case of A. Their GB/s are decimal (gdsio's "
    "and DLIO's GiB/s converted); 'durable' says whether the tool's write timing ran until "
    "fsync, as A's write GB/s does. A single published number has no interval."
)


def text(c: Comparison) -> str:
    """What the terminal shows."""
    lines = _legend(c)
    if c.forced and c.refusals:
        lines += [f"WARNING: NOT COMPARABLE, compared because of --force: {x}" for x in c.refusals]
    lines += [f"warning: {w}" for w in c.warnings]
    if any(r.emulated for r in c.runs):
        lines.append("note: host-emulated rows (no GPU): not GPU numbers")
    lines += [f"note: {n}" for n in c.notes]
    if not c.table.empty:
        lines += ["", text_table(*table_rows(c))]
        n_sig = int(c.table["significant"].sum())
        lines.append(
            f"\n{n_sig} of {len(c.table)} differences are outside the noise (95% CI excludes 1)"
        )
    if c.others:
        lines += ["", EXTERNAL_NOTE, ""]
        h, rows = external_rows(c)
        lines.append(text_table(h, rows) if rows else "(no measurement in this direction)")
        lines += ["", "Environments:", text_table(*environments(c))]
    return "\n".join(lines)


def write(c: Comparison, outdir: str) -> list[str]:
    """compare.md, compare.csv (runs), compare-external.csv (other tools) and, for two runs or
    more, compare_bandwidth.png/pdf into outdir."""
    os.makedirs(outdir, exist_ok=True)
    col, unit, _ = METRICS[c.metric]
    paths: list[str] = []
    d = Doc()
    d.h(
        1,
        "ckptbench compare: "
        + " vs ".join([r.run_id for r in c.runs] + [e.tool for _, e in c.others]),
    )
    if c.forced and c.refusals:
        for x in c.refusals:
            d.warn(f"NOT COMPARABLE (compared because of --force): {x}")
    if any(r.emulated for r in c.runs):
        d.warn(
            "Host-emulated rows (no GPU): host memory stands in for GPU memory; gds rows are "
            "an O_DIRECT emulation. Not GPU numbers."
        )
    for n in c.notes:
        d.warn(n)
    d.ul([f"{_letter(i)}: `{r.run_id}`, storage {_storage(r)}" for i, r in enumerate(c.runs)]
         + [f"{lb}: {e.tool}, `{os.path.basename(e.path)}`" for lb, e in c.others])  # fmt: skip
    if not c.table.empty:
        paths += save(
            compare_bandwidth(c.runs, c.table, c.metric, f"{unit}: run / A"),
            outdir,
            "compare_bandwidth",
        )
        csv_path = os.path.join(outdir, "compare.csv")
        c.table.to_csv(csv_path, index=False)
        paths.append(csv_path)
        d.p(
            f"Metric: {unit} ({col}). Ratio = median of the run / median of A, with a 95% "
            "percentile-bootstrap interval (scipy.stats.bootstrap, 4000 resamples) and a "
            "two-sided Mann-Whitney U p-value; 'not significant' unless the interval excludes 1 "
            "and p < 0.05." + _too_few(c.table)
        )
        d.table(*table_rows(c))
    if c.warnings:
        d.h(2, "Differences between the runs")
        d.ul(c.warnings)
    if not c.table.empty:
        d.img(
            "compare_bandwidth.png",
            "Write bandwidth curves of each run (a) and the ratio per "
            "shared case with its 95% interval (b).",
        )
    if c.others and c.external_table is not None:
        d.h(2, "Against other tools' results")
        d.p(EXTERNAL_NOTE)
        h, rows = external_rows(c)
        if rows:
            d.table(h, rows)
            ext_csv = os.path.join(outdir, "compare-external.csv")
            c.external_table.to_csv(ext_csv, index=False)
            paths.append(ext_csv)
        else:
            d.p("None of them measured this direction.")
        d.h(2, "Environments")
        d.table(*environments(c))
    md = os.path.join(outdir, "compare.md")
    with open(md, "w") as f:
        f.write(d.markdown())
    return [*paths, md]


def default_outdir(c: Comparison) -> str:
    """<last run>/report/compare-vs-<A's run id>; against other tools only:
    <A>/report/compare-vs-<the first file's name>."""
    if len(c.runs) == 1 and c.others:
        name = os.path.splitext(os.path.basename(os.path.normpath(c.others[0][1].path)))[0]
        return os.path.join(c.runs[0].path, "report", f"compare-vs-{name}")
    return os.path.join(c.runs[-1].path, "report", f"compare-vs-{c.runs[0].run_id}")
