"""Engines: the three data paths (gds, cpu-double, cpu-single) and the baselines users run today
(torch-save, dcp), each one module registered by one line (bench/engines/registry.py).

    from bench.engines import create
    eng = create("cpu-single", targets=["/mnt/nvme0", "/mnt/nvme1"], chunk_bytes="32MiB")

A registration line (bench.engines.registry) names the engine, its class ("module:Class",
imported only when the engine is used) and its options model (bench.engines.options), so that a
config is validated without importing torch or any engine. The class declares the rest
(`traits`, see bench.common.traits, and the contract in bench.engines.base); tests/test_registry.py
checks that every registered engine keeps it, and mypy its types (bench/engines/contract.py).
A new engine is a module here, a line in bench/engines/registry.py and one in contract.py.

Imports: bench.common, bench.storage, bench.measure (the clock that `create()` puts around an
engine).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from bench.common.errors import UserError
from bench.engines.registry import (
    ENGINES,
    Entry,
    check_name,
    names,
    options_model,
    register,
    validate_options,
)
from bench.measure.clock import Clocked

if TYPE_CHECKING:  # an engine module is imported when the engine is used, not with this package
    from bench.common.traits import Traits
    from bench.engines.base import Engine

__all__ = [
    "ENGINES",
    "REGISTRY",
    "Entry",
    "check_name",
    "create",
    "environment_blocks",
    "names",
    "options_model",
    "register",
    "traits_of",
    "unavailable",
    "validate_options",
]


def _resolve(target: str) -> Any:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


# The value type is a string: bench.engines.base is imported for mypy only (above).
class _Registry(Mapping[str, "type[Engine]"]):
    """name -> engine class, importing an engine's module only when its class is asked for."""

    def __getitem__(self, name: str) -> type[Engine]:
        cls: type[Engine] = _resolve(ENGINES[name].target)
        return cls

    def __iter__(self) -> Iterator[str]:
        return iter(ENGINES)

    def __len__(self) -> int:
        return len(ENGINES)

    def __contains__(self, name: object) -> bool:
        return name in ENGINES


REGISTRY: Mapping[str, type[Engine]] = _Registry()


def traits_of(name: str) -> Traits:
    """The traits engine `name` declares (imports its module)."""
    check_name(name)
    return REGISTRY[name].traits


def unavailable(name: str, options: dict[str, Any] | None = None) -> str | None:
    """None if engine `name` can run here with `options`, else why not."""
    check_name(name)
    return REGISTRY[name].unavailable(options)


def environment_blocks() -> dict[str, Any]:
    """What the registered engines add to the environment block, by key (gds: `kvikio`, its
    versions and mode), each hook imported and called now."""
    return {e.env_block[0]: _resolve(e.env_block[1])() for e in ENGINES.values() if e.env_block}


def create(name: str, targets: list[str], **options: Any) -> Clocked:
    """A ready engine writing to `targets` (directories, in order), behind the harness's clock
    (bench.measure.clock: its save() is timed from outside); options are engine knobs."""
    validate_options(name, options)  # a bad option is said first, wherever the engine runs
    reason = unavailable(name, options)
    if reason:
        raise UserError(f"engine {name} cannot run here: {reason}")
    return Clocked(REGISTRY[name](list(targets), **options))
