"""The analytical model: stall, time to durability and host memory of each engine's checkpoint
when g GPUs of one host checkpoint at once (the case the paper is about), and the SSD count per
GPU that GPUDirect Storage needs to stall no longer than a CPU-centric snapshot. One function,
`predict`, gives every number: the tables, the headline, Figure 2 and Figure 4.

Symbols (bandwidths in B/s):

    S     checkpoint size of one GPU (its shard)
    b     device-to-host bandwidth of one GPU's link (D2H)
    L     the GPU's link for peer-to-peer GDS writes (defaults to b: the same x16 link)
    C     what the host's memory takes in, all GPUs together (memory-copy bandwidth)
    w     sequential write bandwidth of one SSD; W(m) that of m SSDs (m w, or as measured; w
          when every target is on one device)
    P(m)  the page-cache path's own rate to durability over m SSDs (buffered write + fsync;
          min(C, W(m)) unless measured); P1(m) the same with one writer (torch.save and
          safetensors write with one thread), P(m) unless measured
    z     serialisation rate of a library that turns tensors into a file format on the CPU
          (torch.save's zip, DCP's items); unlimited unless measured or given
    g     GPUs of the host checkpointing at once, sharing its m SSDs (m = n g for n per GPU)

    per GPU:  d = min(b, C / g)        its snapshot bandwidth (its share of the host's intake)
              W_g = W(m) / g           its share of the storage (striped over all m SSDs)
              w_1 = w / g              its share of the first SSD (engines that do not stripe,
                                       with targets shared; min(w, W_g) with dedicated ones)

    engine (traits)                        write rate r                  stall        durable
    from device (gds)                      W_g                           S/min(L,r)   = stall
    snapshot, O_DIRECT (cpu-single)        W_g                           S/d          S/d + S/r
    snapshot, page cache (cpu-double)      min(P(m)/g, C/g)              S/d          S/d + S/r
    durable, page cache, 1 SSD (torch-save) 1/(1/min(P1(1)/g, C/g) + 1/z) S/d + S/r   = stall
    snapshot, page cache, 1 SSD (dcp)      1/(1/min(P1(1)/g, C/g) + 1/z) S/d          S/d + S/r
    durable, O_DIRECT, 1 SSD (fastpersist) 1/(1/w_1 + 1/z)               S/d + S/r    = stall

    An engine that serialises (trait `serializes`: torch.save's zip, DCP's items, FastPersist's
    torch.save into its writer) takes S/z for the format and then S/(write rate) for the bytes:
    the thread that serialises an item also issues its write, so the two do not overlap, and
    under the GIL the serialisation of several writer threads does not either: its page-cache
    rate is the one-writer P1.

    host memory = host copies x S (0 gds, 1 cpu-single and torch-save, 2 cpu-double and dcp)

    GDS stall / CPU-centric stall   R = d / min(L, n w) with n SSDs per GPU
    break-even                      n* = d / w = min(b, C/g) / w (infinite if L < d, or if all
                                    targets share one device and w < d)

Every engine is placed by its traits (bench.engines.traits), read from the run's env.json, so a
new engine gets its line without a change here. On a measured run (`from_run`) the inputs are
the run's device ceilings, never the engines' own rows: b and C the copy (or device-to-host)
ceiling, W(n) and P(n) the O_DIRECT and buffered ceilings of n targets, z the torch.save
ceiling; the model then predicts every engine's rows (`model_vs_measured`).

Assumptions: the snapshot and persist phases run one after the other (as the engines do); every
GPU gets a fair share of the host's intake and storage; interference beyond bandwidth (locks,
page-cache reclaim, a memory balloon) is not modelled.

Inputs come from hardware profiles (`configs/hardware/*.yaml`, every figure with its kind and
source) or from a measured run (`from_run`).

What checkpointing costs the host (`host_need`): every GPU of the host checkpointing at the
rate R = W(m) its m SSDs write together, cores = CPU-seconds per GB durable (measured by a run:
configs/hardware/cpu-cost/reference.yaml, or the run's own) x R, DRAM = the path's bytes moved
per checkpoint byte (derived from its copies, bench.engines.traits.Traits.dram_per_byte) x R,
against the host's cores and DRAM bandwidth as the profile cites them ("unknown" without).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from analysis.stats import device_ceiling
from bench.engines.traits import BUILTIN, Traits
from bench.errors import UserError
from bench.sizes import parse_size

ENGINES = tuple(BUILTIN)  # engines the profile tables show (a run's own come with its traits)
PROFILES_DIR = Path(__file__).resolve().parent.parent / "configs" / "hardware"
THIS_MACHINE = "this-machine"
GB = 1e9

FORMULAS_MD = """\
g GPUs of one host checkpoint at once; each has d = min(b, C/g) into host memory, W_g = W(m)/g of
the storage (m SSDs shared), and writes through the page cache at up to C/g.

| engine | write rate r | stall | time to durability | host memory |
|---|---|---|---|---|
| gds (from device) | W_g | S / min(L, r) | = stall | 0 |
| cpu-single (snapshot, O_DIRECT) | W_g | S / d | S/d + S/r | S (pinned staging) |
| cpu-double (snapshot, page cache) | min(P(m)/g, C/g) | S / d | S/d + S/r | 2 S (staging + page cache) |
| torch-save (durable, page cache, 1 SSD, one writer) | min(P1(1)/g, C/g, z) | S/d + S/r | = stall | S (page cache) |
| dcp (snapshot, page cache, 1 SSD) | min(P(1)/g, C/g, z) | S / d | S/d + S/r | 2 S (staging + page cache) |

S: checkpoint size of one GPU; b: its device-to-host link; L: its link for GDS (= b unless
given); C: what the host's memory takes in from all GPUs; w: one SSD's write bandwidth, W(m) of
m SSDs (m w; w when all targets share one device; as measured on this machine); P(m): the
page-cache path to durability (as measured, else W(m)); P1(m): the same with one writer, for
engines that write with one thread (as measured, else P(m)); z: the serialisation rate of torch.save
and DCP (as measured). GDS stall / CPU-centric stall R = d / min(L, n w) with n SSDs per GPU;
break-even n* = d / w. Every engine is placed by its traits, so a new one gets its row."""


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
        measured = dict(self.direct_by_n)
        if n in measured:
            return measured[n]
        return self.ssd_write_Bps if self.shared_device else n * self.ssd_write_Bps

    def page_cache_Bps(self, n: float, single_writer: bool = False) -> float:
        """P(n): the page-cache path's rate to durability over n SSDs (as measured, else W(n);
        the host's copy share bounds it in `predict`); P1(n) for one writer when measured."""
        measured = dict(self.buffered_by_n)
        if single_writer and n in dict(self.buffered_single_by_n):
            return dict(self.buffered_single_by_n)[n]
        return measured.get(n, self.storage_Bps(n))


@dataclass(frozen=True)
class Prediction:
    engine: str
    stall_s: float
    durable_s: float
    host_bytes: float


def traits_of(engine: str, traits: Traits | None = None) -> Traits:
    """An engine's traits: as given (from a run's env.json), else the built-in engines'."""
    t = traits or BUILTIN.get(engine)
    if t is None:
        raise UserError(f"model: no traits for engine {engine!r} (known: {', '.join(ENGINES)})")
    return t


def predict(
    p: Profile,
    engine: str,
    ssds: float | None = None,
    size: float | None = None,
    traits: Traits | None = None,
    g: int | None = None,
    mapping: str = "shared",
) -> Prediction:
    """One GPU's stall, time to durability and host memory when `g` GPUs of the host (default:
    the profile's `gpus_sharing_host`) checkpoint at once over `ssds` SSDs they share (default:
    `ssds_per_gpu` for each of them). `mapping` (shared or dedicated targets) matters only for
    the engines that write one target. The module docstring gives the formulas."""
    t = traits_of(engine, traits)
    g = g or p.gpus_sharing_host
    m = float(p.ssds_per_gpu * g if ssds is None else ssds)
    s = float(p.size_bytes if size is None else size)
    copy = p.host_copy_Bps / g
    d = min(p.d2h_Bps, copy)
    if t.stripes:
        direct, cache = p.storage_Bps(m) / g, p.page_cache_Bps(m) / g
    else:
        w_r = p.storage_Bps(m) / g
        direct = p.storage_Bps(1) / g if mapping == "shared" else min(p.storage_Bps(1), w_r)
        one = p.page_cache_Bps(1, t.single_writer or t.serializes)
        cache = one / g if mapping == "shared" else min(one, w_r)
    rate = min(cache, copy) if t.page_cache else direct
    if t.serializes and p.serialize_Bps:  # serialise, then write: one after the other
        rate = 1 / (1 / rate + 1 / p.serialize_Bps)
    if t.from_device:  # straight from device memory: no snapshot, stalls until durable
        dur = s / min(p.link, rate)
        return Prediction(engine, dur, dur, t.host_copies * s)
    snap = s / d
    durable = snap + s / rate
    stall = snap if t.stall == "snapshot" else durable
    return Prediction(engine, stall, durable, t.host_copies * s)


def predict_shared(
    p: Profile,
    engine: str,
    ranks: int,
    ssds_host: float | None = None,
    size: float | None = None,
    mapping: str = "shared",
    traits: Traits | None = None,
) -> Prediction:
    """`predict` for `ranks` GPUs of one host sharing its `ssds_host` SSDs (default: all the
    host's); kept for the multi-rank analysis."""
    if ranks < 1:
        raise UserError(f"model: ranks must be at least 1, got {ranks}")
    m = p.host_ssds if ssds_host is None else ssds_host
    return predict(p, engine, m, size, traits, g=ranks, mapping=mapping)


def predict_all(
    p: Profile, n_per_gpu: float, size: float | None = None, g: int | None = None
) -> list[Prediction]:
    """Every built-in engine with n SSDs per GPU, g GPUs at once (default: the profile's)."""
    g = g or p.gpus_sharing_host
    return [predict(p, e, n_per_gpu * g, size, g=g) for e in ENGINES]


def snapshot_Bps(p: Profile, g: int | None = None) -> float:
    """d = min(b, C / g): one GPU's snapshot bandwidth when g GPUs checkpoint at once."""
    return min(p.d2h_Bps, p.host_copy_Bps / (g or p.gpus_sharing_host))


def stall_ratio(p: Profile, n_ssds: Any, g: int | None = None) -> Any:
    """R = GDS stall / CPU-centric stall with n SSDs per GPU and g GPUs at once (`predict` of
    gds over cpu-single); works on arrays."""
    g = g or p.gpus_sharing_host
    n = np.atleast_1d(np.asarray(n_ssds, dtype=float))
    r = np.array(
        [
            predict(p, "gds", x * g, 1.0, g=g).stall_s
            / predict(p, "cpu-single", x * g, 1.0, g=g).stall_s
            for x in n
        ]
    )
    return float(r[0]) if np.ndim(n_ssds) == 0 else r


def break_even(p: Profile, g: int | None = None) -> float:
    """n*: SSDs per GPU from which GDS stalls no longer than a CPU-centric snapshot, with g
    GPUs at once (may be inf); the closed form of `stall_ratio` = 1."""
    d = snapshot_Bps(p, g)
    if p.link < d:
        return math.inf
    n = d / p.ssd_write_Bps
    if p.shared_device:
        return 1.0 if stall_ratio(p, 1, g) <= 1 else math.inf
    if p.direct_by_n:  # measured W(n): the fewest measured SSDs per GPU that break even
        per_gpu = sorted({k // (g or p.gpus_sharing_host) for k, _ in p.direct_by_n} - {0})
        return next((float(x) for x in per_gpu if stall_ratio(p, x, g) <= 1), math.inf)
    return n


def break_even_ssds(p: Profile, g: int | None = None) -> int | None:
    """The whole number of SSDs per GPU for the break-even (None: never)."""
    n = break_even(p, g)
    return None if math.isinf(n) else max(1, math.ceil(n - 1e-9))


# --- profiles ------------------------------------------------------------------------------


def profile_names(directory: Path = PROFILES_DIR) -> list[str]:
    return sorted(f.stem for f in directory.glob("*.yaml"))


def _validated(path: Path, model: Any) -> Any:
    """A YAML file read into a pydantic model; a bad file is a UserError naming the path and,
    for a bad value, the key."""
    try:
        return model.model_validate(yaml.safe_load(path.read_text()))
    except yaml.YAMLError as e:
        raise UserError(f"{path}: not valid YAML ({e})") from None
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
    sources = {k: (v.kind, v.source) for k, v in q.items()}
    if link is not None:
        sources["gds_link_GBps"] = (link.kind, link.source)
    for key in ("host_cores", "dram_GBps"):
        if (h := getattr(pf, key)) is not None:
            sources[key] = (h.kind, h.source)
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
    )


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


def _ceiling(env: dict[str, Any], key: str) -> float | None:
    """One target's (or the host's) ceiling from env.json["ceilings"], if the run has one."""
    return device_ceiling(env, key, 1, True)


def from_run(run: Any) -> Profile:
    """'This machine' calibrated from a measured run (analysis.runs.Run): from its device
    ceilings (what each typically did: the median of its runs, the mean of before and after the
    sweep), never from the engines' own rows, so that
    `model_vs_measured` is a prediction. b: the device-to-host ceiling (host-emulated: the copy
    ceiling, with the snapshot's threads); C: the copy ceiling; W(n) and P(n): the O_DIRECT and
    buffered + fsync ceilings of n targets; z: the torch.save ceiling. A run without ceilings
    (made before they were measured) falls back on its single-copy engine's rows, and says so.
    """
    c = run.env.get("ceilings")
    if not c or not c.get("per_ssd_count"):
        return _from_rows(run)
    after = run.env.get("ceilings_after") or {}
    rid, tag = run.run_id, "from run"
    shared = bool(run.shared_device)

    def typical(block: dict[str, Any], key: str) -> float | None:
        """What the device typically does (the median of the chosen configuration's runs),
        not the best run the efficiencies are judged against: the model predicts medians."""
        runs_ = block.get(f"{key}_runs")
        if runs_:
            return float(np.median(runs_))
        v = block.get(f"{key}_median_Bps") or block.get(f"{key}_Bps")
        return float(v) if v else None

    def both(n: str, key: str) -> float | None:
        vals = [
            v
            for v in (
                typical(c["per_ssd_count"].get(n, {}), key),
                typical(after.get("per_ssd_count", {}).get(n, {}), key),
            )
            if v
        ]
        return float(np.mean(vals)) if vals else None

    per_n = sorted(int(n) for n in c["per_ssd_count"])
    direct = tuple((n, v) for n in per_n if (v := both(str(n), "direct_write")))
    buffered = tuple((n, v) for n in per_n if (v := both(str(n), "buffered_write")))
    single = []
    for n in per_n:
        ones = [
            v
            for blk, top in ((c, c), (after, after))
            if (
                v := _probe_point(blk.get("per_ssd_count", {}).get(str(n), {}), top).get(
                    "buffered_write_1_Bps"
                )
            )
        ]
        if ones:
            single.append((n, float(np.mean(ones))))
    copies = [v for v in (typical(c, "copy"), typical(after, "copy")) if v]
    if not direct or not copies:  # a ceiling that failed (env.json ceilings_error)
        return _from_rows(run)
    copy = float(np.mean(copies))
    d2h = float(np.mean([v for v in (typical(c, "d2h"), typical(after, "d2h")) if v] or [copy]))
    ser = [v for v in (typical(c, "serialize"), typical(after, "serialize")) if v]
    n_min, w_min = direct[0]
    emu = " (host-emulated: a host memory copy)" if run.emulated else ""
    threads = c.get("copy_threads", 1)
    sources = {
        "d2h_GBps": (
            tag,
            f"env.json ceilings of run {rid}: "
            + (
                "d2h_runs"
                if c.get("d2h_Bps")
                else f"copy_runs{emu}, {threads} threads as the snapshot"
            )
            + ", the median of before and after the sweep",
        ),
        "ssd_write_GBps": (
            tag,
            f"env.json ceilings.direct_write_Bps of {n_min} target(s), run {rid}"
            + (" (all targets on one device)" if shared else f", divided by {n_min}"),
        ),
        "ssds_per_gpu": (tag, "distinct devices under the run's targets (env.json storage)"),
        "gpus_sharing_host": ("assumed", "one process checkpoints at a time"),
        "host_copy_GBps": (tag, f"env.json ceilings.copy_runs of run {rid} (median)"),
        "checkpoint_size": (tag, "the largest checkpoint of the run"),
    }
    n_dev = int(run.env.get("storage", {}).get("distinct_devices") or 1)
    notes = [
        f"W(n) and P(n) as measured for n = {', '.join(str(n) for n, _ in direct)} "
        "target(s); z = torch.save into memory "
        + (f"{c['serialize_Bps'] / GB:.2f} GB/s" if c.get("serialize_Bps") else "(not measured)")
    ]
    if shared:
        notes.append("all targets share one device: SSD-count scaling is not real")
    if run.emulated:
        notes.append("host-emulated run: 'D2H' is a host memory copy, gds is O_DIRECT from memory")
    host = _host_from_run(run, copy, sources)
    return Profile(
        **host,
        name=THIS_MACHINE,
        description=f"this machine ({run.env.get('host', '?')}, "
        f"{run.env.get('cpu', {}).get('model', '?')}), from the ceilings of run {rid}",
        d2h_Bps=d2h,
        ssd_write_Bps=w_min if shared else w_min / n_min,
        ssds_per_gpu=max(1, n_dev),
        gpus_sharing_host=1,
        host_copy_Bps=copy,
        size_bytes=int(run.ok["total_bytes"].max()),
        shared_device=shared,
        sources=sources,
        notes=tuple(notes),
        direct_by_n=direct,
        buffered_by_n=buffered,
        buffered_single_by_n=tuple(single),
        serialize_Bps=float(np.mean(ser)) if ser else None,
    )


def _probe_point(block: dict[str, Any], top: dict[str, Any]) -> dict[str, float]:
    """The ceilings measured before or after the sweep for one target count, in the keys of a
    probe (bench.ceiling.probe): the median of the chosen configuration's runs."""
    out: dict[str, float] = {}
    for mode in ("direct_write", "buffered_write"):
        runs_ = block.get(f"{mode}_runs")
        if runs_:
            out[f"{mode}_Bps"] = float(np.median(runs_))
    one = [r["Bps"] for r in block.get("buffered_write_search", []) if r.get("jobs") == 1]
    if block.get("buffered_write_config", {}).get("jobs") == 1 and "buffered_write_Bps" in out:
        one = [out["buffered_write_Bps"]]
    if one:
        out["buffered_write_1_Bps"] = float(one[0])
    for key in ("copy", "d2h", "serialize"):
        runs_ = top.get(f"{key}_runs")
        if runs_:
            out[f"{key}_Bps"] = float(np.median(runs_))
    return out


def near(p: Profile, run: Any, workload: str, n: int) -> Profile:
    """`p` (from_run) with the ceilings measured around one workload of the run: the probe taken
    just before its saves (env.json `ceilings_probes`) and its neighbours in time over the same
    target count (the ceilings before the sweep, the probes of the workloads before and after,
    the ceilings after), the median of those three. The disk of a VM drifts 2x within the
    hour; a model calibrated once for the whole run misses by that much. `p` unchanged when
    the run has no probes (older runs, probes off, multi-rank runs)."""
    probes = [q for q in run.env.get("ceilings_probes") or [] if q.get("n_targets") == n]
    at = [i for i, q in enumerate(probes) if q.get("workload") == workload]
    if not at:
        return p
    before, after = (
        _probe_point((c := run.env.get(key) or {}).get("per_ssd_count", {}).get(str(n), {}), c)
        for key in ("ceilings", "ceilings_after")
    )
    seq = [before, *probes, after]
    k = at[-1] + 1
    window = seq[k - 1 : k + 2]

    def med(key: str) -> float | None:
        vals = [float(q[key]) for q in window if q.get(key)]
        return float(np.median(vals)) if vals else None

    def put(pairs: tuple[tuple[int, float], ...], v: float | None) -> tuple[tuple[int, float], ...]:
        if v is None:
            return pairs
        return tuple(sorted({**dict(pairs), n: v}.items()))

    copy = med("copy_Bps") or p.host_copy_Bps
    d2h = med("d2h_Bps") or (copy if run.emulated else p.d2h_Bps)
    return replace(
        p,
        direct_by_n=put(p.direct_by_n, med("direct_write_Bps")),
        buffered_by_n=put(p.buffered_by_n, med("buffered_write_Bps")),
        buffered_single_by_n=put(p.buffered_single_by_n, med("buffered_write_1_Bps")),
        host_copy_Bps=copy,
        d2h_Bps=d2h,
        serialize_Bps=med("serialize_Bps") or p.serialize_Bps,
    )


def _from_rows(run: Any) -> Profile:
    """'This machine' from the single-copy engine's rows of a run without ceilings.

    d2h and host copy: the env.json ceilings when present, else the median snapshot bandwidth
    of cpu-single (total_bytes / stall_s), which stands for D2H (and, host-emulated, for a host
    memory copy). Per-SSD write: the ceiling `direct_write_Bps` when present, else cpu-single's
    median persist bandwidth (total_bytes / persist_s) at its smallest SSD count.
    """
    ok = run.ok
    single = run.first_with(stall="snapshot", o_direct=True, baseline=False)
    cs = ok[ok["engine"] == single]
    if cs.empty:
        raise UserError(
            f"{run.path}: no rows of a single-copy engine (cpu-single): cannot calibrate the "
            "model from this run"
        )
    snap = float(np.median(cs["total_bytes"] / cs["stall_s"]))
    n_min = int(cs["n_targets"].min())
    at_min = cs[cs["n_targets"] == n_min]
    persist = float(np.median(at_min["total_bytes"] / at_min["persist_s"]))
    shared = bool(run.shared_device)
    per_ssd = persist if shared else persist / n_min
    tag = "from run"
    rid = run.run_id
    snap_src = f"median total_bytes / stall_s of cpu-single over {len(cs)} rows of run {rid}"
    d2h = _ceiling(run.env, "d2h_Bps")
    copy = _ceiling(run.env, "copy_Bps")
    direct = _ceiling(run.env, "direct_write_Bps")
    emu = " (host-emulated: a host memory copy)" if run.emulated else ""
    sources = {
        "d2h_GBps": (tag, f"env.json ceilings.d2h_Bps of run {rid}")
        if d2h
        else (tag, f"snapshot bandwidth{emu}: {snap_src}"),
        "ssd_write_GBps": (tag, f"env.json ceilings.direct_write_Bps of run {rid}")
        if direct
        else (
            tag,
            f"median total_bytes / persist_s of cpu-single at {n_min} target(s), run {rid}"
            + (" (all targets on one device)" if shared else f", divided by {n_min}"),
        ),
        "ssds_per_gpu": (tag, "distinct devices under the run's targets (env.json storage)"),
        "gpus_sharing_host": ("assumed", "one process checkpoints at a time"),
        "host_copy_GBps": (tag, f"env.json ceilings.copy_Bps of run {rid}")
        if copy
        else (tag, "assumed equal to the snapshot bandwidth (no copy ceiling in env.json)"),
        "checkpoint_size": (tag, "the largest checkpoint of the run"),
    }
    n_dev = int(run.env.get("storage", {}).get("distinct_devices") or 1)
    table = run.env.get("ranks", {}).get("table") or []
    per_node = [
        sum(1 for t in table if t.get("node_rank") == n)
        for n in {t.get("node_rank") for t in table}
    ]
    if per_node:
        sources["gpus_per_host"] = (tag, f"ranks per node of run {rid} (env.json ranks.table)")
        sources["ssds_per_host"] = (tag, "distinct devices under the run's targets")
    notes = []
    if shared:
        notes.append("all targets share one device: W(n) = w, SSD-count scaling is not real")
    if run.emulated:
        notes.append("host-emulated run: 'D2H' is a host memory copy, gds is O_DIRECT from memory")
    host = _host_from_run(run, copy, sources)
    return Profile(
        **host,
        name=THIS_MACHINE,
        description=f"this machine ({run.env.get('host', '?')}, {run.env.get('cpu', {}).get('model', '?')}), from run {rid}",
        d2h_Bps=d2h or snap,
        ssd_write_Bps=direct or per_ssd,
        ssds_per_gpu=max(1, n_dev),
        gpus_sharing_host=1,
        host_copy_Bps=copy or d2h or snap,
        size_bytes=int(ok["total_bytes"].max()),
        shared_device=shared,
        sources=sources,
        notes=tuple(notes),
        gpus_per_host=max(per_node) if per_node else None,
        ssds_per_host=max(1, n_dev) if per_node else None,
    )


def _host_from_run(
    run: Any, copy_Bps: float | None, sources: dict[str, tuple[str, str]]
) -> dict[str, Any]:
    """The host inputs of 'this machine' from a run: its CPUs (env.json cpu.logical_cores,
    the CPUs the CPU-seconds were counted on), its DRAM bandwidth where the run shows one (a
    host-emulated run's copy ceiling moves 2 bytes of DRAM per byte copied: twice it is what
    the memory moved at least; a CUDA run's copy ceiling is the device link, not DRAM), and the
    CPU-seconds per GB each engine took in the run's own rows."""
    from analysis import cost

    rid = run.run_id
    cores = run.env.get("cpu", {}).get("logical_cores")
    out: dict[str, Any] = {
        "host_cores": float(cores) if cores else None,
        "dram_Bps": None,
        "dram_lower_bound": False,
    }
    if cores:
        sources["host_cores"] = ("from run", f"env.json cpu.logical_cores of run {rid}")
    if run.emulated and copy_Bps:
        out["dram_Bps"], out["dram_lower_bound"] = 2 * copy_Bps, True
        sources["dram_GBps"] = (
            "from run",
            f"2 x the copy ceiling of run {rid} (a memcpy reads and writes each byte): what "
            "the memory moved with the snapshot's threads, a lower bound of its bandwidth",
        )
    per = cost.cpu_cost(run)
    out["cpu_cost"] = tuple((e, t, p) for e, (t, p, _) in per.items())
    whats = sorted({w for _, _, w in per.values()})
    out["cpu_cost_source"] = (
        f"run {rid}: median CPU-seconds per GB durable of each engine's rows ("
        + ", ".join(
            "whole host, others and baseline taken away" if w == "host" else "process only"
            for w in whats
        )
        + ")"
        + (
            "; host-emulated: the snapshot is a CPU copy here, a DMA on a GPU"
            if run.emulated
            else ""
        )
    )
    return out


def with_size(p: Profile, size: int) -> Profile:
    return replace(p, size_bytes=size)


def with_ssds(p: Profile, n: int) -> Profile:
    return replace(p, ssds_per_gpu=n)


# --- the terminal table ----------------------------------------------------------------------

INPUT_LABELS = {
    "d2h_GBps": "device-to-host b",
    "gds_link_GBps": "GDS link L",
    "ssd_write_GBps": "SSD write w",
    "ssds_per_gpu": "SSDs per GPU n",
    "gpus_sharing_host": "GPUs sharing host g",
    "gpus_per_host": "GPUs per host",
    "ssds_per_host": "SSDs per host m",
    "host_copy_GBps": "host copy C",
    "checkpoint_size": "checkpoint S",
    "host_cores": "host CPU cores",
    "dram_GBps": "host DRAM bandwidth",
}


def fmt_bytes(n: float) -> str:
    """Decimal GB for model tables (the profiles quote GB and GB/s)."""
    return f"{n / GB:.3g} GB" if n else "0"


def input_rows(p: Profile) -> list[tuple[str, str, str, str]]:
    """(input, value, kind, source) for the profile's inputs."""
    values = {
        "d2h_GBps": f"{p.d2h_Bps / GB:.2f} GB/s",
        "gds_link_GBps": f"{p.link / GB:.2f} GB/s",
        "ssd_write_GBps": f"{p.ssd_write_Bps / GB:.2f} GB/s",
        "ssds_per_gpu": str(p.ssds_per_gpu),
        "gpus_sharing_host": str(p.gpus_sharing_host),
        "gpus_per_host": str(p.host_gpus),
        "ssds_per_host": str(p.host_ssds),
        "host_copy_GBps": f"{p.host_copy_Bps / GB:.1f} GB/s (c = {p.copy_per_gpu / GB:.1f} GB/s a GPU)",
        "checkpoint_size": fmt_bytes(p.size_bytes),
        "host_cores": "unknown" if p.host_cores is None else f"{p.host_cores:g}",
        "dram_GBps": "unknown" if p.dram_Bps is None else f"{p.dram_Bps / GB:.1f} GB/s",
    }
    src = p.sources or {}
    out = []
    for k, label in INPUT_LABELS.items():
        if k in ("host_cores", "dram_GBps") and k not in src:
            out.append((label, values[k], "unknown", "no cited figure in the profile"))
            continue
        if k == "gds_link_GBps" and k not in src:
            out.append((label, values[k], "derived", "= b (the GPU's own x16 link)"))
            continue
        if k == "gpus_per_host" and k not in src:
            out.append((label, values[k], "derived", "= g (the GPUs sharing the host)"))
            continue
        if k == "ssds_per_host" and k not in src:
            out.append((label, values[k], "derived", "= n x GPUs per host"))
            continue
        kind, source = src.get(k, ("", ""))
        out.append((label, values[k], kind, source))
    return out


def ratio_counts(p: Profile) -> list[int]:
    """SSD counts for the ratio row: powers of two to 16, plus the break-even and n."""
    counts = {1, 2, 4, 8, 16, p.ssds_per_gpu}
    be = break_even_ssds(p)
    if be is not None and be <= 64:
        counts.add(be)
    return sorted(counts)


def text_table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    out = [line.rstrip(), "  ".join("-" * w for w in widths)]
    for r in rows:
        out.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return "\n".join(out)


def describe_break_even(p: Profile, g: int | None = None) -> str:
    """The headline: break-even SSDs per GPU with g GPUs at once (default: the profile's)."""
    g = g or p.gpus_sharing_host
    n = break_even(p, g)
    d, w = snapshot_Bps(p, g) / GB, p.ssd_write_Bps / GB
    at = f" with {g} GPU(s) checkpointing at once" if g > 1 else ""
    most = max((k for k, _ in p.direct_by_n), default=0)
    if math.isinf(n):
        if p.shared_device:
            return (
                f"break-even{at}: never on this storage (all targets share one device: "
                f"{w:.2f} GB/s < d = {d:.2f} GB/s, and adding targets does not add bandwidth)"
            )
        if p.direct_by_n and p.link >= d:
            return (
                f"break-even{at}: not within the measured target counts (W({most}) = "
                f"{p.storage_Bps(most) / GB:.2f} GB/s < d = {d:.2f} GB/s)"
            )
        return f"break-even{at}: never (GDS link L = {p.link / GB:.2f} GB/s < d = {d:.2f} GB/s)"
    if p.direct_by_n and not p.shared_device:
        return (
            f"break-even{at}: {break_even_ssds(p, g)} SSDs per GPU (the fewest measured target "
            f"count where GDS stalls no longer than a CPU-centric snapshot; d = {d:.2f} GB/s)"
        )
    return (
        f"break-even{at}: {break_even_ssds(p, g)} SSDs per GPU (n* = d / w = {d:.2f} / {w:.2f} "
        f"= {n:.2f}, d = min(b, C/g)); GDS stalls {stall_ratio(p, p.ssds_per_gpu, g):.2f}x as "
        f"long as a CPU-centric snapshot with the {p.ssds_per_gpu} SSD(s) per GPU of this host"
    )


def feasibility_text(p: Profile) -> str:
    """What `ckptbench model PROFILE` prints."""
    lines = [f"profile {p.name}: {p.description}", ""]
    rows, sources = [], []
    for name, value, kind, source in input_rows(p):
        if source not in sources:
            sources.append(source)
        rows.append([name, value, kind, f"[{sources.index(source) + 1}]"])
    lines.append(text_table(["input", "value", "kind", "source"], rows))
    lines += [f"  [{i}] {s}" for i, s in enumerate(sources, 1)]
    for note in p.notes:
        lines.append(f"note: {note}")
    n, g = p.ssds_per_gpu, p.gpus_sharing_host
    lines += [
        "",
        f"each GPU's checkpoint of {fmt_bytes(p.size_bytes)}, {g} GPU(s) at once, "
        f"{n} SSD(s) per GPU:",
    ]
    rows = []
    for pr in predict_all(p, n):
        rows.append(
            [
                pr.engine,
                f"{pr.stall_s:.3g}",
                f"{pr.durable_s:.3g}",
                f"{fmt_bytes(pr.host_bytes)} ({pr.host_bytes / p.size_bytes:.0f} x S)",
            ]
        )
    lines.append(text_table(["engine", "stall s", "durable s", "host memory"], rows))
    counts = ratio_counts(p)
    ratios = stall_ratio(p, counts)
    lines += ["", f"GDS stall / CPU-centric stall, by SSDs per GPU ({g} GPU(s) at once):"]
    lines.append(
        text_table(
            ["SSDs per GPU", *[str(c) for c in counts]],
            [["ratio", *[f"{r:.2f}" for r in ratios]]],
        )
    )
    lines += ["", describe_break_even(p)]
    lines += ["", sharing_text(p)]
    lines += ["", host_text(p)]
    return "\n".join(lines)


def sharing_counts(p: Profile) -> list[int]:
    """GPUs checkpointing at once for the sharing table: powers of two up to the host's GPUs."""
    g = p.host_gpus
    return sorted({1, g} | {x for x in (2, 4, 8, 16) if x < g})


def sharing_text(p: Profile) -> str:
    """Per-rank stall and the host's aggregate write bandwidth when g GPUs of one host save
    their shards at once over its SSDs (shared targets; predict_shared)."""
    m, counts = p.host_ssds, sharing_counts(p)
    head = (
        f"g GPUs of one host saving their {fmt_bytes(p.size_bytes)} shards at once over "
        f"its {m} SSD(s), shared targets: per-rank stall s (aggregate GB/s to durability)"
    )
    rows = []
    for g in counts:
        cells = []
        for e in ENGINES:
            pr = predict(p, e, m, g=g)
            cells.append(f"{pr.stall_s:.3g} ({g * p.size_bytes / pr.durable_s / GB:.3g})")
        rows.append([str(g), *cells])
    return head + "\n" + text_table(["g GPUs", *ENGINES], rows)


# --- what checkpointing costs the host --------------------------------------------------------


@dataclass(frozen=True)
class HostNeed:
    """What checkpointing every GPU of the host at its SSDs' aggregate rate costs it, through
    one engine: cores (CPU-seconds per GB x GB/s), DRAM bandwidth (bytes moved per checkpoint
    byte x B/s), against what the host has. None: not known (no measured CPU cost for the
    engine, no cited figure for the host)."""

    engine: str
    rate_Bps: float  # the host's SSDs together: W(m) for all m of them
    cpu_s_per_GB: float | None
    cpu_s_per_GB_persist: float | None
    host_cores: float | None  # needed, the whole save
    host_cores_persist: float | None  # needed while persisting (beside training)
    cores_available: float | None
    dram_per_byte: float  # derived from the path's copies (bench.engines.traits)
    dram_per_byte_persist: float
    dram_Bps: float
    dram_Bps_persist: float
    dram_available_Bps: float | None
    verdict: str  # "affordable", "cannot afford: ...", or "unknown: ..."

    @property
    def dram_share_persist(self) -> float | None:
        """The share of the host's DRAM bandwidth training loses while the checkpoint
        persists beside it (None: the bandwidth is unknown; an upper bound where the profile's
        bandwidth is a lower bound, as a run's is)."""
        if not self.dram_available_Bps:
            return None
        return self.dram_Bps_persist / self.dram_available_Bps


def host_need(p: Profile, engine: str, traits: Traits | None = None) -> HostNeed:
    """`HostNeed` of one engine on profile p: every GPU of the host checkpointing at the rate
    its SSDs write together (W(m), m = the host's SSDs), whatever the engine's own rate, so
    that the engines compare at the same work. Cores = CPU-seconds per GB (measured: the
    reference run's for a server profile, the run's own for this machine) x that rate; DRAM =
    the path's derived bytes per byte (on a GPU; on this machine's emulation when the profile
    is a host-emulated run's) x that rate. A path the host cannot afford needs more cores or
    more DRAM bandwidth than it has (peak bandwidth: what it can use is less)."""
    t = traits_of(engine, traits)
    rate = p.storage_Bps(p.host_ssds)
    cost = {e: (tot, per) for e, tot, per in p.cpu_cost}
    tot, per = cost.get(engine, (None, None))
    per = None if per is None or math.isnan(per) else per
    cores = None if tot is None else tot * rate / GB
    cores_p = None if per is None else per * rate / GB
    emulated = p.name == THIS_MACHINE and any("host-emulated" in n for n in p.notes)
    stall_b, persist_b = t.dram_per_byte(emulated)
    dram, dram_p = (stall_b + persist_b) * rate, persist_b * rate
    short, unknown = [], []
    if cores is None:
        unknown.append(f"no measured CPU cost of {engine}")
    elif p.host_cores is None:
        unknown.append("no cited host cores")
    elif cores > p.host_cores:
        short.append(f"{cores:.0f} cores of {p.host_cores:g}")
    if p.dram_Bps is None:
        if dram > 0:
            unknown.append("no cited DRAM bandwidth")
    elif dram > p.dram_Bps and p.dram_lower_bound:
        unknown.append(
            f"{dram / GB:.0f} GB/s of DRAM, more than the {p.dram_Bps / GB:.0f} it was seen to move"
        )
    elif dram > p.dram_Bps:
        short.append(f"{dram / GB:.0f} GB/s of DRAM of {p.dram_Bps / GB:.0f}")
    if short:
        verdict = "cannot afford: " + ", ".join(short)
    elif unknown:
        verdict = "unknown: " + ", ".join(unknown)
    else:
        verdict = "affordable"
    return HostNeed(
        engine,
        rate,
        tot,
        per,
        cores,
        cores_p,
        p.host_cores,
        stall_b + persist_b,
        persist_b,
        dram,
        dram_p,
        p.dram_Bps,
        verdict,
    )


def host_needs(p: Profile, traits: dict[str, Traits] | None = None) -> list[HostNeed]:
    return [host_need(p, e, (traits or {}).get(e)) for e in (traits or ENGINES)]


def host_text(p: Profile) -> str:
    """The host's cost table of `ckptbench model PROFILE`."""

    def f(v: float | None, fmt: str) -> str:
        return "unknown" if v is None else fmt.format(v)

    needs = host_needs(p)
    rate = needs[0].rate_Bps if needs else p.storage_Bps(p.host_ssds)
    head = (
        f"what the host pays to checkpoint all {p.host_gpus} GPU(s) at its {p.host_ssds} SSDs' "
        f"{rate / GB:.3g} GB/s (host: {f(p.host_cores, '{:g}')} cores, "
        f"{f(None if p.dram_Bps is None else p.dram_Bps / GB, '{:.0f} GB/s')} "
        + (
            "of DRAM traffic seen, a lower bound of its bandwidth, so the share lost is an upper "
            "bound"
            if p.dram_lower_bound
            else "DRAM peak"
        )
        + "): cores = "
        "CPU-seconds per GB durable x GB/s; DRAM = bytes moved per checkpoint byte (derived "
        "from the path's copies) x GB/s; 'persisting' = the part beside training"
    )
    rows = []
    for n in needs:
        share = n.dram_share_persist
        rows.append(
            [
                n.engine,
                f(n.cpu_s_per_GB, "{:.2f}"),
                f(n.host_cores, "{:.1f}"),
                f(n.host_cores_persist, "{:.1f}"),
                f"{n.dram_per_byte:g}",
                f"{n.dram_Bps / GB:.1f}",
                f(None if share is None else 100 * share, "{:.1f}"),
                n.verdict,
            ]
        )
    table = text_table(
        [
            "engine",
            "CPU s/GB",
            "cores",
            "cores persisting",
            "DRAM B/B",
            "DRAM GB/s",
            "DRAM % lost persisting",
            "verdict",
        ],
        rows,
    )
    src = f"CPU-seconds per GB: {p.cpu_cost_source or 'none measured'}"
    # indented under its heading (and so never read as the per-engine table above it)
    return head + "\n" + "\n".join("  " + ln for ln in table.splitlines()) + "\n" + src


# --- what checkpointing costs training -------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """How often to checkpoint through one engine, and what it costs (seconds, fractions)."""

    engine: str
    interval_s: float  # compute time between checkpoints
    lost_fraction: float  # expected fraction of wall time lost to stalls and rework
    stall_s: float
    durable_s: float
    host_bytes: float
    limited_by_persist: bool  # the optimum was shorter than the time to persist


def plan(
    p: Profile,
    mtbf_s: float,
    restart_s: float = 0.0,
    g: int | None = None,
    traits: dict[str, Traits] | None = None,
) -> list[Plan]:
    """The checkpoint interval that minimises lost time per engine, with the engine's stall as
    the checkpoint cost delta and failures every `mtbf_s` on average (Daly's higher-order
    estimate of Young's optimum, see analysis/README.md):

        tau = sqrt(2 delta M) (1 + sqrt(delta / 2M) / 3 + delta / 18M) - delta   (delta < 2M)
        tau = M                                                                   (else)

    A path that persists in the background never checkpoints faster than it persists
    (tau >= durable - stall), and a failure loses the work since the last *durable*
    checkpoint. Expected lost fraction, first order:

        f = delta / (tau + delta) + (tau / 2 + (durable - stall) + restart) / M
    """
    if not mtbf_s > 0:
        raise UserError(f"model: --mtbf must be positive, got {mtbf_s / 3600:g} hours")
    out = []
    for e in traits or {k: BUILTIN[k] for k in ENGINES}:
        t = (traits or {}).get(e)
        pr = predict(p, e, traits=t, g=g)
        delta, lag, m = pr.stall_s, pr.durable_s - pr.stall_s, mtbf_s
        if delta < 2 * m:
            x = delta / (2 * m)
            tau = math.sqrt(2 * delta * m) * (1 + math.sqrt(x) / 3 + x / 9) - delta
        else:
            tau = m
        limited = tau < lag
        tau = max(tau, lag, 1e-9)
        f = delta / (tau + delta) + (tau / 2 + lag + restart_s) / m
        out.append(Plan(e, tau, min(f, 1.0), delta, pr.durable_s, pr.host_bytes, limited))
    return out


def plan_text(p: Profile, mtbf_h: float, restart_s: float = 0.0) -> str:
    g = p.gpus_sharing_host
    rows = []
    for pl in plan(p, mtbf_h * 3600, restart_s):
        rows.append(
            [
                pl.engine,
                f"{pl.stall_s:.3g}",
                f"{pl.durable_s:.3g}",
                f"{pl.interval_s / 60:.3g}" + (" (persist)" if pl.limited_by_persist else ""),
                f"{100 * pl.lost_fraction:.2f}",
                fmt_bytes(pl.host_bytes),
            ]
        )
    head = (
        f"checkpoint interval for an MTBF of {mtbf_h:g} h ({g} GPU(s) at once, "
        f"{fmt_bytes(p.size_bytes)} each, restart {restart_s:g} s): Young/Daly with the "
        "stall as the cost; '(persist)': held back to the time to persist"
    )
    return (
        head
        + "\n"
        + text_table(
            ["engine", "stall s", "durable s", "interval min", "lost %", "host memory"], rows
        )
    )


def plan_json(p: Profile, mtbf_h: float, restart_s: float = 0.0) -> dict[str, Any]:
    """The plan as JSON; each engine also says what checkpointing every GPU at the SSDs'
    rate costs the host (`host_need`): `host_cores` and `dram_GBps` needed (null: unknown),
    beside the host's own (`host`)."""
    needs = {n.engine: n for n in host_needs(p)}
    rate = next(iter(needs.values())).rate_Bps if needs else p.storage_Bps(p.host_ssds)
    src = p.sources or {}
    return {
        "profile": p.name,
        "mtbf_hours": mtbf_h,
        "restart_s": restart_s,
        "gpus_at_once": p.gpus_sharing_host,
        "checkpoint_bytes": p.size_bytes,
        "host": {
            "cores": p.host_cores,
            "dram_GBps": None if p.dram_Bps is None else p.dram_Bps / GB,
            "ssd_rate_GBps": rate / GB,
            "cores_source": src.get("host_cores", ("unknown", "no cited figure"))[1],
            "dram_source": src.get("dram_GBps", ("unknown", "no cited figure"))[1],
            "cpu_cost_source": p.cpu_cost_source or None,
        },
        "engines": {
            pl.engine: {
                "interval_s": pl.interval_s,
                "lost_fraction": pl.lost_fraction,
                "stall_s": pl.stall_s,
                "durable_s": pl.durable_s,
                "host_bytes": pl.host_bytes,
                "limited_by_persist": pl.limited_by_persist,
                **_need_json(needs[pl.engine]),
            }
            for pl in plan(p, mtbf_h * 3600, restart_s)
        },
    }


def _need_json(n: HostNeed) -> dict[str, Any]:
    return {
        "host_cores": n.host_cores,
        "host_cores_persisting": n.host_cores_persist,
        "cpu_s_per_GB": n.cpu_s_per_GB,
        "dram_GBps": n.dram_Bps / GB,
        "dram_GBps_persisting": n.dram_Bps_persist / GB,
        "dram_bytes_per_byte": n.dram_per_byte,
        "dram_source": "derived",
        "dram_share_lost_persisting": n.dram_share_persist,
        "host_verdict": n.verdict,
    }
