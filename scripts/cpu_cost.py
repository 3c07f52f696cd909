"""Write the CPU-seconds per GB durable that the model charges every server profile's host
(configs/hardware/cpu-cost/reference.yaml) from a run's rows: per engine the median over its
timed repetitions of host_cpu_s (the whole host, other processes and the idle baseline taken
away) per GB, and of its persist phase; the process figure where the run has no host one.

    .venv/bin/python scripts/cpu_cost.py results/<run-id> [--note TEXT] > configs/hardware/cpu-cost/reference.yaml
"""

from __future__ import annotations

import argparse
import math
import sys

import yaml

from analysis import cost, runs
from bench.common.errors import UserError


def document(run_dir: str, note: str) -> str:
    run = runs.load(run_dir)
    per = cost.cpu_cost(run)
    if not per:
        raise UserError(f"{run_dir}: no engine has CPU time in its rows")
    whats = sorted({w for _, _, w in per.values()})
    cpu = run.env.get("cpu", {})
    source = (
        f"ckptbench run {run.run_id} on {run.env.get('host', '?')} ({cpu.get('model', '?')}, "
        f"{cpu.get('logical_cores', '?')} logical CPUs, {run.env.get('kernel', '?')}; device "
        f"{run.env.get('device', {}).get('kind', '?')}): median over every timed repetition of "
        + " and ".join(
            "host_cpu_s (whole host, others and the baseline taken away)"
            if w == "host"
            else "cpu_user_s + cpu_sys_s (the process)"
            for w in whats
        )
        + " per GB durable"
        + (
            "; host-emulated, so a snapshot is a CPU copy here where a GPU does a DMA"
            if run.emulated
            else ""
        )
        + (f"; {note}" if note else "")
    )
    engines = {
        e: {"total": round(t, 4), **({} if math.isnan(p) else {"persist": round(p, 4)})}
        for e, (t, p, _) in per.items()
    }
    head = (
        "# CPU-seconds per GB made durable, per engine: what `ckptbench model PROFILE` charges\n"
        "# every server profile's host for a checkpoint (host_cores = this x the SSDs' GB/s).\n"
        "# Written by scripts/cpu_cost.py from a run; rerun it on a quiet machine to refresh.\n"
    )
    body = {"kind": "measured", "source": source, "engines": engines}
    return head + yaml.safe_dump(body, sort_keys=False, width=100)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir")
    ap.add_argument("--note", default="", help="added to the source, e.g. 'busy machine'")
    args = ap.parse_args(argv)
    try:
        sys.stdout.write(document(args.run_dir, args.note))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
