"""Device ceilings: the best the storage and the memory do for the kind of work the engines do,
measured in the same run as the engines, so that every engine row can be read as a fraction of
it (an efficiency above 1 says the ceiling is wrong, not that the engine won).

One module per job, each importing only those above it in this list:
- `types`: every kind of ceiling (`KINDS`) and what a measurement keeps, typed, with env.json's
  keys; what this package exports (below) is these types, for the readers of ceilings;
- `data`: the bytes the runs move (incompressible random bytes) and the files a storage run
  writes and reads;
- `fio`: the storage runs with fio, and the environment that puts its buffers on huge pages;
- `builtin`: the same storage runs without fio (threads with pwrite and pread);
- `memory`: memory bandwidth (a copy as the snapshot copies, device-to-host, host-to-device)
  and serialisation (torch.save into memory);
- `measure`: which measurer measures each kind, and the runs of them before and after the
  sweep (`measure`, given `Options`) and between workloads (`probe`).

Importing this package imports `types` alone (no torch): analysis reads ceilings without
measuring them.
"""

from bench.measure.ceilings.types import (
    BUFFERED_READ,
    BUFFERED_WRITE,
    BUFFERED_WRITE_1,
    COPY,
    D2H,
    DIRECT_READ,
    DIRECT_WRITE,
    H2D,
    KINDS,
    SERIALIZE,
    Ceilings,
    Count,
    Kind,
    Measured,
    Method,
    Phase,
    Probe,
    RunCeilings,
    Tried,
    Writers,
    best,
)

__all__ = [
    "BUFFERED_READ",
    "BUFFERED_WRITE",
    "BUFFERED_WRITE_1",
    "COPY",
    "D2H",
    "DIRECT_READ",
    "DIRECT_WRITE",
    "H2D",
    "KINDS",
    "SERIALIZE",
    "Ceilings",
    "Count",
    "Kind",
    "Measured",
    "Method",
    "Phase",
    "Probe",
    "RunCeilings",
    "Tried",
    "Writers",
    "best",
]
