"""The search of one engine's knobs on one target set: successive halving over its grid, inside a
deadline.

Round 0 tries every candidate once: the engine's default first, then the grid, thinned evenly
when the time left after the default's trial holds fewer trials than the grid has settings. Each
later round tries the better half of the last round's survivors once more, ranked by the median
of all their trials, until one is left or the time is spent. Within a round the survivors take
turns, and every other round runs them in reverse, so that a drift of the device (a cache
filling, a neighbour's load) does not favour the settings tried first. A trial starts only if the
slowest trial so far still ends before the deadline.

The trial itself is a function handed in (bench.run.tune.trials runs a real durable save), so the
search is tested against a planted landscape.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Setting = dict[str, Any]


@dataclass(frozen=True)
class Trial:
    """One durable save of one setting: its rate and how long the trial took in all."""

    setting: Setting
    round: int
    gbps: float  # checkpoint bytes / (save() until durable), 1e9 bytes per second
    wall_s: float  # the whole trial: the sweep around the save too
    run: str = ""  # where its raw rows are
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "setting": dict(self.setting),
            "round": self.round,
            "durable_GBps": round(self.gbps, 4),
            "wall_s": round(self.wall_s, 3),
            "run": self.run,
            **({"error": self.error} if self.error else {}),
        }


@dataclass
class Search:
    """What one search tried and what it chose."""

    default: Setting
    trials: list[Trial] = field(default_factory=list)
    best: Setting | None = None
    stopped: str = ""  # why it stopped: "one left" or "out of time"

    def scores(self, setting: Setting) -> list[float]:
        return [t.gbps for t in self.trials if t.setting == setting and not t.error]

    def median(self, setting: Setting) -> float:
        s = self.scores(setting)
        return statistics.median(s) if s else 0.0


def thin(grid: list[Setting], default: Setting, n: int) -> list[Setting]:
    """`n` settings of `grid`: the default first, then others spread evenly across the grid."""
    rest = [g for g in grid if g != default]
    n = max(1, n)
    if n - 1 >= len(rest):
        return [default, *rest]
    step = len(rest) / max(1, n - 1)
    return [default, *(rest[int(i * step)] for i in range(n - 1))]


def halving(
    grid: list[Setting],
    default: Setting,
    trial: Callable[[Setting, int], Trial],
    deadline: float,
    first_s: float,
    clock: Callable[[], float] = time.monotonic,
    say: Callable[[str], None] = lambda _: None,
) -> Search:
    """Successive halving of `grid` (plus `default`) until `deadline` (on `clock`); `first_s` is
    the expected length of a trial before any has run. `trial(setting, round)` runs one."""
    search = Search(default=default)
    slowest = first_s

    def fits() -> bool:
        return clock() + slowest <= deadline

    def run(s: Setting, rnd: int) -> None:
        nonlocal slowest
        t = trial(s, rnd)
        search.trials.append(t)
        slowest = max(slowest, t.wall_s)
        say(
            f"round {rnd} {_label(s)}: "
            + (f"failed: {t.error}" if t.error else f"{t.gbps:.2f} GB/s ({t.wall_s:.1f} s)")
        )

    # The default first: its trial measures what a trial costs, before the grid is thinned to
    # what the time left holds.
    if fits():
        run(default, 0)
    n_fit = int((deadline - clock()) // max(slowest, 1e-3))
    alive = thin(grid, default, n_fit + 1)
    rnd = 0
    while True:
        order = alive if rnd % 2 == 0 else list(reversed(alive))
        for s in order:
            if rnd == 0 and s == default and any(t.setting == default for t in search.trials):
                continue  # tried above
            if not fits():
                break
            run(s, rnd)
        tried = [s for s in alive if search.scores(s)]
        if not tried:
            search.stopped = "out of time"
            break
        ranked = sorted(tried, key=search.median, reverse=True)
        if len(ranked) == 1:
            alive = ranked
            search.stopped = "one left"
            break
        alive = ranked[: math.ceil(len(ranked) / 2)]
        if len(alive) == 1:
            search.stopped = "one left"
            break
        rnd += 1
        if not fits():
            search.stopped = "out of time"
            break
    # The best: the leader among the settings tried most often (a lucky single trial of a
    # setting halving dropped does not beat one that held up over several rounds).
    pool = [s for s in alive if search.scores(s)]
    search.best = max(pool, key=search.median) if pool else None
    return search


def _label(s: Setting) -> str:
    return " ".join(f"{k}={v}" for k, v in s.items())
