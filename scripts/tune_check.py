"""`make tune-check`: does a tuned profile hold up against an exhaustive sweep of the same grid?

    .venv/bin/python scripts/tune_check.py configs/default.yaml results/tuned.yaml
    .venv/bin/python scripts/tune_check.py CONFIG PROFILE --reps 3 --engines dcp cpu-single

For every engine and SSD count of the profile, every setting of the engine's grid (the config's
`tune:` ranges, else the declared ones) runs `--reps` times as the tune's trials run (one durable
save each, bench.run.tune.trials), the settings taking turns, each round in reverse of the last.
The tuned setting's median over the best setting's median must be at least 0.95. Slow (the whole
grid, several times), so not in `make test`. Exit 1 when a search misses the goal.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from bench.common import devices
from bench.config import sweep as config_mod
from bench.engines.registry import knob_grid
from bench.run.tune import profile
from bench.run.tune.trials import Trials

GOAL = 0.95


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("config")
    p.add_argument("profile")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--engines", nargs="*", help="only these (default: every engine tuned)")
    p.add_argument("--output", default="results", help="the trials' results root")
    a = p.parse_args()
    prof = profile.load(a.profile)
    cfg = config_mod.load(a.config, prof.overrides)
    runner = Trials(
        a.config,
        prof.overrides,
        a.output,
        devices.detect(cfg.device),
        prof.total_bytes,
        prof.tensor_bytes,
    )
    print("| engine | SSDs | tuned | exhaustive best | tuned / best | settings | took s |")
    print("|---|---|---|---|---|---|---|")
    missed = 0
    for r in prof.results:
        if r.best is None or (a.engines and r.engine not in a.engines):
            continue
        grid = knob_grid(r.engine, cfg.tune.get(r.engine), cfg.engine_options.get(r.engine))
        if r.best not in grid:
            grid.append(dict(r.best))
        t0 = time.monotonic()
        got: dict[int, list[float]] = {i: [] for i in range(len(grid))}
        for rep in range(a.reps):
            order = range(len(grid)) if rep % 2 == 0 else reversed(range(len(grid)))
            for i in order:
                t = runner.run(r.engine, r.ssd_count, grid[i], rep)
                if not t.error:
                    got[i].append(t.gbps)
        med = {i: statistics.median(v) for i, v in got.items() if v}
        top = max(med, key=lambda i: med[i])
        tuned = med.get(grid.index(r.best), 0.0)
        ratio = tuned / med[top] if med[top] else 0.0
        missed += ratio < GOAL
        print(
            f"| {r.engine} | {r.ssd_count} | {profile_label(r.best)} {tuned:.2f} GB/s | "
            f"{profile_label(grid[top])} {med[top]:.2f} GB/s | {ratio:.2f} | {len(grid)} | "
            f"{time.monotonic() - t0:.0f} |",
            flush=True,
        )
    return 1 if missed else 0


def profile_label(s: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in s.items())


if __name__ == "__main__":
    sys.exit(main())
