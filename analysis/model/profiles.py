"""The model's inputs: hardware profiles (`configs/hardware/*.yaml`, strict: every figure with
its kind and source) read into `Profile`, and the reference CPU cost every server profile is
charged (`configs/hardware/cpu-cost/reference.yaml`). Imports nothing of analysis.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from bench.common.errors import UserError
from bench.common.sizes import parse_size

PROFILES_DIR = Path(__file__).resolve().parents[2] / "configs" / "hardware"
THIS_MACHINE = "this-machine"
GB = 1e9

Kind = Literal["measured", "vendor rating", "spec", "assumed", "derived", "from run"]


class Quoted(BaseModel):
    """One input figure with where it came from."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    value: float | str
    kind: Kind
    source: str


class ProfileFile(BaseModel):
    """configs/hardware/<name>.yaml (strict: unknown keys are errors)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    description: str
    filled_from_run: bool = False
    d2h_GBps: Quoted | None = None
    gds_link_GBps: Quoted | None = None
    ssd_write_GBps: Quoted | None = None
    # The restore's inputs: one SSD's sequential read and the GPU's host-to-device link. A
    # profile without them reads as "assumed": read = write, host-to-device = device-to-host.
    ssd_read_GBps: Quoted | None = None
    h2d_GBps: Quoted | None = None
    ssds_per_gpu: Quoted | None = None
    gpus_sharing_host: Quoted | None = None
    gpus_per_host: Quoted | None = None  # default: gpus_sharing_host
    ssds_per_host: Quoted | None = None  # default: ssds_per_gpu x GPUs per host
    host_copy_GBps: Quoted | None = None
    checkpoint_size: Quoted | None = None
    # The host itself (what a checkpoint costs it, `host_need`): its CPU cores and its DRAM
    # bandwidth. Without a cited figure the verdict on it says "unknown".
    host_cores: Quoted | None = None
    dram_GBps: Quoted | None = None
    notes: list[str] = []


REQUIRED_INPUTS = (
    "d2h_GBps",
    "ssd_write_GBps",
    "ssds_per_gpu",
    "gpus_sharing_host",
    "host_copy_GBps",
    "checkpoint_size",
)


@dataclass(frozen=True)
class Profile:
    """Model inputs (bytes, B/s) and, per input, (kind, source) for the tables."""

    name: str
    description: str
    d2h_Bps: float
    ssd_write_Bps: float
    ssds_per_gpu: int
    gpus_sharing_host: int
    host_copy_Bps: float
    size_bytes: int
    link_Bps: float | None = None
    shared_device: bool = False
    sources: dict[str, tuple[str, str]] | None = None
    notes: tuple[str, ...] = ()
    gpus_per_host: int | None = None  # None: gpus_sharing_host
    ssds_per_host: int | None = None  # None: ssds_per_gpu x GPUs per host
    # Measured on this machine (from_run): W(n) and P(n) by target count, and z.
    direct_by_n: tuple[tuple[int, float], ...] = ()
    buffered_by_n: tuple[tuple[int, float], ...] = ()
    serialize_Bps: float | None = None
    # P1(n): the page-cache path with one writer (engines with the single_writer trait).
    buffered_single_by_n: tuple[tuple[int, float], ...] = ()
    # The host: cores and DRAM bandwidth (B/s) with what they cite (None: unknown), and per
    # engine the CPU-seconds per GB durable a checkpoint takes, (engine, whole save, persist
    # phase), with where they were measured.
    host_cores: float | None = None
    dram_Bps: float | None = None
    cpu_cost: tuple[tuple[str, float, float], ...] = ()
    cpu_cost_source: str = ""
    # The restore: one SSD's read (None: not known, restores not modelled), the GPU's
    # host-to-device link h (None: none, as on a host-emulated run whose restores land in host
    # memory), and as measured on this machine R(n), Q(n) (O_DIRECT and buffered reads, cold
    # cache) by target count.
    ssd_read_Bps: float | None = None
    h2d_Bps: float | None = None
    direct_read_by_n: tuple[tuple[int, float], ...] = ()
    buffered_read_by_n: tuple[tuple[int, float], ...] = ()
    # dram_Bps is what the host was seen to move (a run's copy), not its bandwidth: a path
    # that needs less is affordable, one that needs more is not known to be unaffordable.
    dram_lower_bound: bool = False

    @property
    def host_gpus(self) -> int:
        return self.gpus_per_host or self.gpus_sharing_host

    @property
    def host_ssds(self) -> int:
        return self.ssds_per_host or self.ssds_per_gpu * self.host_gpus

    @property
    def link(self) -> float:
        return self.link_Bps if self.link_Bps is not None else self.d2h_Bps

    @property
    def copy_per_gpu(self) -> float:
        return self.host_copy_Bps / self.gpus_sharing_host

    def storage_Bps(self, n: float) -> float:
        """W(n): aggregate write bandwidth of n SSDs (as measured for n targets, when it was;
        no scaling when they share one device)."""
        measured: dict[float, float] = dict(self.direct_by_n)  # n may be 2.0 for 2 SSDs
        if n in measured:
            return measured[n]
        return self.ssd_write_Bps if self.shared_device else n * self.ssd_write_Bps

    def page_cache_Bps(self, n: float, single_writer: bool = False) -> float:
        """P(n): the page-cache path's rate to durability over n SSDs (as measured, else W(n);
        the host's copy share bounds it in `predict`); P1(n) for one writer when measured."""
        measured: dict[float, float] = dict(self.buffered_by_n)
        single: dict[float, float] = dict(self.buffered_single_by_n)
        if single_writer and n in single:
            return single[n]
        return measured.get(n, self.storage_Bps(n))

    def read_Bps(self, n: float) -> float | None:
        """R(n): aggregate O_DIRECT read bandwidth of n SSDs from a cold cache (as measured
        for n targets, when it was; no scaling when they share one device); None: unknown."""
        measured: dict[float, float] = dict(self.direct_read_by_n)
        if n in measured:
            return measured[n]
        if self.ssd_read_Bps is None:
            return None
        return self.ssd_read_Bps if self.shared_device else n * self.ssd_read_Bps

    def page_cache_read_Bps(self, n: float) -> float | None:
        """Q(n): the page-cache path's read of n SSDs from a cold cache (as measured, else
        R(n)). One reader or several: the kernel's readahead keeps one sequential reader as
        fast as several here (bench/PERF.md), so no one-reader term as the writes have."""
        measured: dict[float, float] = dict(self.buffered_read_by_n)
        return measured.get(n, self.read_Bps(n))

    def assumed(self, *keys: str) -> bool:
        """Whether any of these inputs is assumed rather than cited or measured."""
        src = self.sources or {}
        return any(src.get(k, ("assumed", ""))[0] == "assumed" for k in keys)


def profile_names(directory: Path = PROFILES_DIR) -> list[str]:
    return sorted(f.stem for f in directory.glob("*.yaml"))


def yaml_error(e: yaml.YAMLError) -> str:
    """A parser's error in one line: where (line, column) and what, without its multi-line
    excerpt of the file."""
    mark = getattr(e, "problem_mark", None)
    what = getattr(e, "problem", None) or type(e).__name__
    at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return f"{at}not valid YAML ({what})"


def _validated(path: Path, model: Any) -> Any:
    """A YAML file read into a pydantic model; a bad file is a UserError naming the path and,
    for a bad value, the key."""
    try:
        return model.model_validate(yaml.safe_load(path.read_text()))
    except yaml.YAMLError as e:
        raise UserError(f"{path}: {yaml_error(e)}") from None
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
        raise UserError(f"{path}: {where}: {msg}") from None


def _read_profile_file(name: str, directory: Path) -> tuple[ProfileFile, str]:
    path = Path(name)
    if not (path.suffix in (".yaml", ".yml") and path.is_file()):
        path = directory / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(profile_names(directory)) or "none"
        raise UserError(f"unknown hardware profile {name!r} (known: {known}; or a .yaml path)")
    return _validated(path, ProfileFile), str(path)


def _number(q: Quoted, path: str, key: str) -> float:
    try:
        v = float(q.value)
    except (TypeError, ValueError):
        raise UserError(f"{path}: {key}.value: expected a number, got {q.value!r}") from None
    if not v > 0:
        raise UserError(f"{path}: {key}.value: must be positive, got {q.value!r}")
    return v


def is_filled_from_run(name: str, directory: Path = PROFILES_DIR) -> bool:
    """Whether profile `name` (a name or a .yaml path) is the one a run fills (this-machine)."""
    pf, _ = _read_profile_file(name, directory)
    return pf.filled_from_run


def load_profile(name: str, directory: Path = PROFILES_DIR) -> Profile:
    """A hardware profile by name (configs/hardware/<name>.yaml) or path."""
    pf, path = _read_profile_file(name, directory)
    if pf.filled_from_run:
        raise UserError(
            f"profile {pf.name!r} is filled from a measured run: "
            f"ckptbench model {pf.name} --from-run results/<run-id>"
        )
    missing = [k for k in REQUIRED_INPUTS if getattr(pf, k) is None]
    if missing:
        raise UserError(f"{path}: missing inputs {', '.join(missing)}")
    q: dict[str, Quoted] = {k: getattr(pf, k) for k in REQUIRED_INPUTS}
    link = pf.gds_link_GBps
    sources: dict[str, tuple[str, str]] = {k: (v.kind, v.source) for k, v in q.items()}
    if link is not None:
        sources["gds_link_GBps"] = (link.kind, link.source)
    for key in ("host_cores", "dram_GBps"):
        if (h := getattr(pf, key)) is not None:
            sources[key] = (h.kind, h.source)
    read, h2d = _restore_inputs(pf, path, sources)
    cost, cost_source = reference_cpu_cost(directory)
    return Profile(
        name=pf.name,
        description=pf.description,
        d2h_Bps=_number(q["d2h_GBps"], path, "d2h_GBps") * GB,
        ssd_write_Bps=_number(q["ssd_write_GBps"], path, "ssd_write_GBps") * GB,
        ssds_per_gpu=int(_number(q["ssds_per_gpu"], path, "ssds_per_gpu")),
        gpus_sharing_host=int(_number(q["gpus_sharing_host"], path, "gpus_sharing_host")),
        host_copy_Bps=_number(q["host_copy_GBps"], path, "host_copy_GBps") * GB,
        size_bytes=parse_size(q["checkpoint_size"].value, f"{path}: checkpoint_size.value"),
        link_Bps=None if link is None else _number(link, path, "gds_link_GBps") * GB,
        sources=sources,
        notes=tuple(pf.notes),
        gpus_per_host=_optional_int(pf.gpus_per_host, path, "gpus_per_host", sources),
        ssds_per_host=_optional_int(pf.ssds_per_host, path, "ssds_per_host", sources),
        host_cores=None if pf.host_cores is None else _number(pf.host_cores, path, "host_cores"),
        dram_Bps=None if pf.dram_GBps is None else _number(pf.dram_GBps, path, "dram_GBps") * GB,
        cpu_cost=cost,
        cpu_cost_source=cost_source,
        ssd_read_Bps=read,
        h2d_Bps=h2d,
    )


def _restore_inputs(
    pf: ProfileFile, path: str, sources: dict[str, tuple[str, str]]
) -> tuple[float, float]:
    """(one SSD's read, the host-to-device link) in B/s with their sources; a profile without
    a cited figure takes the write figure for the read and the device-to-host link for the
    host-to-device one, and says "assumed"."""
    out = []
    for key, fallback, why in (
        ("ssd_read_GBps", "ssd_write_GBps", "no read figure in the profile: its SSD write"),
        ("h2d_GBps", "d2h_GBps", "no host-to-device figure in the profile: its device-to-host"),
    ):
        q: Quoted | None = getattr(pf, key)
        if q is not None:
            sources[key] = (q.kind, q.source)
            out.append(_number(q, path, key) * GB)
            continue
        base: Quoted = getattr(pf, fallback)
        sources[key] = ("assumed", f"{why} figure, {base.value} GB/s")
        out.append(_number(base, path, fallback) * GB)
    return out[0], out[1]


class CpuCostFile(BaseModel):
    """configs/hardware/cpu-cost/reference.yaml: CPU-seconds per GB durable per engine,
    measured by a run (scripts/cpu_cost.py writes it), charged to every server profile."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    class Engine(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)
        total: float
        persist: float | None = None

    kind: Kind
    source: str
    engines: dict[str, Engine]


CPU_COST = Path("cpu-cost") / "reference.yaml"


def reference_cpu_cost(
    directory: Path = PROFILES_DIR,
) -> tuple[tuple[tuple[str, float, float], ...], str]:
    """((engine, CPU-s per GB whole save, persist phase), ...) and its source, from
    `directory`/cpu-cost/reference.yaml; empty (every cores verdict "unknown") without it."""
    path = Path(directory) / CPU_COST
    if not path.is_file():
        return (), ""
    f = _validated(path, CpuCostFile)
    rows = tuple(
        (e, v.total, v.persist if v.persist is not None else math.nan) for e, v in f.engines.items()
    )
    return rows, f"{f.source} ({f.kind})"


def _optional_int(
    q: Quoted | None, path: str, key: str, sources: dict[str, tuple[str, str]]
) -> int | None:
    if q is None:
        return None
    sources[key] = (q.kind, q.source)
    return int(_number(q, path, key))


def load_profiles(directory: Path = PROFILES_DIR) -> list[Profile]:
    """Every complete profile in the directory (the placeholder filled from a run is skipped)."""
    out = []
    for name in profile_names(directory):
        pf, _ = _read_profile_file(name, directory)
        if not pf.filled_from_run:
            out.append(load_profile(name, directory))
    return out


def with_size(p: Profile, size: int) -> Profile:
    return replace(p, size_bytes=size)


def with_ssds(p: Profile, n: int) -> Profile:
    return replace(p, ssds_per_gpu=n)
