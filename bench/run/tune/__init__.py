"""`ckptbench tune`: each engine's best knobs for the config's targets, within a time budget.

For each SSD count of the config and each engine that runs here and has knobs (its options
model's TUNABLE, or the config's `tune:` ranges), a successive-halving search over its grid
(bench.run.tune.search), each trial a real durable save (bench.run.tune.trials). The budget is
the whole tune's wall time: each search gets an equal share of what is left when it starts, and
a trial starts only if the slowest one so far still fits its share. The result is a tuned profile
(bench.run.tune.profile) that `ckptbench run --tuned` applies.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.common.errors import UserError
from bench.common.sizes import format_size
from bench.config import sweep as config_mod
from bench.engines import REGISTRY
from bench.engines.registry import knob_grid, options_model
from bench.run.tune import profile
from bench.run.tune.search import Search, Setting, Trial, halving
from bench.run.tune.trials import Trials, state_size, tensor_size

# A floor under what a trial costs: one in-process sweep of one case around the save (its
# environment block, the host's idle baseline, the restore and comparison) took 2.3-3.9 s for
# 8-64 MiB states on the loaded 2-core development VM, so a budget refused for less than two
# trials a search at 1.5 s each could not have held them.
MIN_TRIAL_S = 1.5
MIN_TRIALS = 2  # per search: the default and one other setting, or nothing is tuned


@dataclass
class Tuner:
    """One tune of a config: what it plans (`searches`), and what it has found so far."""

    config_path: str
    overrides: list[str]
    budget_s: float
    out_root: str
    say: Callable[[str], None] = print
    clock: Callable[[], float] = time.monotonic
    size: int | None = None  # the trial state's bytes (default: trials.state_size)
    trial: Callable[[str, int, Setting, int], Trial] | None = None  # default: a real save
    started: float | None = None  # when the budget began on `clock` (default: at run())
    done: list[dict[str, Any]] = field(default_factory=list)  # the searches finished
    tried: list[tuple[str, int, Trial]] = field(default_factory=list)  # every trial, in order
    skipped: dict[str, str] = field(default_factory=dict)

    def plan(self) -> tuple[config_mod.Config, list[tuple[int, str, list[Setting], Setting]]]:
        """The config and its searches: (SSD count, engine, grid, default setting) each; a budget
        too small for them refused before anything runs."""
        cfg = config_mod.load(self.config_path, self.overrides)
        searches = []
        for e in cfg.engines:
            base = cfg.engine_options.get(e, {})
            grid = knob_grid(e, cfg.tune.get(e), base)
            if len(grid) < 2:
                self.skipped[e] = "no knobs to tune"
                continue
            why = REGISTRY[e].unavailable() if self.trial is None else None
            if why:
                self.skipped[e] = f"unavailable: {why}"
                continue
            held = options_model(e)(**base)
            default = {k: getattr(held, k) for k in grid[0]}
            searches += [(n, e, grid, default) for n in cfg.ssd_counts]
        # Small grids first: the time they leave unused goes to the larger ones after them.
        searches.sort(key=lambda s: (len(s[2]), s[0]))
        if not searches:
            raise UserError(
                "engines: none to tune here ("
                + "; ".join(f"{e}: {w}" for e, w in self.skipped.items())
                + ")"
            )
        need = len(searches) * MIN_TRIALS * MIN_TRIAL_S
        if self.budget_s < need:
            raise UserError(
                f"--budget: {self.budget_s:g}s is too small: {len(searches)} searches (engines x "
                f"SSD counts) of at least {MIN_TRIALS} trials of {MIN_TRIAL_S:g}s or more need "
                f"{need:g}s; give more, or fewer engines or SSD counts"
            )
        return cfg, searches

    def run(self) -> dict[str, Any]:
        """Plan, search, and return the profile (not yet written)."""
        start = self.started if self.started is not None else self.clock()
        deadline = start + self.budget_s
        cfg, searches = self.plan()
        size = self.size or state_size(cfg)
        tensor = tensor_size(cfg, size)
        targets = cfg.resolved_targets()
        for t in targets:
            os.makedirs(t, exist_ok=True)
        trial = self.trial
        if trial is None:
            from bench.common import devices

            runner = Trials(
                self.config_path,
                self.overrides,
                self.out_root,
                devices.detect(cfg.device),
                size,
                tensor,
            )
            trial = runner.run
        self.say(
            f"tune: {len(searches)} searches ({', '.join(sorted({e for _, e, _, _ in searches}))}"
            f" x {len(cfg.ssd_counts)} SSD counts) in {self.budget_s:g}s, each trial one durable "
            f"save of {format_size(size)} in {format_size(tensor)} tensors"
        )
        for e, why in self.skipped.items():
            self.say(f"tune: {e} skipped ({why})")
        slowest = MIN_TRIAL_S
        for i, (n, e, grid, default) in enumerate(searches):
            share = (deadline - self.clock()) / (len(searches) - i)
            count = len(grid) + (default not in grid)
            self.say(f"tune: {e} on {n} target(s), {count} settings, {share:.0f}s")

            def one(s: Setting, rnd: int, e: str = e, n: int = n) -> Trial:
                got = trial(e, n, s, rnd)
                self.tried.append((e, n, got))
                return got

            def said(m: str, e: str = e, n: int = n) -> None:
                self.say(f"  {e} x{n} {m}")

            found = halving(
                grid,
                default,
                one,
                self.clock() + share,
                slowest,
                self.clock,
                said,
            )
            slowest = max([slowest, *(t.wall_s for t in found.trials)])
            self.done.append(result(n, e, found))
            best = self.done[-1]
            self.say(
                f"tune: {e} on {n}: "
                + (
                    f"{_fmt(best['best'])} {best['best_GBps']:.2f} GB/s "
                    f"(default {best['default_GBps']:.2f}), {found.stopped}"
                    if best["best"] is not None
                    else "nothing measured"
                )
            )
        took = self.clock() - start
        return profile.build(
            host=socket.gethostname(),
            config=self.config_path,
            overrides=self.overrides,
            budget_s=self.budget_s,
            took_s=took,
            total_bytes=size,
            tensor_bytes=tensor,
            targets=targets[: max(cfg.ssd_counts)],
            results=self.done,
            skipped=self.skipped,
        )


def result(n: int, engine: str, s: Search) -> dict[str, Any]:
    """One search as the profile keeps it."""
    return {
        "ssd_count": n,
        "engine": engine,
        "default": dict(s.default),
        "default_GBps": round(s.median(s.default), 4),
        "best": dict(s.best) if s.best is not None else None,
        "best_GBps": round(s.median(s.best), 4) if s.best is not None else 0.0,
        "stopped": s.stopped,
        "trials": [t.to_json() for t in s.trials],
    }


def _fmt(s: Setting | None) -> str:
    return " ".join(f"{k}={v}" for k, v in (s or {}).items())


def parse_budget(text: str) -> float:
    """`--budget`: seconds, as `90`, `90s`, `2m` or `1.5m`."""
    t = text.strip().lower()
    scale = 60.0 if t.endswith("m") else 1.0
    num = t[:-1] if t[-1:] in ("s", "m") else t
    try:
        v = float(num) * scale
    except ValueError:
        raise UserError(f"--budget: {text!r} is not a duration (e.g. 60s, 2m)") from None
    if not v > 0:
        raise UserError(f"--budget: {text!r} must be more than 0")
    return v
