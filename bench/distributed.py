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

from bench import config as config_mod
from bench import results, sizes
from bench.errors import UserError
from bench.plan import Group
from bench.schema import DTYPES

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
class TorchrunWorld:
    """This rank's place in the job and the control collectives (gloo, with timeouts)."""

    rank: int
    size: int
    local_rank: int
    node_rank: int
    host: str
    timeout_s: float
    group: Any = None  # the gloo group for control; None: the default group is gloo
    store: Any = None  # the job's key-value store (torchrun's agent holds it)

    def _mark(self, where: str) -> None:
        """Leave in the job's store where this rank is, so that rank 0 can tell which ranks
        never reached a barrier when gloo only says a connection closed."""
        if self.store is not None:
            try:
                self.store.set(f"ckptbench/at/{self.rank}", where)
            except Exception:  # only helps to name a lost rank
                pass

    def _behind(self, where: str) -> list[int]:
        """The ranks whose last mark is not `where` (they died, or never got there)."""
        if self.store is None:
            return []
        out = []
        try:
            for r in range(self.size):
                key = f"ckptbench/at/{r}"
                if not self.store.check([key]) or self.store.get(key).decode() != where:
                    out.append(r)
        except Exception:  # the store is gone: torchrun is ending the job
            return []
        return out

    def barrier(self, where: str, timeout_s: float | None = None) -> None:
        """Every rank reaches `where`, else RankLost on every rank, naming the lost ranks:
        those gloo's monitored barrier names, else those that never marked `where` in the
        job's store (gloo may report only a closed connection, when the rank died before
        this one entered the barrier)."""
        import torch.distributed as dist

        self._mark(where)
        # Even after torchrun's SIGTERM, pass the barrier first: it names a lost rank.
        t = dt.timedelta(seconds=timeout_s or self.timeout_s)
        try:
            dist.monitored_barrier(group=self.group, timeout=t, wait_all_ranks=True)
        except RuntimeError as e:
            ranks = _lost_ranks(str(e)) or self._behind(where)
            raise RankLost(where, ranks, str(e).splitlines()[0]) from None
        if _STOP.is_set():
            raise RankLost(where, [], "torchrun is stopping the job (SIGTERM)")

    def all_gather(self, obj: Any, where: str) -> list[Any]:
        """Every rank's `obj`, in rank order (call right after a barrier)."""
        import torch.distributed as dist

        out: list[Any] = [None] * self.size
        try:
            dist.all_gather_object(out, obj, group=self.group)
        except RuntimeError as e:
            raise RankLost(where, [], str(e).splitlines()[0]) from None
        return out

    def agree(self, where: str, fn: Any, timeout_s: float | None = None) -> Any:
        """Run `fn()` on every rank; if it raised on any, raise UserError on every rank naming
        the first such rank (so no rank goes on alone and waits for the others)."""
        from bench.rows import error_text

        try:
            result, err = fn(), ""
        except UserError as e:
            result, err = None, str(e)
        except Exception as e:  # reported on every rank
            result, err = None, error_text(e)
            print(f"[rank {self.rank}] {traceback.format_exc()}", file=sys.stderr)
        self.barrier(where, timeout_s)
        errs = self.all_gather(err, where)
        bad = [(r, m) for r, m in enumerate(errs) if m]
        if bad:
            more = f" (and on {len(bad) - 1} more rank(s))" if len(bad) > 1 else ""
            raise UserError(f"{where} failed on rank {bad[0][0]}{more}: {bad[0][1]}")
        return result


def init_world(timeout_s: float, cuda: bool) -> TorchrunWorld:
    """Join torchrun's process group: gloo on CPU; on CUDA NCCL for device tensors and a gloo
    group for the control collectives."""
    import torch.distributed as dist  # noqa: PLC0415

    t = dt.timedelta(seconds=timeout_s)
    dist.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo", timeout=t)
    group = dist.new_group(backend="gloo", timeout=t) if cuda else None
    try:
        store = dist.distributed_c10d._get_default_store()
    except Exception:  # a torch without it: lost ranks are named by gloo alone
        store = None
    return TorchrunWorld(
        store=store,
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


# --- planning the groups of a multi-rank sweep ------------------------------------------------


def plan_groups(cfg: config_mod.Config, spec: config_mod.RanksSpec, size: int,
                table: list[dict[str, Any]]) -> tuple[list[Group], dict[str, list], list[str]]:  # fmt: skip
    """The groups to run, every active rank's (target indices, subfolder) per group, and the
    groups skipped (with why)."""
    skipped = []
    active = spec.active or [size]
    for k in active:
        if k > size:
            skipped.append(f"ranks.active {k}: the job has only {size} ranks")
    active = [k for k in active if k <= size]
    groups, layout = [], {}
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


def _layout(g: Group, spec: config_mod.RanksSpec,
            table: list[dict[str, Any]]) -> list[tuple[list[int], bool]]:  # fmt: skip
    """Every active rank's targets: the mapping applies among the active ranks of a node (each
    node writes its own local targets)."""
    out = []
    for r in range(g.k):
        node = table[r]["node_rank"]
        peers = [q for q in range(g.k) if table[q]["node_rank"] == node]
        out.append(assign(g.n, g.mapping, len(peers), peers.index(r), spec.ranks_per_target,
                          spec.dedicated_subfolders))  # fmt: skip
    return out


def same_config(cfg: config_mod.Config, w: TorchrunWorld) -> None:
    """Every rank must run the same sweep (targets may differ: each node its own disks)."""
    d = config_mod.resolved(cfg)
    for k in ("targets", "target_caps", "scratch"):
        d.pop(k, None)
    mine = json.dumps(d, sort_keys=True, default=str)
    theirs = w.all_gather(mine, "the config check")
    for r, t in enumerate(theirs):
        if t != mine:
            raise UserError(
                f"rank {r} runs another config than rank {w.rank} (give every node the same "
                "config and --set; only targets and scratch may differ)"
            )


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


def build_shard(sweep: Any, wl: Any, g: Group) -> Any:
    """This rank's shard of workload `wl` in group g, on its device."""
    w, cfg = sweep.world, sweep.cfg
    item = DTYPES[cfg.dtype]
    size = shard_bytes(wl.total_bytes, g.k, w.rank, item, sweep.spec.shard)
    if size == 0:
        raise UserError(
            f"{wl.id}: {sizes.format_size(wl.total_bytes)} split over {g.k} ranks leaves rank "
            f"{w.rank} nothing to save"
        )
    return wl.build(cfg, sweep.device.torch_device, size, seed=w.rank)


def ranks_block(sweep: Any, nodes: list[Any], paths: list[dict[str, list[str]]]) -> dict[str, Any]:
    """env.json `ranks`: who ran where, and which targets each rank wrote (`paths`: every
    rank's own directories per group, as it resolved them on its node)."""
    spec, table = sweep.spec, sweep.table
    layout = {}
    for g in sweep.groups:
        per_rank = {str(r): p[g.key] for r, p in enumerate(paths) if g.key in p}
        layout[g.key] = {"n_targets": g.n, "mapping": g.mapping, "target_map": g.label,
                         "ranks_active": g.k, "targets": per_rank}  # fmt: skip
    if any(len({t["host"] for t in table if t["node_rank"] == n}) > 1
           for n in {t["node_rank"] for t in table}):  # fmt: skip
        sweep.core.note("one node rank on several hosts: check the torchrun --node-rank")
    return {
        "world_size": sweep.world.size,
        "nproc_config": spec.nproc,
        "backend": "cpu:gloo,cuda:nccl" if sweep.device.is_cuda else "gloo",
        "timeout_s": spec.timeout_s,
        "shard": spec.shard,
        "mapping": list(spec.mapping),
        "active": sorted({g.k for g in sweep.groups}),
        "table": table,
        "nodes": {
            str(table[r]["node_rank"]): {"host": table[r]["host"], **n}
            for r, n in enumerate(nodes)
            if n
        },  # fmt: skip
        "layout": layout,
        "skipped": sweep.skipped_groups,
        "paths_note": "targets are node-local paths: each node writes its own disks; "
        "with one active rank a case runs once, under the first mapping",
    }


def write_lost(sweep: Any, row: dict[str, Any] | None, lost: RankLost, g: Group, wl: Any,
               engine: str, key: tuple[str, bool, int]) -> None:  # fmt: skip
    """Rank 0: the rows of a repetition a rank was lost in (its own and the aggregate), at
    once and durably, before torchrun ends the job."""
    why = str(lost)
    case_id, warm, rep = key
    out = []
    if row is not None:
        row["error"] = row["error"] or why
        out.append(row)
    # The aggregate names the case; its measurements are unknown (a rank never reported).
    agg: dict[str, Any] = {c: None for c in results.COLUMNS}
    agg.update(run_id=sweep.core.run_id, case_id=case_id, engine=engine,
               device=sweep.device.kind, emulated=sweep.device.emulated, gds_mode="none",
               workload=wl.id, total_bytes=0, tensor_bytes=wl.tensor_bytes, n_tensors=0,
               n_targets=g.n, targets_used=0, rep=rep, warmup=warm, checksums=False,
               staging_grew=False, copied_tensors=0, cache_dropped=sweep.cache_dropped,
               dtype=sweep.cfg.dtype, options="{}", capped=False, verified=False, error=why,
               rank=-1, world_size=sweep.world.size, node="", node_rank=-1, aggregate=True,
               ranks_active=g.k, target_map=g.label)  # fmt: skip
    out.append(agg)
    sweep.core.write(out)
    sweep.core.close()


def faults() -> dict[tuple[int, int], str]:
    """(rank, save index) -> kind from $CKPTBENCH_INJECT_FAULT (fault injection for tests)."""
    text = os.environ.get(FAULT_ENV, "").strip()
    out = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        m = re.fullmatch(r"(error|kill)@(\d+):(\d+)", item)
        if not m:
            raise UserError(f"${FAULT_ENV}: {item!r} is not KIND@RANK:SAVE (KIND error or kill)")
        out[(int(m.group(2)), int(m.group(3)))] = m.group(1)
    return out


def inject(kind: str, rank: int, save: int) -> Any:
    """The fault to inject into a save, as an after-save hook (tests only)."""
    if kind == "error":
        raise RuntimeError(f"injected fault: rank {rank} fails save {save}")

    def kill() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    return kill


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


def _device_for_rank(requested: str) -> Any:
    """One GPU per rank (cuda:LOCAL_RANK) when the run uses CUDA, else host-emulated."""
    import torch

    if requested != "host-emulated" and torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if local >= torch.cuda.device_count():
            raise UserError(
                f"local rank {local} but {torch.cuda.device_count()} GPU(s) on "
                f"{socket.gethostname()}: one GPU per rank (use --nproc-per-node <= GPUs)"
            )
        torch.cuda.set_device(local)
    from bench import devices

    return devices.detect(requested)


def worker_main(args: Any) -> int:
    """One rank of a torchrun job: run the sweep; rank 0 prints the summary. Exit codes as
    `ckptbench run`: 0, 1 (failed rows or a lost rank), 2 (a user error), 130 (interrupted)."""
    from bench.sweep import Sweep, summary_lines

    rank = int(os.environ["RANK"])
    signal.signal(signal.SIGTERM, lambda *_: _STOP.set())
    code = 2
    r: Sweep | None = None
    try:
        cfg = config_mod.load(args.config, args.set)
        spec = cfg.ranks or config_mod.RanksSpec()
        device = _device_for_rank(cfg.device)
        world = init_world(spec.timeout_s, device.is_cuda)
        r = Sweep(cfg, device, args.output, world=world, ranked=True, quiet=args.quiet,
                  resume=args.resume)  # fmt: skip
        run_dir = r.run()
        code = 1 if r.failures else 0
        if rank == 0:
            head = (f"\nrun {r.run_id} ({device.kind}{', emulated' if device.emulated else ''}), "
                    f"{world.size} ranks; aggregate rows (stall: the slowest rank; GB/s: all "
                    "ranks' bytes / the slowest rank's total_s)")  # fmt: skip
            print("\n".join([head, *summary_lines(run_dir, r.notes)]))
            if r.failures:
                print(f"{r.failures} case(s) failed or did not verify", file=sys.stderr)
        import torch.distributed as dist

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
