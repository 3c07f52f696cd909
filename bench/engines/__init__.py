"""Engines: the three data paths (gds, cpu-double, cpu-single) and the baselines users run today
(torch-save, dcp), each one module registered below by one line.

    from bench.engines import create
    eng = create("cpu-single", targets=["/mnt/nvme0", "/mnt/nvme1"], chunk_bytes="32MiB")

A registration line names the engine, its class ("module:Class", imported only when the engine
is used) and its options model (bench.engines.options), so that a config is validated without
importing torch or any engine. The class declares the rest (`traits`, see
bench.common.traits, and the contract in bench.engines.base); tests/test_engines.py checks that
every registered engine keeps it. A new engine is a module here and a line below.

Imports: bench.common, bench.storage, bench.measure (the clock that `create()` puts around an
engine).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from bench.common.errors import UserError
from bench.common.schema import validated
from bench.engines import options as opts
from bench.measure.clock import Clocked


@dataclass(frozen=True)
class Entry:
    """One registered engine: where its class lives and which options model it takes."""

    target: str  # "module:Class"
    options: type[opts.Strict]
    # (key, "module:function"): what the engine adds to the environment block (env.json), asked
    # for by the run through `environment_blocks`, so that bench.measure.env imports no engine
    env_block: tuple[str, str] | None = None


ENGINES: dict[str, Entry] = {
    "gds": Entry(
        "bench.engines.gds:Gds", opts.GdsOptions, ("kvikio", "bench.engines.gds:kvikio_info")
    ),
    "cpu-single": Entry("bench.engines.cpu_single:CpuSingle", opts.SnapshotOptions),
    "cpu-double": Entry("bench.engines.cpu_double:CpuDouble", opts.DoubleOptions),
    "torch-save": Entry("bench.engines.torch_save:TorchSave", opts.NoOptions),
    "dcp": Entry("bench.engines.dcp:Dcp", opts.DcpOptions),
    "safetensors": Entry("bench.engines.safetensors_save:Safetensors", opts.NoOptions),
    "fastpersist": Entry("bench.engines.fastpersist:FastPersist", opts.FastPersistOptions),
}


def register(name: str, target: str, options: type[opts.Strict] = opts.NoOptions) -> None:
    """Register an engine at run time (a plugin or a test): the same as a line in ENGINES."""
    ENGINES[name] = Entry(target, options)


def _resolve(target: str) -> Any:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


class _Registry(Mapping[str, type]):
    """name -> engine class, importing an engine's module only when its class is asked for."""

    def __getitem__(self, name: str) -> type:
        return _resolve(ENGINES[name].target)

    def __iter__(self) -> Iterator[str]:
        return iter(ENGINES)

    def __len__(self) -> int:
        return len(ENGINES)

    def __contains__(self, name: object) -> bool:
        return name in ENGINES


REGISTRY: Mapping[str, type] = _Registry()


def names() -> list[str]:
    return list(ENGINES)


def check_name(name: str, where: str = "engine") -> None:
    if name not in ENGINES:
        raise UserError(f"{where}: unknown engine {name!r} (known: {', '.join(ENGINES)})")


def options_model(name: str) -> type[opts.Strict]:
    check_name(name)
    return ENGINES[name].options


def validate_options(name: str, given: Any, path: str = "") -> Any:
    """Engine `name`'s options model from a mapping. Errors name the key path: under `path`
    within a config (e.g. `engine_options.gds`), else after `engine NAME`."""
    if path:
        return validated(options_model(name), given, "", path=path)
    return validated(options_model(name), given, f"engine {name}")


def traits_of(name: str) -> Any:
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
