"""The registration table: one line per engine, naming its class ("module:Class") and its options
model (bench.engines.options), and the validation of an engine's options against that model.

Nothing here imports torch or an engine, so a config is validated before anything heavy loads;
bench.engines resolves a line's class when the engine is used (`REGISTRY`, `create()`), and
bench.engines.base's `build_options` validates an engine's options here without importing the
package (which holds the typed REGISTRY, whose type is base's Engine protocol).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench.common.errors import UserError
from bench.common.schema import validated
from bench.engines import options as opts


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
    "dlio-style": Entry("bench.engines.dlio_style:DlioStyle", opts.NoOptions),
}


def register(name: str, target: str, options: type[opts.Strict] = opts.NoOptions) -> None:
    """Register an engine at run time (a plugin or a test): the same as a line in ENGINES."""
    ENGINES[name] = Entry(target, options)


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
