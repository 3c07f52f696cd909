"""Many ranks checkpointing at once, under torchrun: the process group, which targets each rank
writes, barrier-aligned cases, and per-rank and aggregate rows gathered to rank 0.

    ckptbench run configs/multirank.yaml --nproc 4        # re-executes itself through torchrun
    torchrun --nproc-per-node 4 -m bench run configs/multirank.yaml

Every rank holds its own shard of the state (`ranks.shard: even` splits each total across the
ranks that checkpoint, as FSDP/ZeRO shard a model; `per_rank` gives every rank a whole total) and
saves it with the case's engine into its own targets (`ranks.mapping`, see `assign`). For each
repetition all ranks pass a barrier, the active ones save and wait until durable, pass a second
barrier, restore and verify their own shard, and every rank's row is gathered: rank 0 writes the
per-rank rows and one aggregate row (stall and time to durability = the maximum over ranks, bytes
= the sum, so aggregate bandwidth = total bytes / the slowest rank's time, as MLPerf Storage
reports it). `ranks.active` runs the same job with only the first k ranks checkpointing.

Failures: an error on a rank fails that repetition on every rank (its rows say which rank); a rank
that dies or hangs is named by rank 0's monitored barrier (gloo) within `ranks.timeout_s`, the
case gets error rows and every surviving rank exits non-zero; torchrun then ends the job. The
control collectives always run on a gloo group (on CUDA the default group is NCCL + gloo, one GPU
per rank); checkpoint data never crosses ranks.
"""

from __future__ import annotations

import datetime as dt
import glob
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
from dataclasses import dataclass
from typing import Any

import torch
from tqdm import tqdm

from bench import config as config_mod
from bench import devices, env, measure, results, runner, sizes
from bench.engines import REGISTRY, create
from bench.errors import UserError
from bench.workloads import synthetic_state

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
RC_FILE_ENV = "CKPTBENCH_RC_FILE"  # where rank 0 leaves its exit code for `ckptbench run --nproc`
# Fault injection for tests: "KIND@RANK:SAVE[,...]", KIND `error` (the save raises) or `kill`
# (the rank SIGKILLs itself while its save persists), SAVE counting this job's saves from 0.
FAULT_ENV = "CKPTBENCH_INJECT_FAULT"
SETUP_TIMEOUT_S = 600.0  # barriers around setup steps that only some ranks do (ceilings)

_STOP = threading.Event()  # torchrun sent SIGTERM: another rank failed, or the job is stopped


def launched() -> bool:
    """Whether this process is a rank that torchrun started (it sets RANK, WORLD_SIZE, ...)."""
    return all(k in os.environ for k in TORCHRUN_ENV)


# --- launching ---------------------------------------------------------------------------------


def torchrun_command(nproc: int, argv: list[str]) -> list[str]:
    """`python -m torch.distributed.run --standalone --nproc-per-node N -m bench ARGV...`."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}", "-m", "bench", *argv]  # fmt: skip


def launch(nproc: int, argv: list[str]) -> int:
    """Run `ckptbench ARGV` as `nproc` ranks under torchrun; rank 0's exit code (torchrun's
    own, 1, when rank 0 could not leave one)."""
    fd, rc_path = tempfile.mkstemp(prefix="ckptbench-rc-")
    os.close(fd)
    env_ = {**os.environ, RC_FILE_ENV: rc_path}
    if nproc > 1:
        env_.setdefault("OMP_NUM_THREADS", "1")  # what torchrun sets (and says so in a banner)
    proc = subprocess.Popen(torchrun_command(nproc, argv), env=env_)
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        code = proc.wait()  # torchrun forwards the interrupt to the ranks and ends them
    try:
        with open(rc_path) as f:
            text = f.read().strip()
        return int(text) if text else (code or 0) and 1
    except (OSError, ValueError):
        return 1 if code else 0
    finally:
        os.unlink(rc_path)


def run_argv(args: Any) -> list[str]:
    """The `ckptbench run` arguments each rank gets (everything but --nproc)."""
    argv = ["run", args.config, "-o", args.output]
    for a in args.set:
        argv += ["--set", a]
    if args.quiet:
        argv.append("-q")
    if args.resume:
        argv += ["--resume", args.resume]
    return argv


def cli_run(args: Any) -> int | None:
    """`ckptbench run` with ranks: launch torchrun (`--nproc N` or a `ranks:` section), or run
    as one of its ranks. None: a plain single-process run."""
    if launched():
        return worker_main(args)
    if args.nproc is not None:
        if args.nproc < 1:
            raise UserError(f"--nproc: must be at least 1, got {args.nproc}")
        args.set = [*args.set, f"ranks.nproc={args.nproc}"]
    cfg = config_mod.load(args.config, args.set)  # config errors: one line, before any rank
    if cfg.ranks is None:
        return None
    return launch(cfg.ranks.nproc, run_argv(args))


# --- the process group -------------------------------------------------------------------------


class RankLost(Exception):
    """A rank did not reach a synchronisation point: killed, crashed, hung, or torchrun is
    stopping the job. `ranks` names the lost ranks where rank 0's monitored barrier knows them."""

    def __init__(self, where: str, ranks: list[int], detail: str) -> None:
        self.where, self.ranks, self.detail = where, ranks, detail
        if ranks:
            who = ", ".join(str(r) for r in ranks)
            msg = (f"rank{'s' if len(ranks) > 1 else ''} {who} lost before {where} "
                   "(killed, crashed, or not there within the timeout)")  # fmt: skip
        else:
            msg = f"lost contact before {where}: {detail}"
        super().__init__(msg)


def _lost_ranks(text: str) -> list[int]:
    """The ranks a gloo monitored_barrier error names ('Ranks 1, 3 failed to pass ...')."""
    m = re.search(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier", text)
    return [int(x) for x in re.findall(r"\d+", m.group(1))] if m else []


@dataclass
class World:
    """This rank's place in the job and the control collectives (gloo, with timeouts)."""

    rank: int
    size: int
    local_rank: int
    node_rank: int
    host: str
    timeout_s: float
    group: Any = None  # the gloo group for control; None: the default group is gloo

    def barrier(self, where: str, timeout_s: float | None = None) -> None:
        """Every rank reaches `where`, else RankLost on every rank (rank 0 names the lost)."""
        import torch.distributed as dist  # noqa: PLC0415

        # Even after torchrun's SIGTERM, pass the barrier first: it names a lost rank.
        t = dt.timedelta(seconds=timeout_s or self.timeout_s)
        try:
            dist.monitored_barrier(group=self.group, timeout=t, wait_all_ranks=True)
        except RuntimeError as e:
            raise RankLost(where, _lost_ranks(str(e)), str(e).splitlines()[0]) from None
        if _STOP.is_set():
            raise RankLost(where, [], "torchrun is stopping the job (SIGTERM)")

    def all_gather(self, obj: Any, where: str) -> list[Any]:
        """Every rank's `obj`, in rank order (call right after a barrier)."""
        import torch.distributed as dist  # noqa: PLC0415

        out: list[Any] = [None] * self.size
        try:
            dist.all_gather_object(out, obj, group=self.group)
        except RuntimeError as e:
            raise RankLost(where, [], str(e).splitlines()[0]) from None
        return out

    def agree(self, where: str, fn: Any, timeout_s: float | None = None) -> Any:
        """Run `fn()` on every rank; if it raised on any, raise UserError on every rank naming
        the first such rank (so no rank goes on alone and waits for the others)."""
        try:
            result, err = fn(), ""
        except UserError as e:
            result, err = None, str(e)
        except Exception as e:  # noqa: BLE001 - reported on every rank
            result, err = None, runner.error_text(e)
            print(f"[rank {self.rank}] {traceback.format_exc()}", file=sys.stderr)
        self.barrier(where, timeout_s)
        errs = self.all_gather(err, where)
        bad = [(r, m) for r, m in enumerate(errs) if m]
        if bad:
            more = f" (and on {len(bad) - 1} more rank(s))" if len(bad) > 1 else ""
            raise UserError(f"{where} failed on rank {bad[0][0]}{more}: {bad[0][1]}")
        return result


def init_world(timeout_s: float, cuda: bool) -> World:
    """Join torchrun's process group: gloo on CPU; on CUDA NCCL for device tensors and a gloo
    group for the control collectives."""
    import torch.distributed as dist  # noqa: PLC0415

    t = dt.timedelta(seconds=timeout_s)
    dist.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo", timeout=t)
    group = dist.new_group(backend="gloo", timeout=t) if cuda else None
    return World(
        rank=dist.get_rank(),
        size=dist.get_world_size(),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        node_rank=int(os.environ.get("GROUP_RANK", "0")),
        host=socket.gethostname(),
        timeout_s=timeout_s,
        group=group,
    )


# --- which targets each rank writes ----------------------------------------------------------


def map_label(mapping: str, spec: config_mod.RanksSpec) -> str:
    """The `target_map` column: shared, dedicated, dedicated-subfolders or per-target-K."""
    if mapping == "dedicated" and spec.dedicated_subfolders:
        return "dedicated-subfolders"
    if mapping == "per_target":
        return f"per-target-{spec.ranks_per_target}"
    return mapping


def assign(n: int, mapping: str, k: int, j: int, ranks_per_target: int = 2,
           subfolders: bool = False) -> tuple[list[int], bool]:  # fmt: skip
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
    """`eng.save` of this rank's shard of checkpoint `base` (returns the PendingSave)."""
    return eng.save(state, shard_name(base, rank, world))


def load_shard(eng: Any, base: str, rank: int, world: int, device: str = "cpu") -> Any:
    """This rank's shard of checkpoint `base`; refused when another world size saved it."""
    check_world(eng.targets[0], base, rank, world)
    return eng.load(shard_name(base, rank, world), device=device)


# --- aggregate rows ----------------------------------------------------------------------------


def _num(rows: list[dict[str, Any]], key: str) -> list[float]:
    return [float(r[key]) for r in rows if r.get(key) is not None]


def aggregate(rows: list[dict[str, Any]], ceilings: dict[str, Any] | None = None) -> dict[str, Any]:
    """The aggregate row of one repetition from its per-rank rows (at least one).

    stall_s, total_s, restore_s, hash_s, wait_prev_s: the maximum over ranks (the job waits for
    its slowest rank); persist_s = total_s - stall_s; bytes, tensors, targets used, pinned and
    resident memory, CPU time: sums; page-cache growth: per node the maximum over its ranks (each
    rank samples its whole host), summed over nodes; verified: every rank verified; error: the
    error of the rank it failed on, prefixed with that rank; efficiencies against the run's
    ceilings (measured by one process) as for a single-process row.
    """
    first = rows[0]
    out = {c: first.get(c) for c in results.COLUMNS}

    def top(key: str) -> float | None:
        v = _num(rows, key)
        return max(v) if len(v) == len(rows) else None

    def total(key: str) -> float | None:
        v = _num(rows, key)
        return sum(v) if len(v) == len(rows) else None

    out.update(
        total_bytes=sum(int(r["total_bytes"]) for r in rows),
        n_tensors=sum(int(r["n_tensors"]) for r in rows),
        targets_used=sum(int(r["targets_used"] or 0) for r in rows),
        stall_s=top("stall_s"), total_s=top("total_s"), restore_s=top("restore_s"),
        hash_s=top("hash_s"), wait_prev_s=top("wait_prev_s"),
        pinned_bytes=total("pinned_bytes"), rss_peak_bytes=total("rss_peak_bytes"),
        cpu_user_s=total("cpu_user_s"), cpu_sys_s=total("cpu_sys_s"),
        copied_tensors=sum(int(r["copied_tensors"] or 0) for r in rows),
        checksums=all(bool(r["checksums"]) for r in rows),
        staging_grew=any(bool(r["staging_grew"]) for r in rows),
        cache_dropped=all(bool(r["cache_dropped"]) for r in rows),
        capped=any(bool(r["capped"]) for r in rows),
        persist_efficiency=None, snapshot_efficiency=None,
        verified=all(bool(r["verified"]) for r in rows),
        rank=-1, node="", node_rank=-1, aggregate=True,
    )  # fmt: skip
    out["persist_s"] = (
        out["total_s"] - out["stall_s"]
        if out["total_s"] is not None and out["stall_s"] is not None
        else None
    )
    per_node: dict[Any, float] = {}
    for r in rows:
        if r.get("page_cache_peak_bytes") is not None:
            key = r["node_rank"]
            per_node[key] = max(per_node.get(key, 0), float(r["page_cache_peak_bytes"]))
    out["page_cache_peak_bytes"] = int(sum(per_node.values())) if per_node else None
    if out["total_s"] is not None and out["stall_s"] is not None:
        out["persist_efficiency"], out["snapshot_efficiency"] = runner.efficiency(out, ceilings)
    # The rank where it failed, not the ranks that failed with it (see fail_together).
    bad = next((r for r in rows if r["error"] and not r["error"].startswith(FOLLOWED)), None)
    bad = bad or next((r for r in rows if r["error"]), None)
    out["error"] = f"rank {bad['rank']}: {bad['error']}" if bad else ""
    return out


FOLLOWED = "failed on rank "  # the error of a row whose repetition failed on another rank


def fail_together(rows: list[dict[str, Any]], check: bool) -> dict[str, Any] | None:
    """A repetition that failed on one rank fails on all: every other row's error names the
    first failing rank. Returns that rank's row (None when all succeeded)."""
    bad = next((r for r in rows if r["error"] or (check and not r["verified"])), None)
    if bad is None:
        return None
    why = bad["error"] or "restored state differs from the source"
    bad["error"] = why
    for r in rows:
        if not r["error"]:
            r["error"] = f"{FOLLOWED}{bad['rank']}: {why}"
    return bad


# --- the sweep ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Group:
    """Cases that share targets: SSD count n, mapping and k ranks checkpointing at once."""

    n: int
    mapping: str
    k: int
    label: str  # the target_map column

    @property
    def key(self) -> str:
        return f"x{self.n}-{self.label}-{self.k}r"


def _faults() -> dict[tuple[int, int], str]:
    """(rank, save index) -> kind from $CKPTBENCH_INJECT_FAULT (fault injection for tests)."""
    text = os.environ.get(FAULT_ENV, "").strip()
    out = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        m = re.fullmatch(r"(error|kill)@(\d+):(\d+)", item)
        if not m:
            raise UserError(f"${FAULT_ENV}: {item!r} is not KIND@RANK:SAVE (KIND error or kill)")
        out[(int(m.group(2)), int(m.group(3)))] = m.group(1)
    return out


class DistributedRunner(runner.Runner):
    """Runs one config as one rank of a torchrun job; rank 0 writes the run directory."""

    def __init__(self, cfg: config_mod.Config, world: World, out_root: str,
                 device: devices.Device, quiet: bool = False,
                 resume: str | None = None) -> None:  # fmt: skip
        super().__init__(cfg, out_root, quiet=quiet or world.rank != 0, resume=resume)
        self.world = world
        self.device = device
        self.spec = cfg.ranks or config_mod.RanksSpec(nproc=world.size)
        self.faults = _faults()
        self.saves = 0  # saves this rank took part in (fault injection counts them)
        self.skipped: list[str] = []
        self.ceilings = None

    def warn(self, msg: str) -> None:
        """Every rank's own trouble, on stderr with its rank (rank 0 through the progress bar)."""
        if self.world.rank == 0:
            self.log(msg)
        else:
            print(f"[rank {self.world.rank}] {msg}", file=sys.stderr)

    # -- setup ---------------------------------------------------------------------------------

    def plan(self, table: list[dict[str, Any]]) -> tuple[list[Group], dict[str, list]]:
        """The groups to run and, per group, every active rank's (target indices, subfolder)."""
        cfg, spec, w = self.cfg, self.spec, self.world
        active = spec.active or [w.size]
        for k in active:
            if k > w.size:
                self.skipped.append(f"ranks.active {k}: the job has only {w.size} ranks")
        active = [k for k in active if k <= w.size]
        groups, layout = [], {}
        for n in cfg.ssd_counts:
            for i, mapping in enumerate(spec.mapping):
                for k in active:
                    if k == 1 and i > 0:
                        continue  # one rank alone shares nothing: run once, under the first
                    g = Group(n, mapping, k, map_label(mapping, spec))
                    try:
                        layout[g.key] = self._layout(g, table)
                    except ValueError as e:
                        self.skipped.append(f"{g.key}: {e}")
                        continue
                    groups.append(g)
        if not groups:
            raise UserError(
                "ranks: no case can run with this job: " + "; ".join(self.skipped)
                if self.skipped
                else "ranks: no case to run"
            )
        return groups, layout

    def _layout(self, g: Group, table: list[dict[str, Any]]) -> list[tuple[list[int], bool]]:
        """Every active rank's targets: the mapping applies among the active ranks of a node
        (each node writes its own local targets)."""
        spec = self.spec
        out = []
        for r in range(g.k):
            node = table[r]["node_rank"]
            peers = [q for q in range(g.k) if table[q]["node_rank"] == node]
            out.append(assign(g.n, g.mapping, len(peers), peers.index(r), spec.ranks_per_target,
                              spec.dedicated_subfolders))  # fmt: skip
        return out

    def my_targets(self, g: Group) -> tuple[list[str], list[int]] | None:
        """This rank's target directories for group g and their indices in the config's
        targets (None: it does not checkpoint in this group)."""
        if self.world.rank >= g.k:
            return None
        idx, sub = self.layout[g.key][self.world.rank]
        paths = [self.targets[i] for i in idx]
        if sub:
            paths = [os.path.join(p, f"rank-{self.world.rank}") for p in paths]
        return paths, idx

    def _check_targets(self, wls: list[runner.Workload]) -> None:
        """This rank's preflight: its targets (and subfolders) exist, are writable and take
        O_DIRECT where needed; the first rank of each node checks their free space."""
        cfg = self.cfg
        if not cfg.targets:
            for t in self.targets:
                os.makedirs(t, exist_ok=True)
        mine: list[str] = []
        for g in self.groups:
            got = self.my_targets(g)
            if got is None:
                continue
            if self.layout[g.key][self.world.rank][1]:
                for p in got[0]:
                    os.makedirs(p, exist_ok=True)
            mine += [p for p in got[0] if p not in mine]
        if self.world.local_rank == 0:
            scale = max(g.k for g in self.groups) if self.spec.shard == "per_rank" else 1
            runner.preflight(cfg, self.targets, wls, scale)
        runner.check_dirs(mine, cfg.engines)

    def _same_config(self) -> None:
        """Every rank must run the same sweep (targets may differ: each node its own disks)."""
        d = config_mod.resolved(self.cfg)
        for k in ("targets", "target_caps", "scratch"):
            d.pop(k, None)
        mine = json.dumps(d, sort_keys=True, default=str)
        theirs = self.world.all_gather(mine, "the config check")
        for r, t in enumerate(theirs):
            if t != mine:
                raise UserError(
                    f"rank {r} runs another config than rank {self.world.rank} (give every "
                    "node the same config and --set; only targets and scratch may differ)"
                )

    def run(self) -> str:
        cfg, w = self.cfg, self.world
        self.targets = cfg.resolved_targets()
        wls = runner.workloads(cfg)
        w.barrier("the start")
        self._same_config()
        me = {"rank": w.rank, "local_rank": w.local_rank, "node_rank": w.node_rank,
              "host": w.host, "pid": os.getpid(), "device": str(self.device.torch_device)}  # fmt: skip
        table = w.all_gather(me, "the rank table")
        self.groups, self.layout = self.plan(table)
        w.agree("the target check", lambda: self._check_targets(wls))
        paths = {g.key: got[0] for g in self.groups if (got := self.my_targets(g))}
        paths_all = w.all_gather(paths, "the target check")
        self.skipped_engines = runner.skipped_engines(cfg)
        for e, why in self.skipped_engines.items():
            self.notes.append(f"engine {e} skipped: it cannot run here: {why}")
        head = w.agree("the run directory", self._open_run if w.rank == 0 else lambda: None)
        head = w.all_gather(head, "the run directory")[0]
        self.run_id, self.run_dir, done = head["run_id"], head["run_dir"], head["done"]
        self.done = {tuple(x) for x in done}
        node_env = w.agree(
            "the environment",
            lambda: {"storage": env.targets_info(self.targets[: max(cfg.ssd_counts)]),
                     "cache_drop": measure.drop_page_cache()} if w.local_rank == 0 else None,
        )  # fmt: skip
        nodes = w.all_gather(node_env, "the environment")
        drops = {table[r]["node_rank"]: n["cache_drop"] for r, n in enumerate(nodes) if n}
        self.cache_dropped = drops.get(w.node_rank) is None
        for node, why in sorted(drops.items()):
            if why:
                self.notes.append(f"node {node}: page cache not dropped between cases: {why}")
        if w.size != self.spec.nproc:
            self.notes.append(f"ranks.nproc is {self.spec.nproc}, torchrun started {w.size} ranks")
        ceil = w.agree("the ceilings",
                       (lambda: self.measure_ceilings(self.targets, wls)[0])
                       if cfg.ceilings.enabled and w.rank == 0 and not self.resume
                       else (lambda: None), timeout_s=SETUP_TIMEOUT_S)  # fmt: skip
        if w.rank == 0:
            if ceil is not None:
                head["env"]["ceilings"] = ceil
            ceil = head["env"].get("ceilings")  # measured now, or by the run resumed
        self.ceilings = w.all_gather(ceil, "the ceilings")[0]
        if w.rank == 0:
            self._write_env(head["env"], table, nodes, paths_all)
            self.writer = results.RowWriter(os.path.join(self.run_dir, "results.csv"))
        per_wl = sum(len(self.engines_at(g.n)) for g in self.groups)
        n_saves = per_wl * len(wls) * (cfg.warmups + cfg.repetitions)
        self.log(f"run {self.run_id}: {w.size} ranks, {n_saves} checkpoints (each by up to "
                 f"{max(g.k for g in self.groups)} ranks at once) on {self.device.kind}; "
                 f"results in {self.run_dir}")  # fmt: skip
        self.bar = tqdm(total=n_saves, unit="ckpt", file=sys.stderr, disable=self.quiet,
                        dynamic_ncols=True, initial=len(self.done))  # fmt: skip
        try:
            for g in self.groups:
                self._run_group(g, wls)
        finally:
            self.bar.close()
            if w.rank == 0:
                self.writer.close()
        return self.run_dir

    def _open_run(self) -> dict[str, Any]:
        """Rank 0: a new run directory (or the one to resume) and its environment block."""
        cfg = self.cfg
        done: list[tuple[str, bool, int]] = []
        if self.resume:
            try:
                with open(os.path.join(self.resume, "env.json")) as f:
                    was = json.load(f).get("ranks", {}).get("world_size")
            except (OSError, ValueError):
                was = self.world.size  # _resume_from says what is wrong with the directory
            if was != self.world.size:
                raise UserError(
                    f"--resume {self.resume}: it ran with {was or 1} rank(s), this job has "
                    f"{self.world.size}; resume it with "
                    + (f"--nproc {was}" if was else "`ckptbench run` without ranks")
                )
            envb = self._resume_from(self.resume)
            rows = results.read_rows(self.run_dir)
            if "aggregate" in rows:
                rows = rows[rows["aggregate"].astype(str).str.lower() == "true"]
            done = [(str(r.case_id), bool(r.warmup), int(r.rep)) for r in rows.itertuples()]
            self.done = set(done)
        else:
            self.run_id, self.run_dir = results.new_run_dir(self.out_root, cfg.name)
            envb = env.collect(self.targets[: max(cfg.ssd_counts)])
            envb["device"] = {"kind": self.device.kind, "emulated": self.device.emulated}
            envb["config"] = config_mod.resolved(cfg)
            envb["engines"] = runner.engines_block(cfg.engines)
        return {"run_id": self.run_id, "run_dir": self.run_dir, "done": done, "env": envb}

    def _write_env(self, envb: dict[str, Any], table: list[dict[str, Any]], nodes: list[Any],
                   paths: list[dict[str, list[str]]]) -> None:  # fmt: skip
        """env.json with the ranks block: who ran where, and which targets each rank wrote
        (`paths`: every rank's own directories per group, as it resolved them on its node)."""
        spec = self.spec
        layout = {}
        for g in self.groups:
            per_rank = {str(r): p[g.key] for r, p in enumerate(paths) if g.key in p}
            layout[g.key] = {"n_targets": g.n, "mapping": g.mapping, "target_map": g.label,
                             "ranks_active": g.k, "targets": per_rank}  # fmt: skip
        envb["ranks"] = {
            "world_size": self.world.size,
            "nproc_config": spec.nproc,
            "backend": "cpu:gloo,cuda:nccl" if self.device.is_cuda else "gloo",
            "timeout_s": spec.timeout_s,
            "shard": spec.shard,
            "mapping": list(spec.mapping),
            "active": sorted({g.k for g in self.groups}),
            "table": table,
            "nodes": {
                str(table[r]["node_rank"]): {"host": table[r]["host"], **n}
                for r, n in enumerate(nodes)
                if n
            },  # fmt: skip
            "layout": layout,
            "skipped": self.skipped,
            "paths_note": "targets are node-local paths: each node writes its own disks; "
            "with one active rank a case runs once, under the first mapping",
        }
        if envb["storage"]["shared_device"]:
            self.notes.append(
                "all targets share one device: SSD-count scaling on this run is not real scaling"
            )
        if any(len({t["host"] for t in table if t["node_rank"] == n}) > 1
               for n in {t["node_rank"] for t in table}):  # fmt: skip
            self.notes.append("one node rank on several hosts: check the torchrun --node-rank")
        envb["notes"] = sorted(set(envb.get("notes", []) + self.notes + self.skipped))
        results.write_json(os.path.join(self.run_dir, "env.json"), envb)

    # -- cases ---------------------------------------------------------------------------------

    def _case_id(self, w: runner.Workload, g: Group, engine: str, i: int) -> tuple[str, bool, int]:
        cid, warm, rep = self._key(w, g.n, engine, i)
        return f"{cid}-{g.label}-{g.k}r", warm, rep

    def _run_group(self, g: Group, wls: list[runner.Workload]) -> None:
        cfg, w = self.cfg, self.world
        names = self.engines_at(g.n)
        mine = self.my_targets(g)

        def make() -> dict[str, Any]:
            if mine is None:
                return {}
            paths, idx = mine
            return {e: create(e, paths, **runner._options(cfg, e, len(paths), idx))
                    for e in names}  # fmt: skip

        engines = w.agree(f"the engines of {g.key}", make)
        try:
            for wl in wls:
                todo = [(i, e) for i in range(cfg.warmups + cfg.repetitions) for e in names
                        if self._case_id(wl, g, e, i) not in self.done]  # fmt: skip
                if not todo:
                    continue
                self.bar.set_description(f"{wl.id} {g.key}")
                state = w.agree(f"the state of {wl.id}", lambda wl=wl: self._build(wl, g, engines))
                if self.cache_dropped and w.local_rank == 0:
                    measure.drop_page_cache()
                for i, e in todo:
                    self._case(g, wl, e, engines.get(e), state, i)
                del state
        finally:
            for eng in engines.values():
                eng.close()

    def _build(self, wl: runner.Workload, g: Group, engines: dict[str, Any]) -> Any:
        """This rank's shard of the workload on its device, engines warmed (None: not active)."""
        if self.world.rank >= g.k:
            return None
        dtype = getattr(torch, self.cfg.dtype)
        size = shard_bytes(wl.total_bytes, g.k, self.world.rank, dtype.itemsize, self.spec.shard)
        if size == 0:
            raise UserError(
                f"{wl.id}: {sizes.format_size(wl.total_bytes)} split over {g.k} ranks leaves "
                f"rank {self.world.rank} nothing to save"
            )
        state = synthetic_state(size, min(wl.tensor_bytes, size), dtype,
                                self.device.torch_device, self.cfg.seed + self.world.rank)  # fmt: skip
        for eng in engines.values():
            eng.warm(state)
        return state

    def _inject(self, kind: str) -> Any:
        """The fault to inject into this save, as an after-save hook (tests only)."""
        if kind == "error":
            raise RuntimeError(f"injected fault: rank {self.world.rank} fails save {self.saves}")

        def kill() -> None:
            os.kill(os.getpid(), signal.SIGKILL)

        return kill

    def _case(self, g: Group, wl: runner.Workload, engine: str, eng: Any, state: Any,
              i: int) -> None:  # fmt: skip
        """One repetition on every rank: aligned save, aligned restore, rows to rank 0."""
        cfg, w = self.cfg, self.world
        case_id, warm, rep = self._case_id(wl, g, engine, i)
        base = f"ckptbench-{self.run_id}-{case_id}-{'w' if warm else 'r'}{rep}"
        name = shard_name(base, w.rank, g.k)
        row = None
        if eng is not None:
            mine = self.my_targets(g)
            assert mine is not None
            caps = cfg.target_caps()
            capped = any(caps[j] for j in mine[1]) and REGISTRY[engine].traits.stripes
            n_tensors, total = runner._tensor_stats(state)
            row = runner.new_row(cfg, self.run_id, case_id, engine, eng, self.device, wl,
                                 total, n_tensors, g.n, warm, rep, self.cache_dropped, capped)  # fmt: skip
            row.update(tensor_bytes=min(wl.tensor_bytes, total), rank=w.rank, world_size=w.size,
                       node=w.host, node_rank=w.node_rank, ranks_active=g.k, target_map=g.label)  # fmt: skip
        where = f"{case_id} {'warm-up' if warm else 'rep'} {rep}"
        try:
            w.barrier(f"the save of {where}")
            if row is not None:
                fault = self.faults.get((w.rank, self.saves))
                try:
                    hook = self._inject(fault) if fault else None
                    runner.save_phase(row, eng, state, name, self.ceilings, after_save=hook)
                    if g.k > 1:  # the ceilings are the whole device's: see the aggregate row
                        row["persist_efficiency"] = row["snapshot_efficiency"] = None
                except Exception as e:  # noqa: BLE001 - reported on every rank below
                    row["error"] = runner.error_text(e)
                self.saves += 1
            w.barrier(f"the restore of {where}")
            if row is not None and not row["error"]:
                try:
                    runner.restore_phase(
                        row, eng, engine, state, name, self.device, cfg.verify,
                        load=lambda n, device: load_shard(eng, base, w.rank, g.k, device),
                    )  # fmt: skip
                except Exception as e:  # noqa: BLE001
                    row["error"] = runner.error_text(e)
            w.barrier(f"the rows of {where}")
            rows = [r for r in w.all_gather(row, f"the rows of {where}") if r is not None]
        except RankLost as lost:
            if row is not None:
                runner.delete_checkpoint(eng, name, self.warn)
            if w.rank == 0:
                self._write_lost(row, lost, g, wl, engine, case_id, warm, rep)
            raise
        except KeyboardInterrupt:
            if row is not None:  # the case in flight leaves nothing behind
                runner.delete_checkpoint(eng, name, self.warn)
            raise
        if row is not None:
            runner.delete_checkpoint(eng, name, self.warn)
        self.bar.update(1)
        bad = fail_together(rows, cfg.verify)
        if w.rank == 0:
            for r in rows:
                self.writer.write(r)
            self.writer.write(aggregate(rows, self.ceilings))
        if bad is not None:
            self.failures += 1
            self.log(f"case {case_id} rep {rep}: failed on rank {bad['rank']}: {bad['error']}")
            if cfg.on_error == "stop":
                raise UserError(
                    f"stopped after a failed case ({case_id}, rank {bad['rank']}); "
                    f"results so far are in {self.run_dir}"
                )

    def _write_lost(self, row: dict[str, Any] | None, lost: RankLost, g: Group,
                    wl: runner.Workload, engine: str, case_id: str, warm: bool,
                    rep: int) -> None:  # fmt: skip
        """Rank 0: the rows of a repetition a rank was lost in (its own and the aggregate)."""
        why = str(lost)
        if row is not None:
            row["error"] = row["error"] or why
            self.writer.write(row)
        # The aggregate names the case; its measurements are unknown (a rank never reported).
        agg: dict[str, Any] = {c: None for c in results.COLUMNS}
        agg.update(run_id=self.run_id, case_id=case_id, engine=engine, device=self.device.kind,
                   emulated=self.device.emulated, gds_mode="none", workload=wl.id,
                   total_bytes=0, tensor_bytes=wl.tensor_bytes, n_tensors=0, n_targets=g.n,
                   targets_used=0, rep=rep, warmup=warm, checksums=False, staging_grew=False,
                   copied_tensors=0, cache_dropped=self.cache_dropped, dtype=self.cfg.dtype,
                   options="{}", capped=False, verified=False, error=why, rank=-1,
                   world_size=self.world.size, node="", node_rank=-1, aggregate=True,
                   ranks_active=g.k, target_map=g.label)  # fmt: skip
        self.writer.write(agg)
        self.writer.close()


# --- the terminal summary ----------------------------------------------------------------------


def summary(run_dir: str) -> Any:
    """Aggregate rows per workload x SSD count x mapping x active ranks x engine: median
    aggregate write GB/s (total bytes / slowest rank's total_s), stall (max over ranks), restore."""
    df = results.read_rows(run_dir)
    df = df[df["aggregate"].astype(str).str.lower() == "true"]
    df = df[(df["warmup"].astype(str).str.lower() != "true") & df["error"].isna()]
    if df.empty:
        return df
    df = df.assign(write_GBps=df["total_bytes"] / df["total_s"] / 1e9,
                   restore_GBps=df["total_bytes"] / df["restore_s"] / 1e9)  # fmt: skip
    g = df.groupby(["workload", "n_targets", "target_map", "ranks_active", "engine"], sort=False)
    out = g.agg(n=("rep", "size"), write_GBps=("write_GBps", "median"),
                stall_s=("stall_s", "median"), total_s=("total_s", "median"),
                restore_GBps=("restore_GBps", "median"))  # fmt: skip
    return out.round({"write_GBps": 2, "stall_s": 3, "total_s": 3, "restore_GBps": 2})


def bandwidth_notes(table: Any) -> list[str]:
    """'aggregate write bandwidth of k ranks against one rank' lines, per workload, SSD count
    and engine (from `summary`)."""
    if table is None or len(table) == 0:
        return []
    t = table.reset_index()
    notes = []
    for (wl, n, e), grp in t.groupby(["workload", "n_targets", "engine"], sort=False):
        one = grp[grp["ranks_active"] == 1]["write_GBps"]
        base = float(one.iloc[0]) if len(one) else None
        parts = [f"1 rank {base:.2f} GB/s"] if base else []
        for _, r in grp[grp["ranks_active"] > 1].iterrows():
            x = f" ({r['write_GBps'] / base:.2f}x)" if base else ""
            parts.append(
                f"{r['ranks_active']} ranks {r['target_map']} {r['write_GBps']:.2f} GB/s{x}"
            )
        if parts:
            notes.append(f"aggregate write bandwidth, {e}, {wl}, {n} SSD(s): " + "; ".join(parts))
    return notes


# --- one rank's `ckptbench run` -----------------------------------------------------------------


def _exit_code(rank: int, code: int) -> None:
    """Rank 0 leaves its exit code for the `ckptbench run --nproc` that launched torchrun."""
    path = os.environ.get(RC_FILE_ENV)
    if rank == 0 and path:
        try:
            with open(path, "w") as f:
                f.write(str(code))
        except OSError:
            pass


def _device_for_rank(requested: str) -> devices.Device:
    """One GPU per rank (cuda:LOCAL_RANK) when the run uses CUDA, else host-emulated."""
    if requested != "host-emulated" and torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if local >= torch.cuda.device_count():
            raise UserError(
                f"local rank {local} but {torch.cuda.device_count()} GPU(s) on "
                f"{socket.gethostname()}: one GPU per rank (use --nproc-per-node <= GPUs)"
            )
        torch.cuda.set_device(local)
    return devices.detect(requested)


def worker_main(args: Any) -> int:
    """One rank of a torchrun job: run the sweep; rank 0 prints the summary. Exit codes as
    `ckptbench run`: 0, 1 (failed rows or a lost rank), 2 (a user error), 130 (interrupted)."""
    rank = int(os.environ["RANK"])
    signal.signal(signal.SIGTERM, lambda *_: _STOP.set())
    code = 2
    r: DistributedRunner | None = None
    try:
        cfg = config_mod.load(args.config, args.set)
        spec = cfg.ranks or config_mod.RanksSpec()
        device = _device_for_rank(cfg.device)
        world = init_world(spec.timeout_s, device.is_cuda)
        r = DistributedRunner(cfg, world, args.output, device, quiet=args.quiet,
                              resume=args.resume)  # fmt: skip
        run_dir = r.run()
        code = 1 if r.failures else 0
        if rank == 0:
            _print_summary(r, run_dir)
        import torch.distributed as dist  # noqa: PLC0415

        dist.destroy_process_group()
    except UserError as e:
        if rank == 0:
            print(f"ckptbench: error: {e}", file=sys.stderr)
        code = 2
        _exit_code(rank, code)
        sys.stderr.flush()
        os._exit(code)  # the process group may be half-built: do not wait on it at exit
    except RankLost as e:
        where = f" results so far are in {r.run_dir}." if r is not None and r.run_dir else ""
        print(f"ckptbench: [rank {rank}] error: {e}.{where}", file=sys.stderr)
        code = 1
        _exit_code(rank, code)
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(code)
    except KeyboardInterrupt:
        if rank == 0 and r is not None and r.run_dir:
            print(f"ckptbench: interrupted; the rows recorded so far are in {r.run_dir}/"
                  f"results.csv. Continue with: ckptbench run {args.config} --resume "
                  f"{r.run_dir} --nproc {r.world.size}", file=sys.stderr)  # fmt: skip
        code = 130
        _exit_code(rank, code)
        sys.stderr.flush()
        os._exit(code)
    _exit_code(rank, code)
    return code


def _print_summary(r: DistributedRunner, run_dir: str) -> None:
    table = summary(run_dir)
    print(f"\nrun {r.run_id} ({r.device.kind}{', emulated' if r.device.emulated else ''}), "
          f"{r.world.size} ranks; aggregate rows (stall: the slowest rank; GB/s: all ranks' "
          "bytes / the slowest rank's total_s)")  # fmt: skip
    if len(table):
        print(table.to_string())
    for line in runner.ceiling_lines(run_dir):
        print(line)
    for note in r.notes + r.skipped + bandwidth_notes(table) + runner.mode_notes(run_dir):
        print(f"note: {note}")
    print(f"results: {run_dir}/results.csv, environment: {run_dir}/env.json")
    if r.failures:
        print(f"{r.failures} case(s) failed or did not verify", file=sys.stderr)
