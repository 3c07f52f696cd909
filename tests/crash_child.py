"""The process that tests/test_crash.py kills: builds a state, saves it when told, reports.

Run through a multiprocessing fork server that has imported this module (and so torch and
bench) once: each child is a fork, a real process that a real SIGKILL ends, without an
interpreter start per trial. Messages on `conn`: "READY" once the state is built and the
engine warm, then (after the parent's "GO") ("DONE", seconds) once the save is durable; a
child told to stop somewhere (`stop_at`) says ("AT", where) there instead and waits to be
killed.
"""

from __future__ import annotations

import time
from multiprocessing.connection import Connection

from bench.engines import create
from bench.workloads import synthetic_state


def state_of(seed: int, total_bytes: int, tensor_bytes: int) -> dict:
    """The deterministic state of a seed (the parent builds the same one to compare)."""
    return synthetic_state(total_bytes, tensor_bytes, seed=seed)


def stop_at(conn: Connection, where: str) -> None:
    """Make this process's save stop for good at `where` and say ("AT", where) there: "write",
    once its first data piece is written (a save cut short); "commit", once its manifest is
    committed, before the old generation is removed. The parent kills it there: the kill lands
    at that point in the save, however fast or slow the machine."""
    import threading

    from bench.storage import layout, manifest

    module, attr = (layout, "write_piece") if where == "write" else (manifest, "commit")
    real = getattr(module, attr)

    first = threading.Lock()  # several writer threads get here: one of them says so

    def stop(*args: object) -> None:
        real(*args)
        if first.acquire(blocking=False):
            conn.send(("AT", where))
        threading.Event().wait()  # until the SIGKILL

    setattr(module, attr, stop)


def run(
    conn: Connection,
    engine: str,
    targets: list[str],
    options: dict,
    seed: int,
    name: str,
    total_bytes: int,
    tensor_bytes: int,
    where: str | None = None,
) -> None:
    state = state_of(seed, total_bytes, tensor_bytes)
    eng = create(engine, targets, **options)
    if where:
        stop_at(conn, where)
    eng.warm(state)  # staging allocated before GO: the kill window is the save itself
    conn.send("READY")
    conn.recv()  # GO
    t0 = time.perf_counter()
    eng.save(state, name).wait()
    conn.send(("DONE", time.perf_counter() - t0))
    conn.recv()  # never answered: the parent kills this process
