"""Which targets each rank writes, its shard of the state, the groups of cases a job runs, and
what rank 0 records about the job (the ranks block of env.json, the rows of a lost rank)."""

from __future__ import annotations

import glob
import json
import os
import re
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bench.common import sizes
from bench.common.errors import UserError
from bench.common.schema import DTYPES
from bench.config import sweep as config_mod
from bench.measure import clock, results
from bench.run.core import Core, World
from bench.run.distributed.world import RankLost
from bench.run.plan import Group, RunPlan, Workload

if TYPE_CHECKING:
    from bench.common.devices import Device

# Fault injection for tests: "KIND@RANK:SAVE[,...]", KIND `error` (the save raises), `kill`
# (the rank SIGKILLs itself while its save persists) or `host` (its host goes down then: its
# torchrun agent, every other rank of the agent and itself SIGKILLed), SAVE counting this job's
# saves from 0.
FAULT_ENV = "CKPTBENCH_INJECT_FAULT"


# --- which targets each rank writes ----------------------------------------------------------


def map_label(mapping: str, spec: config_mod.RanksSpec) -> str:
    """The `target_map` column: shared, dedicated, dedicated-subfolders or per-target-K."""
    if mapping == "dedicated" and spec.dedicated_subfolders:
        return "dedicated-subfolders"
    if mapping == "per_target":
        return f"per-target-{spec.ranks_per_target}"
    return mapping


def assign(
    n: int, mapping: str, k: int, j: int, ranks_per_target: int = 2, subfolders: bool = False
) -> tuple[list[int], bool]:
    """(indices into the first `n` targets, whether in a per-rank subfolder) for the j-th of the
    k ranks of one node that checkpoint at once. Raises ValueError saying why it cannot be.

    - shared: every rank stripes over all n targets (its files carry its rank in their name);
    - dedicated: the n targets split evenly among the k ranks (n a multiple of k), or with
      subfolders every rank writes `target/rank-R` of all n targets;
    - per_target: groups of K ranks (the last may be smaller), each group on an even share of
      the n targets (n a multiple of the number of groups); K >= k is shared.
    """
    if mapping == "shared" or (mapping == "dedicated" and subfolders):
        return list(range(n)), mapping == "dedicated"
    if mapping == "dedicated":
        if n % k:
            raise ValueError(f"{n} target(s) do not split evenly among {k} ranks")
        per = n // k
        return list(range(j * per, (j + 1) * per)), False
    if mapping == "per_target":
        groups = -(-k // ranks_per_target)
        if n % groups:
            raise ValueError(
                f"{n} target(s) do not split evenly among {groups} groups of "
                f"{ranks_per_target} ranks"
            )
        per, g = n // groups, j // ranks_per_target
        return list(range(g * per, (g + 1) * per)), False
    raise ValueError(f"unknown mapping {mapping!r}")


def shard_bytes(total: int, k: int, j: int, item: int, mode: str) -> int:
    """Bytes of the j-th of k shards of `total` (whole elements; the first ones get the rest)."""
    if mode == "per_rank":
        return total
    n = total // item
    return item * (n // k + (1 if j < n % k else 0))


def shard_name(base: str, rank: int, world: int) -> str:
    """The name of rank `rank`'s shard of checkpoint `base` saved by `world` ranks."""
    return f"{base}.rank{rank}-of-{world}"


def check_world(target: str, base: str, rank: int, world: int) -> None:
    """Refuse to restore checkpoint `base` with `world` ranks when another number saved it."""
    if os.path.isdir(os.path.join(target, shard_name(base, rank, world))):
        return
    found = glob.glob(os.path.join(glob.escape(target), glob.escape(base) + ".rank*-of-*"))
    saved = sorted({int(m.group(1)) for p in found if (m := re.search(r"-of-(\d+)$", p))})
    if saved and world not in saved:
        by = " or ".join(str(w) for w in saved)
        raise UserError(
            f"checkpoint {base}: saved by {by} rank(s), this job has {world}; restore it with "
            f"{by} rank(s) (resharding to another world size is not supported)"
        )


def save_shard(eng: Any, state: Any, base: str, rank: int, world: int) -> Any:
    """This rank's shard of checkpoint `base`, saved through the harness's clock (returns the
    TimedSave, bench.measure.clock)."""
    return clock.clocked(eng).save(state, shard_name(base, rank, world))


def load_shard(
    eng: Any,
    base: str,
    rank: int,
    world: int,
    device: str = "cpu",
    checksums: bool = True,
    into: Any = None,
) -> Any:
    """This rank's shard of checkpoint `base` (into `into`'s tensors, if given); refused when
    another world size saved it."""
    check_world(eng.targets[0], base, rank, world)
    name = shard_name(base, rank, world)
    if into is not None:
        return eng.load(name, device=device, checksums=checksums, into=into)
    return eng.load(name, device=device, checksums=checksums)


# --- planning the groups of a multi-rank sweep ------------------------------------------------


def plan_groups(
    cfg: config_mod.Config, spec: config_mod.RanksSpec, size: int, table: list[dict[str, Any]]
) -> tuple[list[Group], dict[str, list[tuple[list[int], bool]]], list[str]]:
    """The groups to run, every active rank's (target indices, subfolder) per group, and the
    groups skipped (with why)."""
    skipped = []
    active = spec.active or [size]
    for k in active:
        if k > size:
            skipped.append(f"ranks.active {k}: the job has only {size} ranks")
    active = [k for k in active if k <= size]
    groups: list[Group] = []
    layout: dict[str, list[tuple[list[int], bool]]] = {}
    for n in cfg.ssd_counts:
        for i, mapping in enumerate(spec.mapping):
            for k in active:
                if k == 1 and i > 0:
                    continue  # one rank alone shares nothing: run once, under the first
                g = Group(n, mapping, k, map_label(mapping, spec))
                try:
                    layout[g.key] = _layout(g, spec, table)
                except ValueError as e:
                    skipped.append(f"{g.key}: {e}")
                    continue
                groups.append(g)
    if not groups:
        raise UserError(
            "ranks: no case can run with this job: " + "; ".join(skipped)
            if skipped
            else "ranks: no case to run"
        )
    return groups, layout, skipped


def _layout(
    g: Group, spec: config_mod.RanksSpec, table: list[dict[str, Any]]
) -> list[tuple[list[int], bool]]:
    """Every active rank's targets: the mapping applies among the active ranks of a node (each
    node writes its own local targets)."""
    out = []
    for r in range(g.k):
        node = table[r]["node_rank"]
        peers = [q for q in range(g.k) if table[q]["node_rank"] == node]
        out.append(
            assign(
                g.n,
                g.mapping,
                len(peers),
                peers.index(r),
                spec.ranks_per_target,
                spec.dedicated_subfolders,
            )
        )
    return out


def same_config(cfg: config_mod.Config, w: World) -> None:
    """Every rank must run the same sweep as rank 0 (targets, their caps and scratch may differ:
    each node its own disks); else a UserError on every rank naming the first rank that
    differs, its host and the first key."""
    d = config_mod.resolved(cfg)
    for k in ("targets", "target_caps", "max_write_bw", "scratch"):
        d.pop(k, None)
    mine = json.loads(json.dumps(d, sort_keys=True, default=str))
    theirs = w.all_gather((w.host, mine), "the config check")
    host0, first = theirs[0]
    for r, (host, t) in enumerate(theirs):
        if t == first:
            continue
        key = _first_difference(first, t)
        where = f"{host}, rank {r}" if host != host0 else f"rank {r}"
        raise UserError(
            f"{key}: {where} runs {_show(t, key)}, {host0} (rank 0) {_show(first, key)}; give "
            "every node the same config and --set (only targets and scratch may differ)"
        )


def _first_difference(a: Any, b: Any, path: str = "") -> str:
    """The dotted path of the first key where two resolved configs differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                return _first_difference(a.get(k), b.get(k), f"{path}.{k}" if path else k)
    return path or "config"


def _show(d: Any, key: str) -> str:
    """The value at dotted `key` of a resolved config, as the user would write it."""
    for part in key.split("."):
        d = d.get(part) if isinstance(d, dict) else None
    return "nothing" if d is None else json.dumps(d)


def check_resume_world(run_dir: str, size: int) -> None:
    """A multi-rank run resumes only with the number of ranks it ran with."""
    try:
        with open(os.path.join(run_dir, "env.json")) as f:
            was = json.load(f).get("ranks", {}).get("world_size")
    except (OSError, ValueError):
        return  # the core says what is wrong with the directory
    if was != size:
        raise UserError(
            f"--resume {run_dir}: it ran with {was or 1} rank(s), this job has {size}; resume it "
            "with " + (f"--nproc {was}" if was else "`ckptbench run` without ranks")
        )


@dataclass(frozen=True)
class RankContext:
    """What the rank-level steps of a sweep need of it, and no more: the config and its ranks
    section, this rank's world, the run's device, core and (decided) plan."""

    cfg: config_mod.Config
    spec: config_mod.RanksSpec
    world: World
    device: Device
    core: Core
    plan: RunPlan


def build_shard(ctx: RankContext, wl: Workload, g: Group) -> Any:
    """This rank's shard of workload `wl` in group g, on its device."""
    w, cfg = ctx.world, ctx.cfg
    if wl.mlperf is not None:  # its own shard of the preset, as MLPerf lays out the ranks
        return wl.build(cfg, ctx.device.torch_device, seed=w.rank, rank=w.rank)
    item = DTYPES[cfg.dtype]
    size = shard_bytes(wl.total_bytes, g.k, w.rank, item, ctx.spec.shard)
    if size == 0:
        raise UserError(
            f"{wl.id}: {sizes.format_size(wl.total_bytes)} split over {g.k} ranks leaves rank "
            f"{w.rank} nothing to save"
        )
    return wl.build(cfg, ctx.device.torch_device, size, seed=w.rank)


def ranks_block(
    ctx: RankContext,
    nodes: list[dict[str, Any] | None],
    paths: list[dict[str, list[str]]],
    ceilings: dict[int, Any] | None = None,
) -> dict[str, Any]:
    """env.json `ranks`: who ran where, what each node is (its environment and storage, and
    across hosts its own `ceilings`), and which targets each rank wrote (`paths`: every rank's
    own directories per group, as it resolved them on its node)."""
    spec, table = ctx.spec, ctx.plan.table
    layout = {}
    for g in ctx.plan.groups:
        per_rank = {str(r): p[g.key] for r, p in enumerate(paths) if g.key in p}
        layout[g.key] = {
            "n_targets": g.n,
            "mapping": g.mapping,
            "target_map": g.label,
            "ranks_active": g.k,
            "targets": per_rank,
        }
    if any(
        len({t["host"] for t in table if t["node_rank"] == n}) > 1
        for n in {t["node_rank"] for t in table}
    ):
        ctx.core.note("one node rank on several hosts: check the torchrun --node-rank")
    return {
        "world_size": ctx.world.size,
        "nproc_config": spec.nproc,
        "backend": "cpu:gloo,cuda:nccl" if ctx.device.is_cuda else "gloo",
        "timeout_s": spec.timeout_s,
        "shard": spec.shard,
        "mapping": list(spec.mapping),
        "active": sorted({g.k for g in ctx.plan.groups}),
        "table": table,
        "nodes": {
            str(table[r]["node_rank"]): {
                "host": table[r]["host"],
                **n,
                **(
                    {"ceilings": ceilings[table[r]["node_rank"]]}
                    if ceilings and table[r]["node_rank"] in ceilings
                    else {}
                ),
            }
            for r, n in enumerate(nodes)
            if n
        },
        "layout": layout,
        "skipped": ctx.plan.skipped_groups,
        "paths_note": "targets are node-local paths: each node writes its own disks; "
        "with one active rank a case runs once, under the first mapping",
    }


def write_lost(
    ctx: RankContext,
    row: results.Row | None,
    lost: RankLost,
    g: Group,
    wl: Workload,
    engine: str,
    key: tuple[str, bool, int],
    close: bool = True,
) -> None:
    """Rank 0: the rows of a repetition a rank was lost in (its own and the aggregate), at
    once and durably, before torchrun ends the job (the writers closed after, unless `close`
    is False: more such rows to come)."""
    why = str(lost)
    case_id, warm, rep = key
    out = []
    if row is not None:
        row.error = row.error or why
        out.append(row)
    # The aggregate names the case; its measurements are unknown (a rank never reported).
    agg = results.Row(
        run_id=ctx.core.run_id,
        case_id=case_id,
        engine=engine,
        device=ctx.device.kind,
        emulated=ctx.device.emulated,
        workload=wl.id,
        total_bytes=0,
        tensor_bytes=wl.tensor_bytes,
        n_tensors=0,
        n_targets=g.n,
        rep=rep,
        warmup=warm,
        cache_dropped=ctx.plan.cache_dropped,
        dtype=ctx.cfg.dtype,
        options="{}",
        error=why,
        rank=-1,
        world_size=ctx.world.size,
        node_rank=-1,
        aggregate=True,
        ranks_active=g.k,
        target_map=g.label,
    )
    out.append(agg)
    ctx.core.write(out)
    if close:
        ctx.core.close()


def faults() -> dict[tuple[int, int], str]:
    """(rank, save index) -> kind from $CKPTBENCH_INJECT_FAULT (fault injection for tests)."""
    text = os.environ.get(FAULT_ENV, "").strip()
    out = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        m = re.fullmatch(r"(error|kill|host)@(\d+):(\d+)", item)
        if not m:
            raise UserError(
                f"${FAULT_ENV}: {item!r} is not KIND@RANK:SAVE (KIND error, kill or host)"
            )
        out[(int(m.group(2)), int(m.group(3)))] = m.group(1)
    return out


def inject(kind: str, rank: int, save: int) -> Callable[[], None]:
    """The fault to inject into a save, as an after-save hook (tests only)."""
    if kind == "error":
        raise RuntimeError(f"injected fault: rank {rank} fails save {save}")

    def kill() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def host_down() -> None:
        # the agent first (it must not outlive its ranks to report them), its other ranks
        # found before it dies (they are its children until then), this rank last
        agent = os.getppid()
        peers = [p for p in _children(agent) if p != os.getpid()]
        for pid in [agent, *peers]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        os.kill(os.getpid(), signal.SIGKILL)

    return host_down if kind == "host" else kill


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                # the fields after the command's closing parenthesis: state, ppid, ...
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(d))
    return out
