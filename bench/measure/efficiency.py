"""Efficiency: what a row achieved over the device ceiling that judges it, defined once for the
CSV columns, the terminal summary, the report and the model's calibration (torch-free, so that
analysis uses the very same function)."""

from __future__ import annotations

from typing import Any

from bench.common.traits import BUILTIN, Traits
from bench.measure.ceilings import Ceilings, RunCeilings

BEATEN = 1.05  # an efficiency above this is a finding about the ceiling, not a score
# The columns a row's judgement fills: judged again at the end of the sweep (`rejudge_csv`),
# while every measured column stays as written.
JUDGED = ("write_efficiency", "snapshot_efficiency", "restore_efficiency", "ceiling_beaten")


def efficiency(row: dict[str, Any], ceilings: Ceilings | None, traits: Traits) -> tuple[Any, Any]:
    """(write, snapshot) efficiency of a row against the ceilings, each None where it has none.
    The one definition every table, figure and the model's calibration use:

    - write efficiency: total_bytes / total_s (save() called until durable: the write end to
      end) over the ceiling that judges the write of an engine with these traits (O_DIRECT, or
      buffered + fsync for page-cache paths: bench.measure.ceilings.KINDS) for the targets it
      wrote (one unless it stripes);
    - snapshot efficiency, for an engine whose stall is a snapshot: total_bytes / stall_s over
      the copy ceiling (device-to-host on CUDA).
    """
    if ceilings is None or not row.get("total_s"):
        return None, None
    n = int(row["n_targets"]) if traits.stripes else 1
    write = None
    w = ceilings.bound("write", traits, n)
    if w:
        write = round(row["total_bytes"] / row["total_s"] / w, 4)
    snapshot = None
    s = ceilings.bound("snapshot", traits, n)
    if s and row.get("stall_s"):
        snapshot = round(row["total_bytes"] / row["stall_s"] / s, 4)
    return write, snapshot


def restore_efficiency(row: dict[str, Any], ceilings: Ceilings | None, traits: Traits) -> Any:
    """total_bytes / restore_s (the checkpoint read back, from a cold page cache, until usable
    on the requested device) over the read ceiling of an engine with these traits (O_DIRECT read,
    or a buffered read of a cold file for page-cache paths: bench.measure.ceilings.KINDS) for
    the targets it read (one unless it stripes); None without that ceiling or a restore."""
    if ceilings is None or not row.get("restore_s"):
        return None
    n = int(row["n_targets"]) if traits.stripes else 1
    r = ceilings.bound("restore", traits, n)
    return round(row["total_bytes"] / row["restore_s"] / r, 4) if r else None


def beaten(*effs: Any) -> bool:
    """Whether an efficiency exceeds its ceiling by more than the noise allows (the ceiling,
    not the engine, is then in question)."""
    return any(e is not None and e == e and e > BEATEN for e in effs)


def best_ceilings(env: dict[str, Any]) -> Ceilings | None:
    """The ceilings efficiencies are judged against: the best of those measured before and after
    the sweep and of the probes between workloads (a ceiling is the best the device did; the
    disk may drift within the hour)."""
    return RunCeilings.from_env(env).best()


def host_ceilings(env: dict[str, Any]) -> dict[int, Ceilings]:
    """Each host's ceilings in a run across hosts (env.json `ranks.nodes[N].ceilings`, measured
    by the first rank of each host on its own targets; host 0's the best of the run's own, as
    `best_ceilings`); {} for a run on one host."""
    nodes = env.get("ranks", {}).get("nodes", {})
    out = {
        int(n): Ceilings.from_json(b["ceilings"])
        for n, b in nodes.items()
        if isinstance(b, dict) and b.get("ceilings")
    }
    if len(nodes) < 2:
        return {}
    best = best_ceilings(env)
    if best is not None and 0 in out:
        out[0] = best
    return out


def judges(env: dict[str, Any], node_rank: int) -> list[Ceilings]:
    """The ceilings that judge a row of host `node_rank` (-1: an aggregate row): on one host the
    run's best; across hosts, a rank's row its own host's, an aggregate row every host's (it is
    judged against their sum: `combined`). Empty: no ceilings to judge it by."""
    per = host_ceilings(env)
    if not per:
        best = best_ceilings(env)
        return [best] if best is not None else []
    if node_rank >= 0:
        return [per[node_rank]] if node_rank in per else []
    nodes = env.get("ranks", {}).get("nodes", {})
    return list(per.values()) if len(per) == len(nodes) else []


def combined(effs: list[Any]) -> Any:
    """The efficiency against several hosts' ceilings at once (their sum), from the efficiency
    against each: rate / (b1 + b2 + ...) = 1 / (1/e1 + 1/e2 + ...). None if one is missing."""
    if not effs or any(e is None or not e for e in effs):
        return None
    if len(effs) == 1:
        return effs[0]
    return round(1 / sum(1 / e for e in effs), 4)


def efficiency_by(row: dict[str, Any], cs: list[Ceilings], traits: Traits) -> tuple[Any, Any]:
    """`efficiency` against the sum of the ceilings `cs` (one host's, or every host's)."""
    pairs = [efficiency(row, c, traits) for c in cs]
    return combined([p[0] for p in pairs]), combined([p[1] for p in pairs])


def restore_efficiency_by(row: dict[str, Any], cs: list[Ceilings], traits: Traits) -> Any:
    """`restore_efficiency` against the sum of the ceilings `cs`."""
    return combined([restore_efficiency(row, c, traits) for c in cs])


def rejudge_csv(path: str, env: dict[str, Any]) -> int:
    """Once the sweep is over, judge results.csv's rows again against the run's best ceilings
    (`best_ceilings`: before, after and the probes; across hosts each host's, `judges`), so
    that the CSV's efficiency columns are the summary's and the report's. Only rows judged when they were written are judged again
    (a rank's row of a many-rank save stays unjudged: its aggregate row carries the number).
    The file is replaced atomically (temp file, fsync, rename); returns the rows changed."""
    import csv
    import os

    from bench.storage.manifest import fsync_dir

    if not judges(env, -1) and not host_ceilings(env) or not os.path.exists(path):
        return 0
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        cols = list(reader.fieldnames or [])
        rows = list(reader)
    changed = 0
    for r in rows:
        traits = engine_traits(env, r.get("engine", ""))
        judged = r.get("write_efficiency") or r.get("snapshot_efficiency")
        if traits is None or not judged or not r.get("total_s"):
            continue
        num = {
            "total_bytes": float(r["total_bytes"]),
            "total_s": float(r["total_s"]),
            "stall_s": float(r["stall_s"]) if r.get("stall_s") else None,
            "restore_s": float(r["restore_s"]) if r.get("restore_s") else None,
            "n_targets": int(r["n_targets"]),
        }
        best = judges(env, int(r.get("node_rank") or 0))
        if not best:
            continue
        w, s = efficiency_by(num, best, traits)
        # A file written before restore_efficiency existed keeps its columns.
        rst = restore_efficiency_by(num, best, traits) if "restore_efficiency" in cols else None
        cells = ("" if e is None else str(e) for e in (w, s, rst))
        new = dict(zip(JUDGED, (*cells, str(beaten(w, s, rst))), strict=True))
        if "restore_efficiency" not in cols:
            del new["restore_efficiency"]
        if any(r.get(k) != v for k, v in new.items()):
            changed += 1
            r.update(new)
    if changed:
        tmp = f"{path}.tmp"
        with open(tmp, "w", newline="") as f:
            w_ = csv.DictWriter(f, fieldnames=cols)
            w_.writeheader()
            w_.writerows(rows)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(os.path.dirname(os.path.abspath(path)))
    return changed


def engine_traits(env: dict[str, Any], engine: str) -> Traits | None:
    """What `engine` is, as the run recorded it (env.json `engines`), else as the built-in
    engines of runs made before traits were recorded; None if unknown."""
    rec = env.get("engines", {}).get(engine, {})
    if isinstance(rec, dict) and isinstance(rec.get("traits"), dict):
        return Traits.from_json(rec["traits"])
    return BUILTIN.get(engine)
