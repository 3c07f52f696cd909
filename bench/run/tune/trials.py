"""A real trial of `ckptbench tune`: one durable save of one engine with one setting of its knobs,
run as a one-case sweep of the user's config (bench.run.sweep), so that a trial is measured as
every run is: the state built and warmed outside the timed region, the page cache dropped before
the case (root) and the checkpoint's pages evicted after it, the save timed until durable and
witnessed by the devices' counters, then restored and compared.

The trial's state: the config's largest `total_sizes` entry, at least `ceilings.min_bytes` (the
size the ceiling search writes to be past a device's write-cache burst), in tensors of the
config's largest tensor size that still gives at least four of them (so that every writer
thread has work), unless `size` is handed in (tests, and a budget that holds no larger state).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from bench.common.errors import UserError
from bench.common.schema import read_yaml
from bench.config import sweep as config_mod
from bench.measure import results
from bench.run.sweep import Sweep
from bench.run.tune.search import Setting, Trial


def state_size(cfg: config_mod.Config) -> int:
    """The trial state's bytes (see the module's doc)."""
    return max([*cfg.total_sizes, cfg.ceilings.min_bytes])


def tensor_size(cfg: config_mod.Config, total: int) -> int:
    """The largest of the config's tensor sizes giving at least four tensors (else its smallest;
    the total itself when the config names none)."""
    sizes = sorted(t for t in cfg.tensor_sizes if t <= total) or [total]
    fit = [t for t in sizes if t * 4 <= total]
    return fit[-1] if fit else sizes[0]


@dataclass
class Trials:
    """Runs trials of the config at `config_path` (with `overrides`, as `--set` gives them) into
    `out_root`, each a sweep of one engine on the first `n_targets` targets."""

    config_path: str
    overrides: list[str]
    out_root: str
    device: Any
    size: int
    tensor: int

    def config(self, engine: str, n_targets: int, setting: Setting) -> config_mod.Config:
        raw = read_yaml(self.config_path, self.overrides)
        opts = dict((raw.get("engine_options") or {}).get(engine) or {})
        raw.update(
            engines=[engine],
            ssd_counts=[n_targets],
            total_sizes=[self.size],
            tensor_sizes=[self.tensor],
            models=[],
            warmups=0,
            repetitions=1,
            engine_options={engine: {**opts, **setting}},
            ceilings={**(raw.get("ceilings") or {}), "enabled": False},
        )
        for key in ("tune", "mlperf", "ranks"):  # one process, one synthetic state
            raw.pop(key, None)
        return config_mod.from_dict(raw, f"config {self.config_path}")

    def run(self, engine: str, n_targets: int, setting: Setting, rnd: int) -> Trial:
        cfg = self.config(engine, n_targets, setting)
        t0 = time.monotonic()
        sweep = Sweep(cfg, self.device, self.out_root, quiet=True)
        try:
            run_dir = sweep.run()
        except UserError:
            raise
        except Exception as e:  # an engine failing with a setting loses the trial, not the tune
            return Trial(setting, rnd, 0.0, time.monotonic() - t0, sweep.run_dir or "", repr(e))
        wall = time.monotonic() - t0
        df = results.read_rows(run_dir)
        df = df[~df["warmup"].astype(bool)]
        rel = os.path.basename(run_dir.rstrip("/"))
        bad = df[(df["error"].fillna("") != "") | (cfg.verify & ~df["verified"].astype(bool))]
        if df.empty or not bad.empty:
            why = str(bad["error"].iloc[0]) if not bad.empty else "no row"
            return Trial(setting, rnd, 0.0, wall, rel, why or "did not verify")
        gbps = float((df["total_bytes"] / df["total_s"]).median() / 1e9)
        return Trial(setting, rnd, gbps, wall, rel)
