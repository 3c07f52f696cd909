"""The `ckptbench` command: `run CONFIG`, `engines`.

Errors a user can cause print one line and exit with code 2; a run with any row that failed to
verify exits with code 1.
"""

from __future__ import annotations

import argparse
import sys

from bench.errors import UserError


def _cmd_run(args: argparse.Namespace) -> int:
    from bench import config, runner  # noqa: PLC0415 - keep `--help` fast

    cfg = config.load(args.config, args.set)
    r = runner.Runner(cfg, args.output, quiet=args.quiet)
    run_dir = r.run()
    table = runner.summary(run_dir)
    print(f"\nrun {r.run_id} ({r.device.kind}{', emulated' if r.device.emulated else ''})")
    if cfg.synthetic_cases()[1]:
        skipped = ", ".join(f"{t}B/{s}B" for t, s in cfg.synthetic_cases()[1])
        print(f"skipped (tensor larger than total): {skipped}")
    if not table.empty:
        print(table.to_string())
    for note in r.notes + runner.mode_notes(run_dir):
        print(f"note: {note}")
    print(f"results: {run_dir}/results.csv, environment: {run_dir}/env.json")
    if r.failures:
        print(f"{r.failures} row(s) failed or did not verify", file=sys.stderr)
        return 1
    return 0


def _cmd_engines(args: argparse.Namespace) -> int:
    from bench import devices  # noqa: PLC0415
    from bench.engines import REGISTRY  # noqa: PLC0415
    from bench.engines.gds import kvikio_unavailable  # noqa: PLC0415

    dev = devices.detect("auto")
    print(f"device: {dev.kind}")
    for name, cls in REGISTRY.items():
        reason = cls.unavailable()
        line = f"{name:11s} {'available' if reason is None else 'unavailable: ' + reason}"
        if name == "gds" and reason is None:
            why = kvikio_unavailable()
            line += " (kvikio)" if why is None else f" (host emulation, gds_mode=emulated: {why})"
        print(line)
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ckptbench", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run a sweep config, write results/<run-id>/")
    r.add_argument("config", help="YAML sweep config, e.g. configs/default.yaml")
    r.add_argument("-o", "--output", default="results", help="results root (default: results)")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set repetitions=5 "
                   "--set engine_options.cpu-single.chunk_bytes=32MiB")  # fmt: skip
    r.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    r.set_defaults(fn=_cmd_run)
    e = sub.add_parser("engines", help="list engines and whether each can run here")
    e.set_defaults(fn=_cmd_engines)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.fn(args)
    except UserError as e:
        print(f"ckptbench: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ckptbench: interrupted; rows written so far are kept", file=sys.stderr)
        return 130
