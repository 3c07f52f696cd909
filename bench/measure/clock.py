"""The one clock of a save: the harness reads the time on both sides of an engine's `save()`.

The stall is what training pays: from the call of `save()` until it returns, whatever the engine
did inside (waiting for the previous save, walking the state, copying, packing, starting its
persist thread). The time to durability runs from the same call until the save is durable: the
moment the engine's pending save reports its persist done (or, for an engine whose save() is
synchronous, the moment save() returned). Both are read here, outside the engine, with
`time.perf_counter_ns`; an engine never reports a stall or a total of its own. It reports only
what the harness cannot see: its wait for the previous save (`wait_prev_s`), its hashing
(`hash_s`), and how its time split between copy and write (`io_detail`).

Every caller goes through here: `bench.engines.create()` returns its engine behind a `Clocked`,
and the sweep (bench.run.protocol.save_phase), the ranks, the training loop and `make peers`
call `clocked(eng).save(...)`, which wraps an engine made any other way. Like pyperf's runner, which
times the benchmark and never lets it time itself (bench/PERF.md, issue 32).

Runs made before ckptbench 0.2.0 took the stall from each engine's own timer, which stopped
before the work that followed it inside save(); their env.json lacks `stall_clock: harness`.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from bench.measure import witness

STALL_CLOCK = "harness"  # env.json `stall_clock` of runs timed here (ckptbench >= 0.2.0)


def now_ns() -> int:
    return time.perf_counter_ns()


class TimedSave:
    """A save in flight, timed by the harness. `stall_s` is the wall time of the save() call;
    `wait()` returns the engine's SaveResult with `stall_s`, `total_s` and `persist_s` filled
    from this clock. `t0_ns`, `t_return_ns` and `t_durable_ns` are the readings themselves."""

    def __init__(
        self,
        pending: Any,
        t0_ns: int,
        t_return_ns: int,
        durable: bool,
        judge: witness.Judge | None = None,
        name: str = "",
    ) -> None:
        self.pending = pending  # the engine's own handle (bench.engines.base.PendingSave)
        self.t0_ns = t0_ns
        self.t_return_ns = t_return_ns
        self.t_durable_ns: int | None = None
        self._lock = threading.Lock()
        self._judge, self._name = judge, name
        self.witnessed = witness.Verdict("unavailable: not clocked with a witness")
        # The counters when save() returned: what a tool that stops its clock there saw.
        self._at_return = judge.read() if judge is not None and not durable else None
        result = pending.result
        result.stall_s = self.stall_s
        result.total_s = result.persist_s = 0.0
        if durable:
            # Durable before save() returned: the total is the stall, to the nanosecond.
            self._durable(t_return_ns)
        else:
            pending.on_durable(lambda: self._durable(now_ns()))

    @property
    def result(self) -> Any:
        return self.pending.result

    @property
    def stall_s(self) -> float:
        return (self.t_return_ns - self.t0_ns) / 1e9

    def _durable(self, t_ns: int) -> None:
        with self._lock:
            if self.t_durable_ns is not None:
                return
            self.t_durable_ns = max(t_ns, self.t_return_ns)
            r = self.pending.result
            r.total_s = (self.t_durable_ns - self.t0_ns) / 1e9
            r.persist_s = (self.t_durable_ns - self.t_return_ns) / 1e9
            if self._judge is not None:  # the device's counters, right after the durable moment
                self._judge.end()
                try:
                    files = witness.checkpoint_files(self._judge.targets, self._name)
                    self.witnessed = self._judge.save(files)
                except Exception as e:  # a witness must never fail the save it watches
                    self.witnessed = witness.Verdict(f"unavailable: {type(e).__name__}: {e}")

    def witnessed_at_return(self) -> witness.Verdict:
        """Whether the device saw the save durable when save() returned (a save durable by then
        is judged as at its durable moment): what a tool that stops its clock at the return,
        as DLIO v2.0 does, would have had witnessed. Call once the save is durable."""
        if self._judge is None or self._at_return is None:
            return self.witnessed
        files = witness.checkpoint_files(self._judge.targets, self._name)
        return self._judge.save(files, self._at_return)

    def done(self) -> bool:
        return self.pending.done()

    def wait(self) -> Any:
        """Block until the checkpoint is durable (re-raising an error of its persist phase) and
        return the SaveResult with the harness's times."""
        result = self.pending.wait()
        self._durable(now_ns())  # a no-op once the durable moment was read
        return result


class Clocked:
    """An engine behind the harness's clock: `save()` reads the time on both sides of the
    engine's own save() and returns a TimedSave; the rest of the engine contract
    (bench.engines.base.Engine) is the engine's, forwarded by name, and an engine's own extras
    (its staging, its writer) are reached through `engine` or, forwarded, by attribute."""

    def __init__(self, engine: Any) -> None:
        object.__setattr__(self, "engine", engine)

    # The contract, forwarded (bench.engines.base.Engine: what every engine provides).
    @property
    def name(self) -> str:
        return str(self.engine.name)

    @property
    def traits(self) -> Any:
        return self.engine.traits

    @property
    def targets(self) -> list[str]:
        return list(self.engine.targets)

    @property
    def options(self) -> Any:
        return self.engine.options

    @property
    def pinned_bytes(self) -> int:
        return int(self.engine.pinned_bytes)

    @property
    def restore_mode(self) -> str:
        return str(self.engine.restore_mode)

    def warm(self, state: Any) -> None:
        self.engine.warm(state)

    def load(self, name: str, device: str = "cpu", checksums: bool = True, into: Any = None) -> Any:
        if into is None:  # an engine written before restores in place need not take `into`
            return self.engine.load(name, device=device, checksums=checksums)
        return self.engine.load(name, device=device, checksums=checksums, into=into)

    def check(self, name: str, state: Any) -> None:
        self.engine.check(name, state)

    def delete(self, name: str) -> None:
        self.engine.delete(name)

    def cached_files(self, name: str) -> list[str]:
        return list(self.engine.cached_files(name))

    def status(self, name: str) -> str:
        return str(self.engine.status(name))

    def wait_idle(self) -> None:
        self.engine.wait_idle()

    def gds_mode(self) -> str:
        return str(self.engine.gds_mode())

    def release(self) -> None:
        self.engine.release()

    def forget(self) -> None:
        """The engine's `forget()` where it has one (bench.run.restart): what it holds of its
        last checkpoint overwritten, as a restarted process holds none of it."""
        forget = getattr(self.engine, "forget", None)
        if forget is not None:
            forget()

    def close(self) -> None:
        self.engine.close()

    def save(self, state: Any, name: str) -> TimedSave:
        # The block device's counters before the clock starts (bench.measure.witness): read
        # again the moment the save is durable, they say whether its bytes and a cache flush
        # reached the device.
        judge = witness.Judge(list(getattr(self.engine, "targets", [])))
        judge.begin()
        t0 = now_ns()
        pending = self.engine.save(state, name)
        durable = pending.done()  # read before the return is: durable by then at the latest
        t1 = now_ns()
        return TimedSave(pending, t0, t1, durable, judge, name)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.engine, attr)

    def __setattr__(self, attr: str, value: Any) -> None:
        setattr(self.engine, attr, value)

    def __repr__(self) -> str:
        return f"Clocked({self.engine!r})"


def clocked(engine: Any) -> Clocked:
    """`engine` behind the clock (itself if it already is)."""
    return engine if isinstance(engine, Clocked) else Clocked(engine)
