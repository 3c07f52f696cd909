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
    "nixl": Entry(
        "bench.engines.nixl_peer:Nixl",
        opts.NixlOptions,
        ("nixl", "bench.engines.nixl_peer:nixl_info"),
    ),
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


def knob_grid(
    name: str, ranges: dict[str, list[Any]] | None = None, base: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Every setting `ckptbench tune` may try for engine `name`: the cartesian product of its
    knobs' values (its options model's TUNABLE, each range replaced by `ranges`' where given),
    each one checked by the model on top of `base` (the config's options). A knob the engine does
    not declare, or a value its model refuses, is a one-line error under `tune.NAME.KNOB`."""
    import itertools

    model = options_model(name)
    declared: opts.Knobs = getattr(model, "TUNABLE", {})  # every model here declares it
    knobs = {k: list(v) for k, v in declared.items()}
    for knob, values in (ranges or {}).items():
        where = f"tune.{name}.{knob}"
        if knob not in knobs:
            known = ", ".join(knobs) or "none"
            raise UserError(f"{where}: not a knob tune can search for {name} (its knobs: {known})")
        if not isinstance(values, list) or not values:
            raise UserError(f"{where}: expected a non-empty list of values, got {values!r}")
        for v in values:
            validated(model, {**(base or {}), knob: v}, "", path=where.rsplit(".", 1)[0])
        knobs[knob] = values
    grid = []
    for combo in itertools.product(*knobs.values()):
        setting = dict(zip(knobs, combo, strict=True))
        checked = validated(model, {**(base or {}), **setting}, f"tune.{name}")
        # the values as the model holds them (sizes in bytes), so settings compare equal
        grid.append({k: getattr(checked, k) for k in setting})
    unique = []
    for g in grid:
        if g not in unique:
            unique.append(g)
    return unique
