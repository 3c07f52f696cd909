"""The run core: what every kind of run shares, in one place.

A run (a sweep in one process, a sweep under torchrun, a training loop) is driven by its kind
(bench.run.sweep, bench.run.training.loop) on top of a `Core`, which owns:
- the world: anything that satisfies `World`, the single process (`LocalWorld`: rank 0 of 1,
  collectives that do nothing) or torchrun's (bench.run.distributed.TorchrunWorld), so that one
  case loop serves both;
- preflight: target directories, O_DIRECT where an engine needs it (by its traits), engines
  that cannot run here (skipped, with the reason in the notes);
- engine creation (the config's options, the run's device, per-target write caps);
- the run directory, new or resumed (same config and device, or refused, and the rows it
  already holds), env.json with the engines' traits and the notes, and the row writers (rank 0
  writes every file);
- the progress bar, failure counting and `on_error`.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from tqdm import tqdm

from bench.common import cudasync, log
from bench.common.errors import UserError
from bench.common.schema import Strict
from bench.config.sweep import Config, engine_options
from bench.config.training import TrainingConfig
from bench.engines import ENGINES, REGISTRY, create, environment_blocks
from bench.measure import clock, env, results
from bench.measure.clock import Clocked
from bench.storage import odirect

if TYPE_CHECKING:
    from bench.common.devices import Device

T = TypeVar("T")

# What identifies a repetition's row (bench.run.plan.case_key): case id, warm-up, rep.
CaseKey = tuple[str, bool, int]


class World(Protocol):
    """The ranks a run is spread over, as every step of a run sees them: this rank's place
    and the control collectives. The single process (`LocalWorld`) and a torchrun job
    (bench.run.distributed.TorchrunWorld) both satisfy it."""

    rank: int
    size: int
    local_rank: int
    node_rank: int
    host: str

    def barrier(self, where: str, timeout_s: float | None = None) -> None:
        """Every rank reaches `where`."""
        ...

    def all_gather(self, obj: T, where: str) -> list[T]:
        """Every rank's `obj`, in rank order."""
        ...

    def agree(self, where: str, fn: Callable[[], T], timeout_s: float | None = None) -> T:
        """Run `fn()` on every rank; an error on any is an error on all."""
        ...


@dataclass
class LocalWorld:
    """This process alone: rank 0 of 1, and collectives that do nothing."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    node_rank: int = 0
    host: str = field(default_factory=socket.gethostname)
    timeout_s: float = 0.0

    def barrier(self, where: str, timeout_s: float | None = None) -> None:
        """Every rank reaches `where` (here: this one has)."""

    def all_gather(self, obj: T, where: str) -> list[T]:
        return [obj]

    def agree(self, where: str, fn: Callable[[], T], timeout_s: float | None = None) -> T:
        """Run `fn()` on every rank; an error on any is an error on all (here: as raised)."""
        return fn()


def engine_block(names: list[str]) -> dict[str, Any]:
    """env.json `engines`: what each engine of the run is (its traits), so that analysis never
    needs to know engines by name."""
    return {e: {"traits": REGISTRY[e].traits.to_json()} for e in names}


class Core:
    """The run directory, environment, preflight, engines, rows and failures of one run."""

    def __init__(
        self,
        cfg: Config | TrainingConfig,
        device: Device,
        out_root: str,
        *,
        world: World | None = None,
        quiet: bool = False,
        resume: str | None = None,
    ) -> None:
        self.cfg = cfg
        self.device = device
        self.out_root = out_root
        self.world: World = world or LocalWorld()
        self.quiet = quiet or self.world.rank != 0
        self.resume = resume
        self.notes: list[str] = []
        self.failures = 0
        self.run_id = ""
        self.run_dir: str | None = None
        self.env: dict[str, Any] = {}
        self.writers: dict[str, results.RowWriter] = {}
        self.skipped: dict[str, str] = {}
        self.bar: tqdm[Any] | None = None

    # -- messages ----------------------------------------------------------------------------

    def log(self, msg: str) -> None:
        if not self.quiet:
            tqdm.write(msg, file=sys.stderr)

    def warn(self, msg: str) -> None:
        """Every rank's own trouble, on stderr with its rank (rank 0 through the progress bar)."""
        if self.world.rank == 0:
            self.log(msg)
        else:
            log.for_rank(self.world.rank).warning(msg)

    def note(self, msg: str) -> None:
        """A line for env.json and the terminal summary (once)."""
        if msg not in self.notes:
            self.notes.append(msg)

    # -- preflight ---------------------------------------------------------------------------

    def runnable(self, names: list[str]) -> list[str]:
        """The engines of `names` that can run here with the config's options; the others are
        skipped with the reason in the notes. A UserError if none can."""
        for e in names:
            reason = REGISTRY[e].unavailable(engine_options(self.cfg, e))
            if reason:
                self.skipped[e] = reason
                self.note(f"engine {e} skipped: it cannot run here: {reason}")
                self.warn(f"warning: engine {e} skipped: {reason}")
        ok = [e for e in names if e not in self.skipped]
        if names and not ok:
            e, why = next(iter(self.skipped.items()))
            raise UserError(f"engines: no engine of the config can run here ({e}: {why})")
        return ok

    @staticmethod
    def check_dirs(dirs: list[str], engines: list[str]) -> None:
        """Each directory exists and is writable, and takes O_DIRECT if an engine needs it."""
        for t in dirs:
            if not os.path.isdir(t):
                raise UserError(
                    f"target {t}: does not exist or is not a directory (create it or fix targets)"
                )
            if not os.access(t, os.W_OK | os.X_OK):
                raise UserError(f"target {t}: is not writable by this user")
        users = ", ".join(e for e in engines if REGISTRY[e].traits.o_direct)
        if users:
            for t in dirs:
                reason = odirect.probe(t)
                if reason:
                    raise UserError(
                        f"target {t}: {reason}; needed by {users} (use a disk-backed target)"
                    )

    def create(
        self,
        engine: str,
        targets: list[str],
        caps: list[int | None] | None = None,
        options: Strict | None = None,
    ) -> Clocked:
        """Engine `engine` over `targets` with `options` (its model as the run resolved it;
        else the config's options and the run's device), and the targets' write caps, for an
        engine that takes them."""
        opts = options.model_dump() if options is not None else engine_options(self.cfg, engine)
        if caps and any(caps) and "max_write_bw" in ENGINES[engine].options.model_fields:
            opts["max_write_bw"] = list(caps)
        return create(engine, targets, **opts)

    # -- the run directory -------------------------------------------------------------------

    def open(
        self,
        config: dict[str, Any],
        targets: list[str],
        engines: list[str],
        *,
        ranked: bool = False,
    ) -> frozenset[CaseKey]:
        """Rank 0: a new run directory under out_root, or the one to resume, and its
        environment block. Returns the rows a resumed run already holds, by (case id, warm-up,
        rep): a multi-rank run (`ranked`) counts a repetition by its aggregate row."""
        if not self.resume:
            self.run_id, self.run_dir = results.new_run_dir(self.out_root, self.cfg.name)
            envb = env.collect(targets, environment_blocks())
            envb["device"] = {"kind": self.device.kind, "emulated": self.device.emulated}
            if self.device.is_cuda:  # how its threads wait for the GPU (blocking or spinning)
                envb["cuda_sync"] = cudasync.blocking_sync()
            # whose clock the stalls are (bench.measure.clock); runs before 0.2.0 lack it
            envb["stall_clock"] = clock.STALL_CLOCK
            envb["config"] = config
            envb["engines"] = engine_block(engines)
            self.env = envb
            return frozenset()
        self.env = self._resume_env(config)
        assert self.run_dir is not None  # set by _resume_env
        rows = results.read_rows(self.run_dir)
        if ranked and "aggregate" in rows:
            rows = rows[rows["aggregate"].astype(str).str.lower() == "true"]
        done = [(str(r.case_id), bool(r.warmup), int(r.rep)) for r in rows.itertuples()]
        self.note(f"resumed with {len(done)} rows already recorded")
        return frozenset(done)

    def _resume_env(self, config: dict[str, Any]) -> dict[str, Any]:
        """Continue `resume`: same config and device (else refuse)."""
        run_dir = self.resume
        assert run_dir is not None
        env_path = os.path.join(run_dir, "env.json")
        if not (os.path.isfile(env_path) and os.path.isfile(os.path.join(run_dir, "results.csv"))):
            raise UserError(
                f"--resume {run_dir}: not a run directory (needs env.json and results.csv)"
            )
        with open(env_path) as f:
            envb = json.load(f)
        old, new = envb.get("config", {}), json.loads(json.dumps(config))
        changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        if changed:
            k = changed[0]
            raise UserError(
                f"--resume {run_dir}: the config changed since that run ({k}: "
                f"{old.get(k)!r} then, {new.get(k)!r} now); start a new run instead"
            )
        if envb.get("stall_clock") != clock.STALL_CLOCK:
            raise UserError(
                f"--resume {run_dir}: its stalls were taken from the engines' own timers "
                "(ckptbench before 0.2.0); this version times save() in the harness, and one "
                "run must not mix the two; start a new run instead"
            )
        if envb.get("device", {}).get("kind") != self.device.kind:
            raise UserError(
                f"--resume {run_dir}: it ran on {envb.get('device')}, this is {self.device.kind}"
            )
        self.run_dir = run_dir
        self.run_id = os.path.basename(os.path.normpath(run_dir))
        return envb

    def write_env(self) -> None:
        """env.json, with the notes so far (rank 0)."""
        if self.world.rank != 0 or self.run_dir is None:
            return
        self.env["notes"] = sorted(set(self.env.get("notes", []) + self.notes))
        results.write_json(os.path.join(self.run_dir, "env.json"), self.env)

    def open_writers(self, files: dict[str, type]) -> None:
        """Rank 0: a row writer per file, by its row type (appending when resumed)."""
        if self.world.rank == 0:
            assert self.run_dir is not None
            self.writers = {
                f: results.RowWriter(os.path.join(self.run_dir, f), kind)
                for f, kind in files.items()
            }

    def write(self, rows: list[Any], file: str = "results.csv") -> None:
        """Rank 0: `rows` appended to `file` (the others hold no writers)."""
        if self.world.rank == 0:
            for r in rows:
                self.writers[file].write(r)

    def progress(self, total: int, unit: str, done: int = 0) -> tqdm[Any]:
        """The run's progress bar (silent when quiet), `done` of `total` already."""
        self.bar = tqdm(
            total=total,
            unit=unit,
            file=sys.stderr,
            disable=self.quiet,
            dynamic_ncols=True,
            initial=done,
        )
        return self.bar

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        for w in self.writers.values():
            w.close()
        self.writers = {}

    # -- failures ----------------------------------------------------------------------------

    def failed(self, what: str, why: str, case: str) -> None:
        """Count a failed case (`what` failed because `why`); with `on_error: stop`, stop the
        run here, naming `case`."""
        self.failures += 1
        self.log(f"{what}: {why}")
        if getattr(self.cfg, "on_error", "continue") == "stop":
            raise UserError(
                f"stopped after a failed case ({case}); results so far are in {self.run_dir}"
            )
