"""The engine contract, the result of a save, and the registry.

An engine saves a state (any nested structure of tensors and plain values, as
`model.state_dict()` or an optimizer's `state_dict()` returns) under a name on its targets:

    eng = create("cpu-single", targets=[...], **options)
    pending = eng.save(state, name="step-100")  # returns once the tensors may change again
    result = pending.wait()                      # the bytes are durable (fsync'd)
    state = eng.load("step-100", device="cpu")
    eng.close()

`create()` returns the engine behind the harness's clock (bench.measure.clock): `stall_s` runs
from the call of `save()` until it returns (including any wait for the previous save to finish
persisting), `total_s` until the bytes are durable, `persist_s = total_s - stall_s`, all three
read by the clock around the call. An engine never sets them: it reports only the parts the
clock cannot see (`wait_prev_s`, `hash_s`, and in `extra` how its time split).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from bench.common.errors import UserError
from bench.common.traits import Traits
from bench.engines.registry import validate_options
from bench.measure.detail import Detail


@dataclass
class SaveResult:
    """What one save cost; bytes in bytes, times in seconds. `stall_s`, `persist_s` and
    `total_s` are the harness's (bench.measure.clock fills them); the engine fills the rest."""

    name: str
    bytes: int
    save_id: str = ""  # names this save's files (see bench.storage.manifest)
    stall_s: float = 0.0  # set by the clock: the wall time of save()
    persist_s: float = 0.0  # set by the clock: total_s - stall_s
    total_s: float = 0.0  # set by the clock: from the call of save() until durable
    hash_s: float = 0.0  # time spent computing checksums (on the persist path)
    wait_prev_s: float = 0.0  # part of stall_s spent waiting for the previous save
    staging_grew: bool = False  # the staging buffer had to be (re)allocated inside this save
    pinned_bytes: int = 0
    targets_used: int = 0
    copied_tensors: int = 0  # tensors that needed a copy (non-contiguous) on a zero-copy path
    checksums: bool = False
    gds_mode: str = "none"  # gds engine: gds, compat or emulated; "none" for the others
    detail: Detail | None = None  # what it reports beyond the columns (bench.measure.detail)


class PendingSave:
    """A save in flight, as the engine hands it back: `wait()` blocks until durable and returns
    the SaveResult. It keeps no time: the harness's clock (bench.measure.clock) asks to be told
    the moment it is durable (`on_durable`)."""

    def __init__(self, result: SaveResult) -> None:
        self.result = result
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []
        self._finished = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def run_in_background(self, fn: Any) -> None:
        """Run `fn()` (the persist phase) in a thread; durable when it returns."""

        def body() -> None:
            try:
                fn()
            except BaseException as e:  # handed to wait()
                self._error = e
            finally:
                self._finish()

        self._thread = threading.Thread(
            target=body, name=f"persist-{self.result.name}", daemon=True
        )
        self._thread.start()

    def finish_now(self) -> None:
        """For engines whose save is synchronous: durable when save() returns, nothing persists
        in the background."""
        self._finish()

    def _finish(self) -> None:
        # The callbacks (the clock reading the durable moment) run before done() turns true, so
        # that whoever sees it done sees the moment read.
        with self._lock:
            self._finished = True
            callbacks, self._callbacks = self._callbacks, []
        try:
            for cb in callbacks:
                cb()
        finally:
            self._done.set()

    def on_durable(self, callback: Callable[[], None]) -> None:
        """Call `callback()` once the save is durable (or failed): now if it already is, else
        from the thread that finishes it."""
        with self._lock:
            if not self._finished:
                self._callbacks.append(callback)
                return
        callback()

    def done(self) -> bool:
        return self._done.is_set()

    def join(self) -> None:
        """Block until the save has finished, durable or failed, without raising its error:
        for an engine that must wait for its previous save (whose error is for that save's own
        `wait()` to report)."""
        self._done.wait()

    def wait(self) -> SaveResult:
        """Block until the checkpoint is durable; re-raise an error of the persist phase."""
        self._done.wait()
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise self._error
        return self.result


@dataclass(frozen=True)
class MemoryPlan:
    """What an engine holds besides the state itself at its peak, in bytes (bench.run.preflight
    adds them up before a sweep runs). Host memory unless said otherwise."""

    staging: int = 0  # kept from warm() through every save: staging, a cached copy, buffers
    pinned: bool = False  # that staging is page-locked (CUDA)
    staging_device: int = 0  # device memory kept the same way (CUDA): gds's coalescing buffer
    save: int = 0  # added while a save runs (a copy the library makes, per-tensor transients)
    page_cache: int = 0  # page cache a save fills (the kernel reclaims it; said, not refused)
    # A restore into new memory: host memory it adds (and device memory on CUDA)
    restore_host: int = 0
    restore_device: int = 0
    # A restore into the state's own tensors (`load(..., into=state)`): the host memory it adds;
    # None where the engine cannot restore in place (`in_place_why` says why).
    in_place_host: int | None = None
    in_place_why: str = ""


@dataclass(frozen=True)
class StateSize:
    """What the memory plan of a state depends on."""

    nbytes: int  # all tensor bytes
    largest: int  # the largest tensor's bytes
    tensors: int  # how many tensors
    cuda: bool  # on a CUDA device (else host-emulated: the state is host memory)
    targets: int = 1  # the targets it is striped over
    smallest: int = 0  # the smallest tensor's bytes (0: not known, small ones may be there)


class Engine(Protocol):
    """What every engine provides (tests/test_registry.py holds each registered one to it).
    `bench.engines.create()` returns one behind the harness's clock (bench.measure.clock's
    `Clocked`, whose save() returns the clock's TimedSave around this one's PendingSave)."""

    name: ClassVar[str]
    traits: ClassVar[Traits]  # what its data path is (bench.common.traits)
    targets: list[str]
    options: Any  # its validated options (its registered model, bench.engines.options)
    restore_mode: str  # how its last load() read: "host", or for gds into CUDA "gds"/"compat"

    def __init__(self, targets: list[str], **options: Any) -> None:
        """An engine writing to `targets` (directories, in order) with its options (its knobs,
        validated against its registered model); `bench.engines.create()` calls it."""

    @property
    def pinned_bytes(self) -> int:
        """Page-locked host memory it holds (an attribute or a property)."""

    @classmethod
    def unavailable(cls, options: dict[str, Any] | None = None) -> str | None:
        """None if the engine can run here with these options, else why not (one line)."""

    @classmethod
    def memory_plan(cls, size: StateSize, options: Any) -> MemoryPlan:
        """What it will hold for a state of `size` with `options` (its validated options)."""

    def warm(self, state: Any) -> None:
        """Allocate and pre-fault what a save of `state` needs, outside any timed region."""

    def save(self, state: Any, name: str) -> PendingSave: ...

    def load(self, name: str, device: str = "cpu", checksums: bool = True, into: Any = None) -> Any:
        """The saved state on `device`; `checksums=False` skips checking the engine's own
        checksums (the benchmark times the read alone, then calls `check()`). `into`: a state
        of the same structure whose tensors the bytes are read into, in place, and which is
        returned (no second copy of the state: a restore of a state that fills the memory)."""

    def check(self, name: str, state: Any) -> None:
        """Check a restored state against the checksums the engine recorded (a ChecksumError
        naming the tensor); nothing for an engine without checksums."""

    def delete(self, name: str) -> None:
        """Remove checkpoint `name` from every target."""

    def cached_files(self, name: str) -> list[str]:
        """The files of checkpoint `name` (so a benchmark can drop them from the page cache)."""

    def status(self, name: str) -> str:
        """`complete`, `incomplete` (an interrupted save left files) or `absent`."""

    def wait_idle(self) -> None:
        """Wait until no save of its is persisting."""

    def gds_mode(self) -> str:
        """How its saves would be labelled here: gds, compat or emulated; "none" for the others."""

    def release(self) -> None:
        """Free what it holds between saves (staging, cached copies); `warm()` makes it again."""

    def close(self) -> None: ...


ENGINE_MEMBERS = (
    "unavailable",
    "memory_plan",
    "warm",
    "save",
    "load",
    "check",
    "delete",
    "cached_files",
    "status",
    "wait_idle",
    "gds_mode",
    "release",
    "close",
)  # the Protocol's methods, by name (the registry's contract test checks each engine has them)


def build_options(engine: str, given: dict[str, Any]) -> Any:
    """Engine `engine`'s validated options (its registered model); errors are UserErrors naming
    the option."""
    return validate_options(engine, given)


def check_targets(engine: str, targets: list[str]) -> list[str]:
    """Absolute target paths; each must be an existing, writable directory."""
    if not targets:
        raise UserError(f"engine {engine}: at least one target directory is needed")
    out = []
    for t in targets:
        if not isinstance(t, str | os.PathLike):
            raise UserError(f"engine {engine}: target {t!r} is not a path")
        p = os.path.abspath(os.fspath(t))
        if not os.path.exists(p):
            raise UserError(f"target {p}: does not exist (create it or fix the path)")
        if not os.path.isdir(p):
            raise UserError(f"target {p}: is not a directory")
        if not os.access(p, os.W_OK | os.X_OK):
            raise UserError(f"target {p}: is not writable by this user")
        out.append(p)
    if len(set(out)) != len(out):
        raise UserError(f"engine {engine}: the same target is listed twice in {out}")
    return out


def check_name(name: str) -> str:
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\0" in name:
        raise UserError(f"checkpoint name {name!r}: use a non-empty name without '/'")
    return name
