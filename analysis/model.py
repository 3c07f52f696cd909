"""The analytical model of one GPU's checkpoint: stall, time to durability and host memory per
engine, and the SSD count per GPU that GPUDirect Storage needs to stall no longer than a
CPU-centric snapshot.

Symbols (one GPU's share; bandwidths in B/s):

    S     checkpoint size (one GPU's shard)
    b     device-to-host bandwidth of the GPU's link (D2H)
    L     the GPU's link for peer-to-peer GDS writes (defaults to b: the same x16 link)
    w     sequential write bandwidth of one SSD; n SSDs per GPU
    W(n)  aggregate write bandwidth: n * w, or w when every target is on one device
    g     GPUs sharing the host path (they checkpoint at once and share host memory)
    C     host memory-copy bandwidth of the whole host; c = C / g is one GPU's share

    engine      stall                     time to durability            host memory
    gds         S / min(L, W(n))          = stall                       0
    cpu-single  S / b                     S/b + S/W(n)                  S   (pinned staging)
    cpu-double  S / b                     S/b + S/min(c, W(n))          2 S (staging + page cache)
    torch-save  S/b + S/min(c, w)         = stall (one file, 1 SSD)     S   (page cache)
    dcp         S / b                     S/b + S/min(c, w) (1 SSD)     2 S (staging + page cache)

    GDS stall / CPU-centric stall   R(n) = b / min(L, W(n))
    break-even                      n* = b / w   (R(n) <= 1 for n >= n*; infinite if L < b, or
                                    if all targets share one device and w < b)

Many GPUs of one host checkpointing at once (`predict_shared`): g ranks, each saving its shard
S_r, share the host's m SSDs and its memory bandwidth C (g = GPUs per host, m = SSDs per host
when all of them save together). Every rank gets a fair share:

    W_h = W(m) (the host's storage), W_r = W_h / g, c_g = C / g, s_g = min(b, c_g) (snapshot)
    s1  = w / g with shared targets (every rank's first target is the host's first SSD), or
          min(w, W_r) with dedicated ones

    engine      per-rank stall              per-rank time to durability
    gds         S_r / min(L, W_r)           = stall
    cpu-single  S_r / s_g                   S_r/s_g + S_r/W_r
    cpu-double  S_r / s_g                   S_r/s_g + S_r/min(c_g, W_r)
    torch-save  S_r/s_g + S_r/min(c_g, s1)  = stall
    dcp         S_r / s_g                   S_r/s_g + S_r/min(c_g, s1)

    aggregate write bandwidth = g S_r / (per-rank time to durability)

Shared and dedicated targets get the same share of W_h here (the model has no interference
between ranks beyond bandwidth): their difference in a measured run is what it leaves out.

Assumptions: the snapshot and the persist phases of the CPU-centric engines run one after the
other (as the engines do); the page-cache copy of buffered writes overlaps the writeback; D2H
contention between GPUs and DRAM bandwidth for DMA are not modelled (give a lower `d2h` if
GPUs share one uplink). torch.save's own serialisation cost is not modelled: it is known to
reach under a third of NVMe write speed (pytorch/pytorch issue 124195), so expect the model to
be optimistic for it.

Inputs come from hardware profiles (`configs/hardware/*.yaml`, every figure with its kind and
source) or from a measured run (`from_run`).
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
| engine | stall | time to durability | host memory |
|---|---|---|---|
| gds | S / min(L, W(n)) | = stall | 0 |
| cpu-single | S / b | S/b + S/W(n) | S (pinned staging) |
| cpu-double | S / b | S/b + S/min(c, W(n)) | 2 S (staging + page cache) |
| torch-save | S/b + S/min(c, w) | = stall (one file, first SSD) | S (page cache) |
| dcp | S / b | S/b + S/min(c, w) (first SSD) | 2 S (staging + page cache) |

S: checkpoint size of one GPU; b: device-to-host bandwidth; L: the GPU's link for GDS
(= b unless given); w: write bandwidth of one SSD, n SSDs per GPU, W(n) = n w (= w when all
targets share one device); c = C / g: the host's memory-copy bandwidth C shared by the g GPUs
that checkpoint at once. GDS stall / CPU-centric stall R(n) = b / min(L, W(n)); break-even
n* = b / w SSDs per GPU."""


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
        """W(n): aggregate write bandwidth of n SSDs (no scaling when they share one device)."""
        return self.ssd_write_Bps if self.shared_device else n * self.ssd_write_Bps


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


def _through(
    t: Traits, s: float, snap_bw: float, link: float, storage: float, first: float, copy: float
) -> tuple[float, float]:
    """(stall, time to durability) of `s` bytes through an engine with traits `t`: `storage`
    the write bandwidth of its targets when it stripes, `first` when it writes one target,
    `copy` the memory-copy share that bounds a page-cache path, `snap_bw` its snapshot."""
    w = storage if t.stripes else first
    if t.from_device:  # straight from device memory: no snapshot, stalls until durable
        d = s / min(link, w)
        return d, d
    write = s / (min(copy, w) if t.page_cache else w)
    snap = s / snap_bw
    return (snap if t.stall == "snapshot" else snap + write), snap + write


def predict(
    p: Profile, engine: str, n_ssds: float, size: float | None = None, traits: Traits | None = None
) -> Prediction:
    """Stall, time to durability and host memory of one GPU's checkpoint through `engine`."""
    t = traits_of(engine, traits)
    s = float(p.size_bytes if size is None else size)
    stall, durable = _through(
        t, s, p.d2h_Bps, p.link, p.storage_Bps(n_ssds), p.ssd_write_Bps, p.copy_per_gpu
    )
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
    """Per-rank stall, time to durability and host memory when `ranks` ranks of one host save a
    shard of `size` each at once over the host's `ssds_host` SSDs (default: the profile's GPUs
    and SSDs per host); `mapping` (shared or dedicated) matters only for the engines that write
    into each rank's first target. See the module docstring for the formulas."""
    if ranks < 1:
        raise UserError(f"model: ranks must be at least 1, got {ranks}")
    t = traits_of(engine, traits)
    g = float(ranks)
    s = float(p.size_bytes if size is None else size)
    m = float(p.host_ssds if ssds_host is None else ssds_host)
    w_r = p.storage_Bps(m) / g
    c_g = p.host_copy_Bps / g
    first = p.ssd_write_Bps / g if mapping == "shared" else min(p.ssd_write_Bps, w_r)
    stall, durable = _through(t, s, min(p.d2h_Bps, c_g), p.link, w_r, first, c_g)
    return Prediction(engine, stall, durable, t.host_copies * s)


def predict_all(p: Profile, n_ssds: float, size: float | None = None) -> list[Prediction]:
    return [predict(p, e, n_ssds, size) for e in ENGINES]


def stall_ratio(p: Profile, n_ssds: Any) -> Any:
    """R(n) = GDS stall / CPU-centric stall = b / min(L, W(n)); works on arrays."""
    n = np.asarray(n_ssds, dtype=float)
    wn = np.full_like(n, p.ssd_write_Bps) if p.shared_device else n * p.ssd_write_Bps
    r = p.d2h_Bps / np.minimum(p.link, wn)
    return float(r) if r.ndim == 0 else r


def break_even(p: Profile) -> float:
    """n*: SSDs per GPU from which GDS stalls no longer than a CPU-centric snapshot (may be inf)."""
    if p.link < p.d2h_Bps:
        return math.inf
    n = p.d2h_Bps / p.ssd_write_Bps
    if p.shared_device:
        return 1.0 if n <= 1 else math.inf
    return n


def break_even_ssds(p: Profile) -> int | None:
    """The whole number of SSDs per GPU for the break-even (None: never)."""
    n = break_even(p)
    return None if math.isinf(n) else max(1, math.ceil(n - 1e-9))


# --- profiles ------------------------------------------------------------------------------


def profile_names(directory: Path = PROFILES_DIR) -> list[str]:
    return sorted(f.stem for f in directory.glob("*.yaml"))


def _read_profile_file(name: str, directory: Path) -> tuple[ProfileFile, str]:
    path = Path(name)
    if not (path.suffix in (".yaml", ".yml") and path.is_file()):
        path = directory / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(profile_names(directory)) or "none"
        raise UserError(f"unknown hardware profile {name!r} (known: {known}; or a .yaml path)")
    try:
        raw = yaml.safe_load(path.read_text())
        return ProfileFile.model_validate(raw), str(path)
    except yaml.YAMLError as e:
        raise UserError(f"{path}: not valid YAML ({e})") from None
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
        raise UserError(f"{path}: {where}: {msg}") from None


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
    )


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
    """'This machine' calibrated from a measured run (analysis.runs.Run).

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
    return Profile(
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
    }
    src = p.sources or {}
    out = []
    for k, label in INPUT_LABELS.items():
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


def describe_break_even(p: Profile) -> str:
    n = break_even(p)
    b, w = p.d2h_Bps / GB, p.ssd_write_Bps / GB
    if math.isinf(n):
        if p.shared_device:
            return (
                f"break-even: never on this storage (all targets share one device: "
                f"{w:.2f} GB/s < b = {b:.2f} GB/s, and adding targets does not add bandwidth)"
            )
        return f"break-even: never (GDS link L = {p.link / GB:.2f} GB/s < b = {b:.2f} GB/s)"
    return (
        f"break-even: {break_even_ssds(p)} SSDs per GPU (n* = b / w = {b:.2f} / {w:.2f} = {n:.2f}); "
        f"today's 8-GPU servers carry about 1 data SSD per GPU (shared/reference/figures.md)"
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
    n = p.ssds_per_gpu
    lines += ["", f"one GPU's checkpoint of {fmt_bytes(p.size_bytes)} with {n} SSD(s) per GPU:"]
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
    lines += ["", "GDS stall / CPU-centric stall, by SSDs per GPU:"]
    lines.append(
        text_table(
            ["SSDs per GPU", *[str(c) for c in counts]],
            [["ratio", *[f"{r:.2f}" for r in ratios]]],
        )
    )
    lines += ["", describe_break_even(p)]
    lines += ["", sharing_text(p)]
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
            pr = predict_shared(p, e, g, m)
            cells.append(f"{pr.stall_s:.3g} ({g * p.size_bytes / pr.durable_s / GB:.3g})")
        rows.append([str(g), *cells])
    return head + "\n" + text_table(["g GPUs", *ENGINES], rows)
