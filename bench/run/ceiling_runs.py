"""A run's device ceilings: measured before the sweep, again after it, and probed between a
workload's warm-ups and its timed saves, each returned typed (bench.measure.ceilings) for the
sweep to keep in env.json. How each kind is measured is bench.measure.ceilings.measure's; this
is when, with which sizes and searches, and what a failure leaves (a note: a ceiling is a
reference, not the benchmark)."""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from bench.common import sizes
from bench.common.errors import UserError
from bench.config import sweep as config_mod
from bench.measure import timers
from bench.measure.ceilings import (
    BUFFERED_READ,
    BUFFERED_WRITE,
    DIRECT_READ,
    DIRECT_WRITE,
    Ceilings,
    Kind,
    Probe,
)
from bench.measure.ceilings import measure as ceiling_measure
from bench.measure.ceilings.fio import fio_version
from bench.measure.ceilings.memory import release as release_buffers
from bench.run.core import Core
from bench.run.plan import Group, RunPlan, Workload

if TYPE_CHECKING:
    from bench.common.devices import Device


def grids(spec: config_mod.CeilingSpec) -> dict[Kind, list[tuple[int, int]]]:
    """The searches the config asks for, by kind of ceiling: (writers per target, depth); the
    reads search as the writes of their kind do."""
    direct = [(int(j), int(q)) for j, q in spec.direct_search]
    buffered = [(int(j), 1) for j in spec.buffered_jobs]
    return {
        DIRECT_WRITE: direct,
        BUFFERED_WRITE: buffered,
        DIRECT_READ: direct,
        BUFFERED_READ: buffered,
    }


class CeilingRunner:
    """Measures the ceilings of one run on its plan's targets and device."""

    def __init__(self, cfg: config_mod.Config, device: Device, core: Core, plan: RunPlan) -> None:
        self.cfg = cfg
        self.device = device
        self.core = core
        self.plan = plan  # decided (bench.run.decide): its targets and page-cache policy
        self._probe_buffers: dict[int, Any] = {}  # the probes' copy buffers, reused

    def measure(self, wls: list[Workload], again: Ceilings | None = None) -> Ceilings | None:
        """The device ceilings for this sweep; `again`: the ceilings measured before, whose
        configurations are measured once more (after the sweep). When a probe cannot finish
        (a full disk, fio failing) None: that is said loudly in the notes and the engines still
        run, without efficiency columns."""
        cfg, core = self.cfg, self.core
        try:
            spec = cfg.ceilings
            installed = fio_version()
            if spec.tool == "fio" and not installed:
                raise UserError(
                    "ceilings.tool: fio is not installed (apt-get install fio, or use auto)"
                )
            largest = max((w.total_bytes for w in wls if w.kind == "synthetic"), default=1 << 30)
            tensor = max((w.tensor_bytes for w in wls if w.kind == "synthetic"), default=64 << 20)
            tool = "fio" if spec.tool != "builtin" and installed else "built-in probe"
            when = "after the sweep" if again else "first"
            drop = timers.drop_page_cache if self.plan.cache_dropped else None
            options = self._options(spec, largest, tensor, drop, again)
            runs = options.storage_runs()
            core.log(
                f"measuring device ceilings {when}: {runs} storage runs with {tool} of "
                f"{sizes.format_size(options.storage_bytes())} each, every one cut off after "
                f"{spec.max_seconds:g} s (at most {runs * spec.max_seconds / 60:.1f} min of I/O, "
                "plus fsync), then a memory copy"
            )
            bar = tqdm(
                total=runs,
                unit="run",
                desc="ceilings",
                file=sys.stderr,
                disable=core.quiet,
                dynamic_ncols=True,
                leave=False,
            )

            def progress(label: str) -> None:
                bar.set_postfix_str(label)
                bar.update(1)

            try:
                out = ceiling_measure.measure(dataclasses.replace(options, progress=progress))
            finally:
                bar.close()
            if drop:
                drop()
            return out
        except (OSError, RuntimeError, ValueError) as e:
            why = " ".join(str(e).split())[:300]
            core.env["ceilings_error"] = why
            core.note(f"device ceilings not measured: {why}")
            core.warn(f"warning: device ceilings not measured ({why}); no efficiency columns")
            return None

    def _options(
        self,
        spec: config_mod.CeilingSpec,
        largest: int,
        tensor: int,
        drop: Callable[[], object] | None,
        again: Ceilings | None,
    ) -> ceiling_measure.Options:
        """What the ceilings measure: the config's searches and bounds, the plan's targets,
        chunk and copy threads, the largest synthetic checkpoint."""
        cfg = self.cfg
        return ceiling_measure.Options(
            targets=self.plan.targets,
            ssd_counts=cfg.ssd_counts,
            checkpoint_bytes=largest,
            block=self.plan.chunk_bytes(),
            device=self.device,
            use_fio=spec.tool != "builtin",
            drop=drop,
            caps=cfg.target_caps(),
            repetitions=spec.repetitions,
            min_bytes=spec.min_bytes,
            copy_threads=self.plan.copy_threads(),
            tensor_bytes=tensor,
            configs=again.chosen() if again else None,
            grids=grids(spec),
            max_bytes=spec.max_bytes,
            max_seconds=spec.max_seconds,
            reads=spec.reads,
        )

    def after(self, wls: list[Workload], before: Ceilings | None) -> None:
        """Rank 0, after the sweep: the ceilings again, kept beside the first; a drift noted."""
        core = self.core
        if not (self.cfg.ceilings.enabled and self.cfg.ceilings.after and before):
            return
        after = self.measure(wls, again=before)
        if after is None:
            return
        core.env["ceilings_after"] = after.to_json()
        for d in before.drift(after):
            core.note(
                f"the disk drifted during the run: {d}; efficiencies use the run's best ceiling"
            )
        core.write_env()

    def probe(
        self, g: Group, wl: Workload, mine: tuple[list[str], list[int]] | None, chosen: Any
    ) -> Probe | None:
        """The ceilings once more between this workload's warm-up and timed saves
        (bench.measure.ceilings.measure.probe), over this rank's targets `mine` in the
        configurations `chosen`: the model predicts the workload from the probes around it. The
        page cache is not dropped for it: the timed saves that follow find it as the warm-ups
        left it, and so does the probe (on a VM with a memory balloon, a buffered write into
        freshly dropped memory runs at half speed). A probe that fails is noted (None) and the
        sweep goes on."""
        cfg, core = self.cfg, self.core
        paths, idx = mine or ([], [])
        if not paths:
            return None
        caps = cfg.target_caps()
        t0 = time.perf_counter_ns()
        try:
            got = ceiling_measure.probe(
                paths,
                wl.total_bytes,
                self.plan.chunk_bytes(),
                self.device,
                chosen,
                use_fio=cfg.ceilings.tool != "builtin",
                caps=[caps[i] for i in idx],
                copy_threads=self.plan.copy_threads(),
                keep=self._probe_buffers,
                max_bytes=cfg.ceilings.max_bytes,
                max_seconds=cfg.ceilings.max_seconds,
            )
        except (OSError, RuntimeError, ValueError) as e:
            why = " ".join(str(e).split())[:200]
            core.note(f"the probe of {wl.id} over {g.n} target(s) failed: {why}")
            return None
        return dataclasses.replace(
            got,
            workload=wl.id,
            unix_time=round(time.time(), 1),
            seconds=round((time.perf_counter_ns() - t0) / 1e9, 2),
        )

    def release(self) -> None:
        """Free the probes' copy buffers."""
        release_buffers(self._probe_buffers)
