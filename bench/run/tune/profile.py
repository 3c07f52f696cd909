"""The tuned profile: what `ckptbench tune` found, as YAML, and how `ckptbench run --tuned` (and
`make peers TUNED=...`, scripts/peers.py) use it.

The profile names the host and each target's file system and block device as env.json records
them (bench.measure.env.targets_info), the budget and the state of the trials, and per SSD count
and engine the default and the best setting with their durable GB/s and every trial. It is
written atomically (a temporary file beside it, fsynced, renamed), so an interrupted tune leaves
none. Reading it back checks every field (one line naming the first that is wrong), and `run
--tuned` (and peers) refuses it when the run's host, or a target's file system or device, differs.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from typing import Any

import yaml
from pydantic import Field

from bench.common.errors import UserError
from bench.common.schema import Strict, validated
from bench.measure import env as env_mod

VERSION = 1
# What must match between the profile's targets and the run's: the file system, and the block
# device (its kernel name and model; `dev` numbers may change across boots).
MATCHED = ("fstype", "disk", "model")


class TargetRecord(Strict):
    """One target as the tune saw it."""

    path: str
    mount: str
    fstype: str
    disk: str = ""
    model: str = ""


class TrialRecord(Strict):
    setting: dict[str, Any]
    round: int = Field(ge=0)
    durable_GBps: float = Field(ge=0)
    wall_s: float = Field(ge=0)
    run: str = ""
    error: str = ""


class SearchRecord(Strict):
    """One engine on one SSD count."""

    ssd_count: int = Field(ge=1)
    engine: str
    default: dict[str, Any]
    default_GBps: float = Field(ge=0)
    best: dict[str, Any] | None
    best_GBps: float = Field(ge=0)
    stopped: str
    trials: list[TrialRecord]


class Profile(Strict):
    """A tuned profile (see the module's doc)."""

    ckptbench_tune: int
    host: str
    config: str
    overrides: list[str] = []
    budget_s: float = Field(gt=0)
    took_s: float = Field(ge=0)
    total_bytes: int = Field(gt=0)
    tensor_bytes: int = Field(gt=0)
    targets: list[TargetRecord] = Field(min_length=1)
    results: list[SearchRecord]
    skipped: dict[str, str] = {}


def target_records(targets: list[str]) -> list[dict[str, Any]]:
    """Each target's file system and device, from env.json's own reading of them."""
    info = env_mod.targets_info(targets)["targets"]
    return [
        {
            "path": r["path"],
            "mount": r["mount"],
            "fstype": r["fstype"],
            "disk": str(r["block"].get("disk", "")),
            "model": str(r["block"].get("model", "")),
        }
        for r in info
    ]


def build(*, targets: list[str], **fields: Any) -> dict[str, Any]:
    """A profile's mapping, checked as `load` will check it."""
    d = {"ckptbench_tune": VERSION, **fields, "targets": target_records(targets)}
    validated(Profile, d, "profile")
    return d


def write(d: dict[str, Any], path: str) -> None:
    """`d` as YAML at `path`, atomically: a reader sees the old file or the whole new one."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tune-", suffix=".yaml", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            yaml.safe_dump(d, f, sort_keys=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    dfd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def load(path: str) -> Profile:
    """The profile at `path`; a missing, unparsable or incomplete one is a one-line error."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise UserError(f"--tuned {path}: cannot read it ({e.strerror})") from None
    try:
        d = yaml.safe_load(raw)
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        raise UserError(f"--tuned {path}: not YAML{at}: a corrupt profile") from None
    prof: Profile = validated(Profile, d, f"--tuned {path}")
    if prof.ckptbench_tune != VERSION:
        raise UserError(
            f"--tuned {path}: ckptbench_tune: version {prof.ckptbench_tune}, this ckptbench "
            f"reads {VERSION}"
        )
    return prof


def digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _existing(path: str) -> str:
    """`path`, or its nearest existing parent (a target the run has not created yet)."""
    p = os.path.abspath(path)
    while not os.path.exists(p):
        p = os.path.dirname(p)
    return p


def check(prof: Profile, targets: list[str], where: str, host: str) -> None:
    """Refuse `prof` for a run on `host` over `targets` unless it was tuned on the same host and
    each target sits on the same file system and device as the profile's target of its rank."""
    if prof.host != host:
        raise UserError(f"{where}: host: tuned on {prof.host!r}, this is {host!r}")
    if len(targets) > len(prof.targets):
        raise UserError(
            f"{where}: targets: the run uses {len(targets)}, the profile was tuned on "
            f"{len(prof.targets)}"
        )
    now = target_records([_existing(t) for t in targets])
    for i, (mine, theirs) in enumerate(zip(now, prof.targets, strict=False)):
        for key in MATCHED:
            if mine[key] != getattr(theirs, key):
                raise UserError(
                    f"{where}: targets.{i}.{key}: tuned on {getattr(theirs, key)!r}, "
                    f"{targets[i]} is on {mine[key]!r}"
                )


def choose(prof: Profile, engines: list[str], ssd_counts: list[int]) -> dict[str, dict[str, Any]]:
    """Per engine of the run, the profile's search it takes its knobs from: the largest SSD count
    of the run that the profile tuned (else the profile's largest below it). One set of options
    serves every SSD count of a run, as engine_options does."""
    out: dict[str, dict[str, Any]] = {}
    for e in engines:
        mine = [r for r in prof.results if r.engine == e and r.best is not None]
        if not mine:
            continue
        top = max(ssd_counts)
        fit = [r for r in mine if r.ssd_count <= top] or mine
        r = max(fit, key=lambda r: r.ssd_count)
        out[e] = {
            "ssd_count": r.ssd_count,
            "knobs": dict(r.best or {}),
            # what the tune measured, for a report's default vs tuned
            "default_GBps": r.default_GBps,
            "tuned_GBps": r.best_GBps,
        }
    return out


def resolve(
    path: str, targets: list[str], engines: list[str], ssd_counts: list[int], host: str
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """The profile at `path` for a run on `host` over `targets` with `engines` at `ssd_counts`
    (refused in one line as `check` and `load` say, or when it tuned none of the engines): per
    engine its chosen search (`choose`), and env.json's `tuned` block (the profile, its digest,
    its budget and what was applied). `run --tuned` and `make peers TUNED=` both come here."""
    where = f"--tuned {path}"
    prof = load(path)
    check(prof, targets, where, host)
    chosen = choose(prof, engines, ssd_counts)
    if not chosen:
        raise UserError(f"{where}: results: no engine of the run ({', '.join(engines)}) tuned")
    block = {
        "profile": path,
        "sha256": digest(path),
        "budget_s": prof.budget_s,
        "applied": chosen,
    }
    return chosen, block


def apply(path: str, cfg: Any, host: str) -> tuple[list[str], dict[str, Any]]:
    """`run --tuned PATH` for config `cfg`: the `--set` overrides that apply the profile's knobs,
    and env.json's `tuned` block (see `resolve`)."""
    targets = cfg.resolved_targets()[: max(cfg.ssd_counts)]
    chosen, block = resolve(path, targets, cfg.engines, cfg.ssd_counts, host)
    sets = [f"engine_options.{e}.{k}={v}" for e, c in chosen.items() for k, v in c["knobs"].items()]
    return sets, block
