"""The `ckptbench` command: `run CONFIG`, `engines`, `clean TARGET...`, `report`, `model`, `compare`.

`tune [CONFIG]` searches each engine's knobs for the targets and writes a profile that
`run --tuned PROFILE` applies (bench/run/tune/).

`train CONFIG` checkpoints a real training loop through each engine (bench/run/training/).

`report RUN_DIR`, `model PROFILE` and `compare RUN_A RUN_B` read results files (analysis/).

Errors a user can cause print one line and exit with code 2; a run with any row that failed to
verify exits with code 1.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, NoReturn

from bench.common import cudasync
from bench.common.errors import UserError

if TYPE_CHECKING:
    from bench.run.sweep import Sweep


def _cmd_run(args: argparse.Namespace) -> int:
    from bench.common import devices
    from bench.config import sweep as config
    from bench.run import launch  # keep `--help` fast

    if args.tuned and args.nproc:
        raise UserError("--tuned: a tuned profile applies to one-process runs; drop --nproc")
    code = launch.cli_run(args)  # --nproc, a `ranks:` section, or a rank under torchrun
    if code is not None:
        return code
    from bench.run.sweep import Sweep, summary_lines

    cfg = config.load(args.config, args.set)
    tuned = None
    if args.tuned:
        import socket

        from bench.run.tune import profile

        sets, tuned = profile.apply(args.tuned, cfg, socket.gethostname())
        cfg = config.load(args.config, sets + args.set)  # an explicit --set still wins
    r = Sweep(
        cfg,
        devices.detect(cfg.device),
        args.output,
        quiet=args.quiet,
        resume=args.resume,
        preflight_only=args.preflight,
        tuned=tuned,
    )
    if args.preflight:
        return _preflight_table(r)
    try:
        run_dir = r.run()
    except KeyboardInterrupt:
        if r.run_dir is None:
            raise
        print(
            f"ckptbench: interrupted; the rows recorded so far are in {r.run_dir}/results.csv "
            f"and the current case's files were removed. Continue with: "
            f"ckptbench run {args.config} --resume {r.run_dir}"
            + "".join(f" --set {a}" for a in args.set),
            file=sys.stderr,
        )
        return 130
    print(f"\nrun {r.run_id} ({r.device.kind}{', emulated' if r.device.emulated else ''})")
    if cfg.synthetic_cases()[1]:
        skipped = ", ".join(f"{t}B/{s}B" for t, s in cfg.synthetic_cases()[1])
        print(f"skipped (tensor larger than total): {skipped}")
    for line in summary_lines(run_dir, r.notes):
        print(line)
    code = 0
    if r.failures:
        print(f"{r.failures} row(s) failed or did not verify", file=sys.stderr)
        code = 1
    if args.report:
        from analysis.report.build import after_run

        code = max(code, after_run(run_dir))
    return code


def _cmd_tune(args: argparse.Namespace) -> int:
    import time

    started = time.monotonic()  # the budget counts the imports and the plan too
    from bench.config import sweep as config
    from bench.run.tune import Tuner, parse_budget, profile

    budget = parse_budget(args.budget)
    sets = list(args.set)
    if args.targets:
        counts = config.load(args.config, sets).ssd_counts
        fit = [c for c in counts if c <= len(args.targets)] or [len(args.targets)]
        sets += [f"targets=[{', '.join(args.targets)}]", f"ssd_counts={fit}"]
    t = Tuner(args.config, sets, budget, args.output, started=started)
    try:
        d = t.run()
    except KeyboardInterrupt:
        done = ", ".join(f"{r['engine']} x{r['ssd_count']}" for r in t.done) or "none"
        last = ""
        if t.tried:
            e, n, tr = t.tried[-1]
            last = f"; the last: {e} x{n} " + " ".join(f"{k}={v}" for k, v in tr.setting.items())
        print(
            f"ckptbench: tune interrupted, no profile written; {len(t.tried)} trial(s) run "
            f"(raw rows under {args.output}/), searches finished: {done}{last}",
            file=sys.stderr,
        )
        return 130
    profile.write(d, args.profile)
    print(
        f"tune: {d['took_s']:.1f}s of a {budget:g}s budget; profile {args.profile} "
        f"(apply it with: ckptbench run {args.config} --tuned {args.profile})"
    )
    return 0


def _preflight_table(r: Sweep) -> int:
    """`run --preflight`: every case's verdict (bench.run.preflight), nothing run; exit 2 if no
    case fits."""
    from analysis.tables import text_table
    from bench.common import sizes

    r.run()
    block = r.preflight_block
    rows = [
        [
            case,
            v["restore"] or "refused",
            sizes.format_size(v["host_peak_bytes"]) if v["restore"] else "",
        ]
        for case, v in block["cases"].items()
    ]
    print(
        f"host memory available {sizes.format_size(block['host_available_bytes'])} "
        f"({sizes.format_size(block['headroom_bytes'])} of it kept as headroom)"
        + (
            f", GPU free {sizes.format_size(block['gpu_free_bytes'])}"
            if block["gpu_free_bytes"] is not None
            else ""
        )
    )
    print(text_table(["case", "restore", "host peak"], rows))
    refused = [v["refused"] for v in block["cases"].values() if v["restore"] is None]
    for why in refused:
        print(f"refused: {why}")
    return 2 if refused and len(refused) == len(rows) else 0


def _cmd_train(args: argparse.Namespace) -> int:
    from analysis import training as tstats
    from analysis.tables import text_table
    from bench.config import training
    from bench.run.training.loop import TrainingRun

    cfg = training.load(args.config, args.set)
    t = TrainingRun(cfg, args.output, quiet=args.quiet)
    run_dir = t.run()
    tr = tstats.load(run_dir)
    print(
        f"\ntraining run {t.run_id} ({t.device.kind}{', emulated' if t.device.emulated else ''}"
        f"), {cfg.steps} steps per engine, a checkpoint every {cfg.checkpoint_every}"
    )
    table = tstats.summary(tr)
    print(text_table(*tstats.summary_rows(table)))
    for note in t.notes + tstats.notes(tr) + tstats.drift_notes(table):
        print(f"note: {note}")
    print(
        f"results: {run_dir}/training_steps.csv, training_checkpoints.csv, env.json; "
        f"figure: ckptbench report {run_dir}"
    )
    if t.failures:
        print(f"{len(t.failures)} engine(s) failed or did not verify", file=sys.stderr)
        return 1
    return 0


def _cmd_engines(args: argparse.Namespace) -> int:
    from bench.common import devices
    from bench.engines import REGISTRY
    from bench.engines.gds import kvikio_unavailable

    dev = devices.detect("auto")
    print(f"device: {dev.kind}")
    for name, cls in REGISTRY.items():
        reason = cls.unavailable()
        line = f"{name:11s} {'available' if reason is None else 'unavailable: ' + reason}"
        if name == "gds" and reason is None:
            why = kvikio_unavailable()
            line += " (kvikio)" if why is None else f" (host emulation, gds_mode=emulated: {why})"
        print(line)
        # An engine with several backends says each one (nixl: POSIX io_uring and AIO, GDS...)
        for variant, why in getattr(cls, "variants", dict)().items():
            print(f"  {variant:14s} {'available' if why is None else 'unavailable: ' + why}")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument in one line (exit code 2), like every other error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _cmd_clean(args: argparse.Namespace) -> int:
    from bench.engines.base import check_targets
    from bench.storage.generations import leftovers, remove_files

    targets = check_targets("clean", args.targets)
    names = args.name or sorted(
        {d for t in targets for d in os.listdir(t) if os.path.isdir(os.path.join(t, d))}
    )
    removed = []
    for n in names:
        found = leftovers(targets, n)
        if not args.dry_run:
            remove_files(found)
        removed += found
    verb = "would remove" if args.dry_run else "removed"
    for p in removed:
        print(f"{verb} {p}")
    print(f"{len(removed)} leftover file(s) of interrupted saves {verb}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from analysis.report.build import build_and_say  # matplotlib only when asked for

    return build_and_say(args.run_dir, args.output, figures_only=args.figures_only)


def _cmd_model(args: argparse.Namespace) -> int:
    from analysis import runs
    from analysis.model.calibrate import from_run
    from analysis.model.planning import measured_restores
    from analysis.model.profiles import (
        THIS_MACHINE,
        is_filled_from_run,
        load_profile,
        with_size,
        with_ssds,
    )
    from analysis.model.render import feasibility_text, plan_json, plan_text
    from bench.common.sizes import parse_size

    if args.validate is not None:
        return _model_validate(args)
    if args.profile is None:
        raise UserError("model: give a PROFILE (e.g. dgx-h100-gen4), or --validate")
    restores = None  # each path's measured restore of the run's checkpoint, for --mtbf
    if args.from_run:
        if not is_filled_from_run(args.profile):
            raise UserError(f"--from-run fills the {THIS_MACHINE} profile, not {args.profile!r}")
        run = runs.load(args.from_run)
        prof = from_run(run)
        if args.size is None and args.ssds is None:  # measured as the profile predicts
            restores = measured_restores(run)
    else:
        prof = load_profile(args.profile)
    if args.size is not None:
        prof = with_size(prof, parse_size(args.size, "--size"))
    if args.ssds is not None:
        if args.ssds < 1:
            raise UserError(f"--ssds: must be at least 1, got {args.ssds}")
        prof = with_ssds(prof, args.ssds)
    if args.mtbf is not None:
        if not args.mtbf > 0:
            raise UserError(f"--mtbf: must be a positive number of hours, got {args.mtbf:g}")
        if args.restart < 0:
            raise UserError(f"--restart: must be 0 or more seconds, got {args.restart:g}")
        if args.json:
            import json

            print(json.dumps(plan_json(prof, args.mtbf, args.restart, restores), indent=2))
            return 0
    if args.json:
        raise UserError("--json: prints the checkpoint plan; give --mtbf HOURS too")
    print(feasibility_text(prof))
    if args.mtbf is not None:
        print()
        print(plan_text(prof, args.mtbf, args.restart, restores))
    return 0


def _model_validate(args: argparse.Namespace) -> int:
    """`model --validate [FILE]`: the model against published measurements (--json: as JSON)."""
    from pathlib import Path

    from analysis.model import published

    if args.profile is not None or args.from_run or args.mtbf is not None:
        raise UserError("--validate: takes no PROFILE, --from-run or --mtbf")
    v = published.validate(Path(args.validate) if args.validate else published.PUBLISHED)
    if args.json:
        import json

        print(json.dumps(published.to_json(v), indent=2))
    else:
        print(published.text(v))
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from analysis import compare

    c = compare.compare(args.runs, args.metric, force=args.force)
    print(compare.text(c))
    if c.forced and c.refusals:
        print(
            "WARNING: runs are not comparable (see above); compared because of --force",
            file=sys.stderr,
        )
    paths = compare.write(c, args.output or compare.default_outdir(c))
    print(f"wrote {', '.join(os.path.relpath(p) for p in paths)}")
    return 0


def _analysis_parsers(sub: argparse._SubParsersAction) -> None:
    """`report`, `model` and `compare`: they read results files only (analysis/)."""
    rp = sub.add_parser("report", help="figures, summary and report.md of a run")
    rp.add_argument("run_dir", help="a run directory, results/<run-id>")
    rp.add_argument("-o", "--output", help="where to write (default: RUN_DIR/report)")
    rp.add_argument("--figures-only", action="store_true", help="only the figures (make plots)")
    rp.set_defaults(fn=_cmd_report)
    mp = sub.add_parser("model", help="the analytical model's feasibility table for a profile")
    mp.add_argument(
        "profile",
        nargs="?",
        help="configs/hardware/<name>.yaml by name (e.g. dgx-h100-gen4) "
        "or a .yaml path; this-machine needs --from-run",
    )
    mp.add_argument(
        "--validate",
        nargs="?",
        const="",
        metavar="FILE",
        help="the model against published GPU-server measurements (default "
        "configs/published.yaml): measured, predicted and the error of each",
    )
    mp.add_argument("--ssds", type=int, help="SSDs per GPU (default: the profile's)")
    mp.add_argument("--size", help="checkpoint size of one GPU, e.g. 80GB (default: the profile's)")
    mp.add_argument("--from-run", metavar="RUN_DIR", help="calibrate this-machine from a run")
    mp.add_argument(
        "--mtbf",
        type=float,
        metavar="HOURS",
        help="mean time between failures: the checkpoint interval that minimises "
        "lost time per engine (Young/Daly), and the fraction lost",
    )
    mp.add_argument(
        "--restart",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="time to relaunch after a failure, for --mtbf (default 0); reading the "
        "checkpoint back is added per path: its restore as measured (--from-run), else the "
        "model's",
    )
    mp.add_argument(
        "--json",
        action="store_true",
        help="with --mtbf: the plan as JSON; with --validate: the table",
    )
    mp.set_defaults(fn=_cmd_model)
    cp = sub.add_parser("compare", help="compare runs (e.g. two storage devices) case by case")
    cp.add_argument("runs", nargs="+", metavar="RUN_DIR", help="RUN_A RUN_B [...]: each vs A")
    cp.add_argument(
        "--metric",
        default="write",
        choices=["write", "stall", "durable", "restore"],
        help="what to compare (default: write GB/s)",
    )
    cp.add_argument(
        "--force",
        action="store_true",
        help="compare even when the essential environment differs (warns loudly)",
    )
    cp.add_argument(
        "-o", "--output", help="where to write (default: LAST_RUN/report/compare-vs-<A's run id>)"
    )
    cp.set_defaults(fn=_cmd_compare)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="ckptbench", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    r = sub.add_parser("run", help="run a sweep config, write results/<run-id>/")
    r.add_argument("config", help="YAML sweep config, e.g. configs/default.yaml")
    r.add_argument("-o", "--output", default="results", help="results root (default: results)")
    r.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set repetitions=5 "
        "--set engine_options.cpu-single.chunk_bytes=32MiB",
    )
    r.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    r.add_argument(
        "--preflight",
        action="store_true",
        help="only say what every case would hold at its peak and whether it fits; run nothing",
    )
    r.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue an interrupted run: skip the rows it recorded "
        "(refused if the config changed)",
    )
    r.add_argument(
        "--report",
        action="store_true",
        help="then build the report of the run it made, as `ckptbench report RUN_DIR` does",
    )
    r.add_argument(
        "--nproc",
        type=int,
        metavar="N",
        help="run N ranks through torchrun (one GPU each on CUDA), each saving its "
        "shard; same as --set ranks.nproc=N",
    )
    r.add_argument(
        "--tuned",
        metavar="PROFILE",
        help="apply the knobs of a `ckptbench tune` profile (refused if the host, or a target's "
        "file system or device, differs from the profile's)",
    )
    r.set_defaults(fn=_cmd_run)
    tu = sub.add_parser("tune", help="find each engine's best knobs for the targets, in a budget")
    tu.add_argument("config", nargs="?", default="configs/default.yaml", help="YAML sweep config")
    tu.add_argument("--targets", nargs="+", metavar="PATH", help="instead of the config's")
    tu.add_argument("--budget", default="60s", help="wall time of the whole tune (default 60s)")
    tu.add_argument(
        "-o",
        "--profile",
        default="results/tuned.yaml",
        help="the profile to write (default results/tuned.yaml)",
    )
    tu.add_argument("--output", default="results", help="trials' results root (default: results)")
    tu.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="as for run")
    tu.set_defaults(fn=_cmd_tune)
    t = sub.add_parser("train", help="checkpoint a real training loop through each engine")
    t.add_argument("config", help="YAML training config, e.g. configs/training.yaml")
    t.add_argument("-o", "--output", default="results", help="results root (default: results)")
    t.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set steps=30 --set model.n_layers=2",
    )
    t.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    t.set_defaults(fn=_cmd_train)
    e = sub.add_parser("engines", help="list engines and whether each can run here")
    e.set_defaults(fn=_cmd_engines)
    c = sub.add_parser("clean", help="remove leftovers of interrupted saves from targets")
    c.add_argument("targets", nargs="+", help="the engine's targets, in the order it uses them")
    c.add_argument("--name", action="append", help="only this checkpoint (repeatable)")
    c.add_argument("-n", "--dry-run", action="store_true", help="list, do not remove")
    c.set_defaults(fn=_cmd_clean)
    _analysis_parsers(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    # Before anything makes a CUDA context: waits for the GPU sleep rather than spin, so that
    # what a save costs the host's CPUs is its work (bench.common.cudasync).
    cudasync.blocking_sync()
    try:
        return args.fn(args)
    except UserError as e:
        print(f"ckptbench: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ckptbench: interrupted; rows written so far are kept", file=sys.stderr)
        return 130
