"""The process that tests/test_crash.py kills: builds a state, saves it when told, reports.

Run through a multiprocessing fork server that has imported this module (and so torch and
bench) once: each child is a fork, a real process that a real SIGKILL ends, without an
interpreter start per trial. Messages on `conn`: "READY" once the state is built and the
engine warm, then (after the parent's "GO") ("DONE", seconds) once the save is durable.
"""

from __future__ import annotations

import time
from multiprocessing.connection import Connection

from bench.engines import create
from bench.workloads import synthetic_state


def state_of(seed: int, total_bytes: int, tensor_bytes: int) -> dict:
    """The deterministic state of a seed (the parent builds the same one to compare)."""
    return synthetic_state(total_bytes, tensor_bytes, seed=seed)


def run(
    conn: Connection,
    engine: str,
    targets: list[str],
    options: dict,
    seed: int,
    name: str,
    total_bytes: int,
    tensor_bytes: int,
) -> None:
    state = state_of(seed, total_bytes, tensor_bytes)
    eng = create(engine, targets, **options)
    eng.warm(state)  # staging allocated before GO: the kill window is the save itself
    conn.send("READY")
    conn.recv()  # GO
    t0 = time.perf_counter()
    eng.save(state, name).wait()
    conn.send(("DONE", time.perf_counter() - t0))
    conn.recv()  # never answered: the parent kills this process
