"""Engines: the three data paths (gds, cpu-double, cpu-single) and the baselines users run today
(torch-save, dcp), each one module registered in `REGISTRY` by its name.

    from bench.engines import create
    eng = create("cpu-single", targets=["/mnt/nvme0", "/mnt/nvme1"], chunk_bytes="32MiB")
"""

from __future__ import annotations

from typing import Any

from bench.engines import cpu_double, cpu_single, dcp, gds, torch_save  # noqa: F401 - registers them
from bench.engines.base import REGISTRY, Engine, PendingSave, SaveResult
from bench.errors import UserError

__all__ = ["REGISTRY", "Engine", "PendingSave", "SaveResult", "create", "names", "unavailable"]


def names() -> list[str]:
    return list(REGISTRY)


def unavailable(name: str, options: dict[str, Any] | None = None) -> str | None:
    """None if engine `name` can run here with `options`, else why not."""
    if name not in REGISTRY:
        raise UserError(f"unknown engine {name!r} (known: {', '.join(REGISTRY)})")
    return REGISTRY[name].unavailable(options)


def create(name: str, targets: list[str], **options: Any) -> Engine:
    """A ready engine writing to `targets` (directories, in order); options are engine knobs."""
    reason = unavailable(name, options)
    if reason:
        raise UserError(f"engine {name} cannot run here: {reason}")
    return REGISTRY[name](list(targets), **options)
