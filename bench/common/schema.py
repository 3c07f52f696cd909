"""The ground floor of every config: strict pydantic models, human sizes and rates, YAML with
`--set` overrides, and one error format (one line naming the key path).

Sweep configs (bench.config.sweep), training configs (bench.config.training) and engine options
(bench.engines.options) are all validated here. Nothing in this module imports torch or an
engine, so checking a config is cheap (the `--nproc` launcher does it before torchrun starts).
"""

from __future__ import annotations

from typing import Annotated, Any

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from bench.common import sizes
from bench.common.errors import UserError

# torch's dtypes by name, with their element sizes (tests/test_config.py checks them against
# torch): configs name dtypes, and validating one must not import torch.
DTYPES = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "complex128": 16,
    "complex64": 8,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "uint16": 2,
    "uint32": 4,
    "uint64": 8,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}


def _size(v: Any) -> int:
    try:
        return sizes.parse_size(v, "value")
    except UserError as e:
        raise ValueError(str(e).removeprefix("value: ")) from None


def _size0(v: Any) -> int:
    try:
        return sizes.parse_size(v, "value", allow_zero=True)
    except UserError as e:
        raise ValueError(str(e).removeprefix("value: ")) from None


def _rate(v: Any) -> int:
    """A bandwidth: a size per second ("400MB/s", "1GiB/s") or a plain number of bytes/s."""
    text = v.strip()[:-2] if isinstance(v, str) and v.strip().endswith("/s") else v
    try:
        return _size(text)
    except ValueError:
        raise ValueError(
            f"cannot read {v!r} as a bandwidth; use bytes per second such as 400MB/s or 2GiB/s"
        ) from None


def _float(v: Any) -> Any:
    # YAML 1.1 reads "3e-4" (no dot) as a string; accept it as the number it means.
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            raise ValueError(f"expected a number, got {v!r}") from None
    return float(v) if isinstance(v, int) and not isinstance(v, bool) else v


Size = Annotated[int, BeforeValidator(_size)]  # > 0 bytes
SizeOrZero = Annotated[int, BeforeValidator(_size0)]
Rate = Annotated[int, BeforeValidator(_rate)]
PosInt = Annotated[int, Field(gt=0)]
NonNeg = Annotated[int, Field(ge=0)]
Float = Annotated[float, BeforeValidator(_float)]


class Strict(BaseModel):
    """A config section: unknown keys refused, types not coerced, frozen once validated."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def _loc(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def validation_error(
    e: ValidationError, where: str, model: type[BaseModel] | None = None, path: str = ""
) -> UserError:
    """pydantic's first error as one line naming the key path (under `path`, and the value if
    ours did not); an unknown key of `model` itself lists the known ones."""
    err = e.errors()[0]
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
        if model is not None and len(err["loc"]) == 1:
            msg += f" (known: {', '.join(model.model_fields) or 'none'})"
    elif "input" in err and not isinstance(err["input"], dict | list):
        # Our own validators (sizes) already quote the value; pydantic's messages do not.
        if err["type"] != "value_error":
            msg = f"{msg}, got {err['input']!r}"
    prefix = f"{where}: " if where else ""
    key = ".".join(p for p in (path, _loc(err["loc"])) if p)
    return UserError(f"{prefix}{key}: {msg}")


def validated(
    model: type[BaseModel], raw: Any, where: str, check: Any = None, path: str = ""
) -> Any:
    """`model(**raw)`, then `check(cfg)`; either's first error as one line prefixed by `where`
    (the keys of `raw` sit at `path` in the config)."""
    if not isinstance(raw, dict):
        what = f"{where}: {path}" if path else where
        raise UserError(f"{what}: expected a mapping of keys, got {type(raw).__name__}")
    try:
        cfg = model(**raw)
    except ValidationError as e:
        raise validation_error(e, where, model, path) from None
    if check is not None:
        try:
            check(cfg)
        except UserError as e:
            raise UserError(f"{where}: {e}" if where else str(e)) from None
    return cfg


def _set(raw: dict[str, Any], assignment: str) -> None:
    """Apply one `--set key.path=value` (value parsed as YAML) to the raw config."""
    if "=" not in assignment:
        raise UserError(f"--set {assignment!r}: expected key=value, e.g. repetitions=5")
    key, text = assignment.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise UserError(f"--set {assignment!r}: bad key {key!r}")
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        raise UserError(f"--set {assignment!r}: cannot parse the value {text!r}") from None
    node = raw
    for p in parts[:-1]:
        nxt = node.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise UserError(f"--set {assignment!r}: {p} is not a mapping")
        node = nxt
    node[parts[-1]] = value


def read_yaml(path: str, overrides: list[str] | None = None) -> dict[str, Any]:
    """A YAML config as a mapping, with the `--set key=value` overrides applied; a missing,
    unreadable or non-mapping file is a one-line UserError."""
    try:
        with open(path) as f:
            raw = yaml.safe_load(f)
    except FileNotFoundError:
        raise UserError(f"config {path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"config {path}: is a directory") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark else ""
        raise UserError(f"config {path}: not valid YAML{line}") from None
    raw = raw if raw is not None else {}
    if not isinstance(raw, dict):
        raise UserError(f"config {path}: expected a mapping of keys, got {type(raw).__name__}")
    for a in overrides or []:
        _set(raw, a)
    return raw
