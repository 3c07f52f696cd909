"""Launching a multi-rank run: `ckptbench run --nproc N` (or a config with `ranks:`) re-executes
itself through torchrun, and each rank torchrun starts runs the sweep (bench.run.sweep) as one rank
of the job; rank 0 leaves its exit code for the launcher."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
from typing import TYPE_CHECKING

from bench.common import log
from bench.common.errors import UserError
from bench.config import sweep as config_mod
from bench.run.distributed.world import _STOP, RankLost, init_world

if TYPE_CHECKING:
    from bench.common.devices import Device

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
RC_FILE_ENV = "CKPTBENCH_RC_FILE"  # where rank 0 leaves its exit code for `ckptbench run --nproc`


def launched() -> bool:
    """Whether this process is a rank that torchrun started (it sets RANK, WORLD_SIZE, ...)."""
    return all(k in os.environ for k in TORCHRUN_ENV)


# --- launching ---------------------------------------------------------------------------------


def torchrun_command(nproc: int, argv: list[str]) -> list[str]:
    """`python -m torch.distributed.run --standalone --nproc-per-node N -m bench ARGV...`."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "bench",
        *argv,
    ]


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


def run_argv(args: argparse.Namespace) -> list[str]:
    """The `ckptbench run` arguments each rank gets (everything but --nproc)."""
    argv = ["run", args.config, "-o", args.output]
    for a in args.set:
        argv += ["--set", a]
    if args.quiet:
        argv.append("-q")
    if args.resume:
        argv += ["--resume", args.resume]
    if getattr(args, "report", False):
        argv.append("--report")
    return argv


def cli_run(args: argparse.Namespace) -> int | None:
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
    if cfg.mlperf is not None:  # this host's share of MLPerf's ranks, before they start
        from bench.run.mlperf import host_check

        if cfg.mlperf.hosts > 1:
            raise UserError(
                f"mlperf.hosts: {cfg.mlperf.hosts} hosts: start one torchrun agent on each host "
                "(docs/multi-rank.md; two hosts on one machine: scripts/hosts.py); "
                "`ckptbench run` starts the ranks of one host"
            )
        host_check(cfg)
    if getattr(args, "preflight", False):
        # each rank judges its own shard before its first case; a table of them all would need
        # the ranks launched, and launching them is what --preflight promises not to do
        raise UserError(
            f"--preflight: {args.config} runs {cfg.ranks.nproc} ranks (ranks.nproc), and "
            "--preflight does not judge a run with ranks yet (it would have to launch them); "
            "each rank still refuses, before its first case, a case that does not fit"
        )
    return launch(cfg.ranks.nproc, run_argv(args))


# --- one rank's `ckptbench run` -----------------------------------------------------------------


def _exit_code(rank: int, code: int) -> None:
    """Rank 0 leaves its exit code for the `ckptbench run --nproc` that launched torchrun."""
    path = os.environ.get(RC_FILE_ENV)
    if int(os.environ.get("LOCAL_RANK", rank)) == 0 and path:
        try:
            with open(path, "w") as f:
                f.write(str(code))
        except OSError:
            pass


def _device_for_rank(requested: str) -> Device:
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
    from bench.common import devices

    return devices.detect(requested)


def worker_main(args: argparse.Namespace) -> int:
    """One rank of a torchrun job: run the sweep; rank 0 prints the summary. Exit codes as
    `ckptbench run`: 0, 1 (failed rows or a lost rank), 2 (a user error), 130 (interrupted)."""
    from bench.run.sweep import Sweep, summary_lines

    rank = int(os.environ["RANK"])
    signal.signal(signal.SIGTERM, lambda *_: _STOP.set())
    code = 2
    r: Sweep | None = None
    try:
        cfg = config_mod.load(args.config, args.set)
        spec = cfg.ranks or config_mod.RanksSpec()
        device = _device_for_rank(cfg.device)
        world = init_world(spec.timeout_s, device.is_cuda)
        r = Sweep(
            cfg, device, args.output, world=world, ranked=True, quiet=args.quiet, resume=args.resume
        )
        run_dir = r.run()
        code = 1 if r.failures else 0
        if rank == 0:
            head = (
                f"\nrun {r.run_id} ({device.kind}{', emulated' if device.emulated else ''}), "
                f"{world.size} ranks; aggregate rows (stall: the slowest rank; GB/s: all "
                "ranks' bytes / the slowest rank's total_s)"
            )
            print("\n".join([head, *summary_lines(run_dir, r.notes)]))
            if r.failures:
                print(f"{r.failures} case(s) failed or did not verify", file=sys.stderr)
        import torch.distributed as dist

        dist.destroy_process_group()
        if rank == 0 and getattr(args, "report", False):
            from analysis.report.build import after_run

            code = max(code, after_run(run_dir))
    except UserError as e:
        if int(os.environ.get("LOCAL_RANK", rank)) == 0:  # said on every node
            print(f"ckptbench: error: {e}", file=sys.stderr)
        code = 2
        _exit_code(rank, code)
        sys.stderr.flush()
        os._exit(code)  # the process group may be half-built: do not wait on it at exit
    except RankLost as e:
        where = f" results so far are in {r.run_dir}." if r is not None and r.run_dir else ""
        log.for_rank(rank).error(f"error: {e}.{where}")
        code = 1
        _exit_code(rank, code)
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(code)
    except KeyboardInterrupt:
        if rank == 0 and r is not None and r.run_dir:
            print(
                f"ckptbench: interrupted; the rows recorded so far are in {r.run_dir}/"
                f"results.csv. Continue with: ckptbench run {args.config} --resume "
                f"{r.run_dir} --nproc {r.world.size}",
                file=sys.stderr,
            )
        code = 130
        _exit_code(rank, code)
        sys.stderr.flush()
        os._exit(code)
    _exit_code(rank, code)
    # The results are written and closed: end here, as the error paths do, rather than in the
    # interpreter's teardown, where a library thread still joinable (seen once on one of 8
    # ranks, after a finished run: "terminate called without an active exception") aborts the
    # rank and torchrun calls the job failed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
