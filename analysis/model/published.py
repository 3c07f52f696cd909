"""The model held against published GPU-server measurements (`ckptbench model --validate`).

`configs/published.yaml` (strict) holds public measurements made by others on named GPU
servers, each with its source and the words or output it quotes, and per source a profile built
from that source's own figures (cited, or "assumed" where the source is silent). Every point is
turned into a prediction of the model (`analysis.model.predict.predict`) beside its measured
value, with the error (predicted - measured) / measured.

A point's path says which of the model's terms it exercises:

    gds                    GPUDirect Storage: the SSDs read and write device memory
    cpu-bounce             a CPU bounce buffer, one step after the other: the whole transfer is
                           copied to host memory, then written (read, then copied to the device)
    cpu-bounce-pipelined   a CPU bounce buffer in chunks, the copy beside the I/O (several
                           threads, or a double buffer)
    cpu-buffer             host memory to and from the SSDs: the storage alone (W, R)
    torch-save             torch.save of the state on the device into one file, durable
    async-save             a library's asynchronous save: the stall is the copy out (S/d)

A point's drives form one volume (RAID-0 of `ssds` drives, or one drive): the model sees one
target of `ssds` times a drive's bandwidth, shared by the point's `gpus`.

Which points test the model is a rule, checked here (`check_figures`, `check_point`; a breach
is one line naming the point and the rule): an `independent` point's prediction uses only
figures (those whose doubling moves it, `depends_on`) from other experiments than its own; a
`consistency` point's come from its own run or page, and it is shown apart, never in the
headline (`Validation.median_error`, `misses`, `worst` and `sources` are over independent
points). A write timed in the page cache (no fsync) is no durable write; a figure measured on
other hardware is `assumed`, not `measured`; an assumption holds for every point of its kind.

Imports analysis.tables, analysis.model.profiles and analysis.model.predict.
"""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from analysis.model.predict import predict
from analysis.model.profiles import GB, Profile, Quoted, _number, _validated
from analysis.tables import text_table
from bench.common.errors import UserError
from bench.common.sizes import parse_size
from bench.common.traits import BUILTIN, Traits

PUBLISHED = Path(__file__).resolve().parents[2] / "configs" / "published.yaml"
GIB = 1024**3
MISS = 0.25  # a miss: the model off by more than this, which a point must explain (`why`)

Path_ = Literal[
    "gds", "cpu-bounce", "cpu-bounce-pipelined", "cpu-buffer", "torch-save", "async-save"
]

# Each path as the model's traits (None: the storage alone, no engine).
PATHS: dict[str, Traits | None] = {
    "gds": BUILTIN["gds"],
    "cpu-bounce": replace(BUILTIN["cpu-single"], stall="durable", read_overlaps_copy=False),
    "cpu-bounce-pipelined": replace(
        BUILTIN["cpu-single"], stall="durable", write_overlaps_copy=True
    ),
    "cpu-buffer": None,
    "torch-save": BUILTIN["torch-save"],
    "async-save": BUILTIN["dcp"],
}


class Hardware(BaseModel):
    """What the source ran on, as it says it (or 'not stated')."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    gpu: str
    pcie: str
    ssd: str
    filesystem: str


# What ended a write's timing: an fsync, O_DIRECT writes that completed (no page cache between),
# or the page cache (buffered, no fsync: not durable).
Ends = Literal["fsync", "O_DIRECT", "page cache"]


class Figure(Quoted):
    """A profile input: a `Quoted` figure, and for a measured or derived one the experiment it
    comes from (so that a point is not predicted from its own run) and, for a write rate, what
    ended its timing."""

    experiment: str | None = None
    ends: Ends | None = None


class SourceProfile(BaseModel):
    """A source's machine as the model's inputs: every figure with its kind and source."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    description: str
    hardware: Hardware
    d2h_GBps: Figure
    h2d_GBps: Figure
    ssd_write_GBps: Figure
    ssd_read_GBps: Figure
    host_copy_GBps: Figure
    gds_link_GBps: Figure | None = None
    serialize_GBps: Figure | None = None


class Point(BaseModel):
    """One published measurement."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str
    source: str  # the publication (title, address)
    where: str  # where in it: page, figure, table, comment
    quote: str  # the words or output the value is taken from
    profile: str
    tool: str
    path: Path_
    direction: Literal["write", "read"]
    ssds: int = Field(ge=1)  # drives in the one volume written or read (RAID-0, or one)
    gpus: int = Field(default=1, ge=1)  # GPUs at once, sharing that volume
    size: str  # bytes each GPU moves (a throughput does not depend on it)
    what: Literal["throughput", "stall", "downtime"]
    measured: float = Field(gt=0)
    unit: Literal["GB/s", "GiB/s", "s"]
    value_kind: Literal["quoted", "read off a figure"]
    # The loader's rules (`check_point`): which test the point is, the experiment (run, figure,
    # page) it was measured in, what ended a write's timing, the assumptions it rests on.
    test: Literal["independent", "consistency"] | None = None
    experiment: str | None = None
    ends: Ends | None = None
    assumes: list[str] = []
    per: Literal["gpu", "all"] = "gpu"  # the measured rate: each GPU's, or all GPUs' together
    why: str | None = None  # where the model misses by more than 25 %: why


class LeftOut(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    source: str
    why: str


class Assumption(BaseModel):
    """An assumption where the sources are silent. It holds for every point of its kind (the
    points whose tool starts with `tool` on one of `paths`) or for none: the loader checks that
    exactly those points name it in `assumes`."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str
    says: str
    tool: str
    paths: list[Path_]


class PublishedFile(BaseModel):
    """configs/published.yaml."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    profiles: dict[str, SourceProfile]
    points: list[Point]
    assumptions: list[Assumption] = []
    left_out: list[LeftOut] = []
    notes: list[str] = []


@dataclass(frozen=True)
class Row:
    """One point of the validation table: measured and predicted in the point's unit."""

    point: Point
    hardware: Hardware
    predicted: float
    assumed: tuple[str, ...]  # the assumed profile inputs that change this prediction

    @property
    def error(self) -> float:
        return self.predicted / self.point.measured - 1

    @property
    def miss(self) -> bool:
        return abs(self.error) > MISS

    def to_json(self) -> dict[str, Any]:
        p = self.point
        return {
            "id": p.id,
            "source": p.source,
            "where": p.where,
            "quote": p.quote,
            "hardware": self.hardware.model_dump(),
            "tool": p.tool,
            "path": p.path,
            "direction": p.direction,
            "ssds": p.ssds,
            "gpus": p.gpus,
            "what": p.what,
            "unit": p.unit,
            "value_kind": p.value_kind,
            "test": p.test,
            "experiment": p.experiment,
            "assumes": p.assumes,
            "per": p.per,
            "measured": p.measured,
            "predicted": self.predicted,
            "error": self.error,
            "assumed_inputs": list(self.assumed),
            "why": p.why,
        }


@dataclass(frozen=True)
class Validation:
    rows: list[Row]
    left_out: list[LeftOut]
    notes: list[str]
    path: str
    assumptions: tuple[Assumption, ...] = ()

    @property
    def independent(self) -> list[Row]:
        """The points that test the model: every input from another experiment."""
        return [r for r in self.rows if r.point.test == "independent"]

    @property
    def consistency(self) -> list[Row]:
        """The points predicted from their own run or page: shown apart, never in the
        headline."""
        return [r for r in self.rows if r.point.test == "consistency"]

    @property
    def median_error(self) -> float:
        """Median absolute error over the independent points (a fraction)."""
        return statistics.median(abs(r.error) for r in self.independent)

    @property
    def consistency_median_error(self) -> float:
        """Median absolute error over the consistency checks (NaN: none)."""
        c = self.consistency
        return statistics.median(abs(r.error) for r in c) if c else math.nan

    @property
    def misses(self) -> list[Row]:
        """The independent points the model misses by more than MISS."""
        return [r for r in self.independent if r.miss]

    @property
    def worst(self) -> Row:
        return max(self.independent, key=lambda r: abs(r.error))

    @property
    def sources(self) -> int:
        """The distinct sources of the independent points."""
        return len({r.point.source for r in self.independent})


def source_profile(name: str, sp: SourceProfile, where: str) -> Profile:
    """A source's profile as the model's `Profile`: one drive, one GPU (a point scales it)."""
    keys = ("d2h_GBps", "h2d_GBps", "ssd_write_GBps", "ssd_read_GBps", "host_copy_GBps")
    v = {k: _number(getattr(sp, k), where, f"profiles.{name}.{k}") * GB for k in keys}
    sources = {k: (getattr(sp, k).kind, getattr(sp, k).source) for k in keys}
    link = None
    if sp.gds_link_GBps is not None:
        link = _number(sp.gds_link_GBps, where, f"profiles.{name}.gds_link_GBps") * GB
        sources["gds_link_GBps"] = (sp.gds_link_GBps.kind, sp.gds_link_GBps.source)
    z = None
    if sp.serialize_GBps is not None:
        z = _number(sp.serialize_GBps, where, f"profiles.{name}.serialize_GBps") * GB
        sources["serialize_GBps"] = (sp.serialize_GBps.kind, sp.serialize_GBps.source)
    return Profile(
        name=name,
        description=sp.description,
        d2h_Bps=v["d2h_GBps"],
        ssd_write_Bps=v["ssd_write_GBps"],
        ssds_per_gpu=1,
        gpus_sharing_host=1,
        host_copy_Bps=v["host_copy_GBps"],
        size_bytes=int(GB),
        link_Bps=link,
        sources=sources,
        ssd_read_Bps=v["ssd_read_GBps"],
        h2d_Bps=v["h2d_GBps"],
        serialize_Bps=z,
    )


def volume(p: Profile, drives: int) -> Profile:
    """The profile seen through one volume of `drives` drives striped (RAID-0): one target with
    their summed bandwidth, which single-file paths (torch.save) use whole."""
    return replace(
        p,
        ssd_write_Bps=drives * p.ssd_write_Bps,
        ssd_read_Bps=None if p.ssd_read_Bps is None else drives * p.ssd_read_Bps,
    )


# Each profile input as the field of `Profile` it fills.
FIELDS = {
    "d2h_GBps": "d2h_Bps",
    "h2d_GBps": "h2d_Bps",
    "ssd_write_GBps": "ssd_write_Bps",
    "ssd_read_GBps": "ssd_read_Bps",
    "host_copy_GBps": "host_copy_Bps",
    "gds_link_GBps": "link_Bps",
    "serialize_GBps": "serialize_Bps",
}


def depends_on(p: Profile, point: Point, size: float) -> tuple[str, ...]:
    """The profile inputs the point's prediction uses: those whose doubling changes it (a
    figure that binds nothing is not named)."""
    base = predicted_s(p, point, size)
    out = []
    for key in p.sources or {}:
        field = FIELDS.get(key)
        if field is None or getattr(p, field) is None:
            continue
        moved = predicted_s(replace(p, **{field: 2 * getattr(p, field)}), point, size)
        if not math.isclose(moved, base, rel_tol=1e-9):
            out.append(key)
    return tuple(out)


def rests_on(p: Profile, point: Point, size: float) -> tuple[str, ...]:
    """The assumed inputs the point's prediction depends on (`depends_on`, kind assumed)."""
    kinds = p.sources or {}
    return tuple(k for k in depends_on(p, point, size) if kinds[k][0] == "assumed")


def predicted_s(p: Profile, point: Point, size: float) -> float:
    """The model's time for the point: one GPU's bytes `size`, `point.gpus` GPUs at once on one
    volume of `point.ssds` drives."""
    vol = volume(p, point.ssds)
    g = point.gpus
    t = PATHS[point.path]
    if t is None:  # the storage alone, its share for each GPU
        rate = vol.storage_Bps(1) if point.direction == "write" else vol.read_Bps(1)
        return size * g / (rate or math.nan)
    pr = predict(vol, point.path, 1, size, t, g=g)
    if point.direction == "read":
        return pr.restore_s
    return pr.stall_s if point.what in ("stall", "downtime") else pr.durable_s


def in_unit(seconds: float, size: float, unit: str, gpus: int = 1) -> float:
    """The time of one GPU's `size` bytes in the point's unit; a rate of `gpus` GPUs together
    where gpus > 1 (a point measured `per: all`)."""
    if unit == "s":
        return seconds
    return gpus * size / seconds / (GIB if unit == "GiB/s" else GB)


def check_figures(name: str, sp: SourceProfile, where: str) -> None:
    """A profile's rules: a measured or derived figure names its experiment; a figure marked
    measured is not an assumption; a measured write rate says what ended its timing, and one
    timed without fsync (the page cache) predicts no durable write."""
    for key in FIELDS:
        fig = getattr(sp, key)
        if fig is None:
            continue
        at = f"{where}: profiles.{name}.{key}"
        if fig.kind in ("measured", "derived") and not fig.experiment:
            raise UserError(
                f"{at}.experiment: a {fig.kind} figure names the experiment it comes from"
            )
        if fig.kind == "measured" and "assumed" in fig.source.lower():
            raise UserError(
                f"{at}.kind: marked measured, but its source says it is assumed "
                "(a figure measured on other hardware): mark it assumed"
            )
        if key == "ssd_write_GBps" and fig.kind in ("measured", "derived"):
            if fig.ends is None:
                raise UserError(
                    f"{at}.ends: a measured write rate says what ended its timing "
                    "(fsync, O_DIRECT or page cache)"
                )
            if fig.ends == "page cache":
                raise UserError(
                    f"{at}.ends: timed without fsync (the page cache), it predicts no durable write"
                )


def check_point(
    pt: Point,
    at: str,
    sp: SourceProfile,
    prof: Profile,
    size: float,
    assumptions: dict[str, Assumption],
) -> None:
    """A point's rules, each refused in one line naming the point's id and the rule."""
    tag = f"{at} ({pt.id})"
    if pt.test is None:
        raise UserError(
            f"{tag}.test: every point says its test, independent or consistency "
            "(or goes to left_out)"
        )
    if not pt.experiment:
        raise UserError(
            f"{tag}.experiment: name the experiment (run, figure, page) the value comes from"
        )
    if pt.direction == "write":
        if pt.ends is None:
            raise UserError(
                f"{tag}.ends: a write says what ended its timing (fsync, O_DIRECT or page cache)"
            )
        if pt.ends == "page cache":
            raise UserError(
                f"{tag}.ends: timed without fsync (the page cache), not a durable write: "
                "the model predicts none; move it to left_out"
            )
    if pt.per == "all" and pt.unit == "s":
        raise UserError(f"{tag}.per: a time is one GPU's; 'all' is for a rate of all GPUs")
    for name in pt.assumes:
        if name not in assumptions:
            known = ", ".join(assumptions) or "none"
            raise UserError(f"{tag}.assumes: unknown assumption {name!r} (known: {known})")
    for a in assumptions.values():
        kind = pt.tool.startswith(a.tool) and pt.path in a.paths
        if kind != (a.id in pt.assumes):
            scope = f"{a.tool!r} on {', '.join(a.paths)}"
            raise UserError(
                f"{tag}.assumes: assumption {a.id!r} holds for every point of its kind "
                f"({scope}) and no other: "
                + ("name it, or drop it for all" if kind else "this point is not of that kind")
            )
    if pt.test == "independent":
        for key in depends_on(prof, pt, size):
            fig = getattr(sp, key)
            if fig.experiment and fig.experiment == pt.experiment:
                raise UserError(
                    f"{tag}.test: an independent point is predicted from other experiments, "
                    f"but profiles.{pt.profile}.{key} comes from its own ({pt.experiment}): "
                    "mark it consistency"
                )


def validate(path: Path = PUBLISHED) -> Validation:
    """Every point of the file beside the model's prediction."""
    if not Path(path).is_file():
        raise UserError(f"--validate: no such file {str(path)!r}")
    f: PublishedFile = _validated(path, PublishedFile)
    where = str(path)
    for n, sp in f.profiles.items():
        check_figures(n, sp, where)
    profiles = {n: source_profile(n, sp, where) for n, sp in f.profiles.items()}
    assumptions: dict[str, Assumption] = {}
    for i, a in enumerate(f.assumptions):
        if a.id in assumptions:
            raise UserError(f"{where}: assumptions.{i}.id: {a.id!r} is given twice")
        assumptions[a.id] = a
    rows, seen = [], set()
    for i, pt in enumerate(f.points):
        at = f"{where}: points.{i}"
        if pt.id in seen:
            raise UserError(f"{at}.id: {pt.id!r} is given twice")
        seen.add(pt.id)
        if pt.profile not in profiles:
            known = ", ".join(profiles) or "none"
            raise UserError(f"{at}.profile: unknown profile {pt.profile!r} (known: {known})")
        if (pt.unit == "s") != (pt.what != "throughput"):
            want = "GB/s or GiB/s" if pt.what == "throughput" else "s"
            raise UserError(f"{at}.unit: a {pt.what} is given in {want}, not {pt.unit}")
        size = float(parse_size(pt.size, f"{at}.size"))
        prof = profiles[pt.profile]
        check_point(pt, at, f.profiles[pt.profile], prof, size, assumptions)
        gpus = pt.gpus if pt.per == "all" else 1
        pred = in_unit(predicted_s(prof, pt, size), size, pt.unit, gpus)
        row = Row(pt, f.profiles[pt.profile].hardware, pred, rests_on(prof, pt, size))
        if row.miss and not pt.why:
            raise UserError(
                f"{at}.why: the model misses {pt.id} by {100 * row.error:+.0f} %; "
                "say why (the missing term, or how the source differs)"
            )
        rows.append(row)
    if not any(r.point.test == "independent" for r in rows):
        raise UserError(
            f"{where}: points: no independent point (the headline is over independent points)"
        )
    return Validation(rows, list(f.left_out), list(f.notes), where, tuple(f.assumptions))


def fmt_value(x: float, unit: str) -> str:
    return f"{x:.3g} {unit}"


def source_list(v: Validation) -> list[str]:
    """The distinct sources, in the order of the points (the table's [k] keys)."""
    out: list[str] = []
    for r in v.rows:
        if r.point.source not in out:
            out.append(r.point.source)
    return out


def table(v: Validation) -> tuple[list[str], list[list[str]]]:
    """The validation table: point, test, source ([k] of `source_list`), hardware, path,
    measured, predicted, error, and the assumed inputs the prediction rests on."""
    headers = ["point", "test", "source", "hardware", "path", "measured", "predicted", "error"]
    headers.append("rests on assumed")
    keys = source_list(v)
    rows = []
    for r in v.independent + v.consistency:
        p, h = r.point, r.hardware
        fig = " (fig.)" if p.value_kind != "quoted" else ""
        rows.append(
            [
                p.id,
                str(p.test),
                f"[{keys.index(p.source) + 1}] {p.where}",
                f"{h.gpu}, PCIe {h.pcie}; {p.ssds} x {h.ssd}; {h.filesystem}"
                + (f"; {p.gpus} GPUs at once" if p.gpus > 1 else ""),
                f"{p.path} {p.direction} ({p.tool})",
                fmt_value(p.measured, p.unit) + fig + (" all GPUs" if p.per == "all" else ""),
                fmt_value(r.predicted, p.unit),
                f"{100 * r.error:+.0f} %" + (" *" if r.miss else ""),
                ", ".join(r.assumed) or "-",
            ]
        )
    return headers, rows


def brief_table(v: Validation, rows: list[Row]) -> tuple[list[str], list[list[str]]]:
    """The table narrow enough for a terminal: point, source key, path, measured, predicted,
    error."""
    headers = ["point", "src", "path", "dir", "SSDs", "measured", "predicted", "error"]
    keys = source_list(v)
    out = []
    for r in rows:
        p = r.point
        out.append(
            [
                p.id,
                f"[{keys.index(p.source) + 1}]",
                p.path,
                p.direction,
                str(p.ssds),
                fmt_value(p.measured, p.unit) + (" (fig.)" if p.value_kind != "quoted" else ""),
                fmt_value(r.predicted, p.unit),
                f"{100 * r.error:+.0f} %" + (" *" if r.miss else ""),
            ]
        )
    return headers, out


def summary(v: Validation) -> str:
    """One paragraph: how many independent points, their median error and misses, the worst
    and why; then, apart, the consistency checks."""
    w, n = v.worst, len(v.independent)
    c = v.consistency
    checks = (
        f" Apart, {len(c)} consistency checks (predicted from their own run or page, so they "
        f"cannot test it; not in the headline): median error {100 * v.consistency_median_error:.0f} %."
        if c
        else ""
    )
    return (
        f"Held against {n} independent published measurements from {v.sources} sources "
        f"(configs/published.yaml; each predicted from figures of other experiments), the "
        f"model's median error is {100 * v.median_error:.0f} %; {len(v.misses)} of {n} miss by "
        f"more than {100 * MISS:.0f} %. Worst: {w.point.id} "
        f"({w.point.source}, {w.point.where}), measured {fmt_value(w.point.measured, w.point.unit)}, predicted "
        f"{fmt_value(w.predicted, w.point.unit)} ({100 * w.error:+.0f} %): "
        f"{(w.point.why or 'within 25 %').rstrip('.')}.{checks}"
    )


def text(v: Validation) -> str:
    """What `ckptbench model --validate` prints."""
    lines = ["independent points (every input from another experiment):", ""]
    lines += [text_table(*brief_table(v, v.independent)), ""]
    if v.consistency:
        lines += ["consistency checks (inputs from the same run or page; not in the headline):"]
        lines += ["", text_table(*brief_table(v, v.consistency)), ""]
    lines.append(
        "error = (predicted - measured) / measured; * misses by more than 25 %; (fig.) read off "
        "a figure, the source prints no number"
    )
    lines += [f"[{i}] {s}" for i, s in enumerate(source_list(v), 1)]
    lines += ["", "hardware, and why the model misses where it does:"]
    for r in v.independent + v.consistency:
        p, h = r.point, r.hardware
        lines.append(
            f"  {p.id}: {h.gpu}, PCIe {h.pcie}; {p.ssds} x {h.ssd}; {h.filesystem}; "
            f"{p.tool}" + (f"; {p.gpus} GPUs at once" if p.gpus > 1 else "")
        )
        if r.assumed:
            lines.append(f"    rests on assumed inputs: {', '.join(r.assumed)}")
        if p.assumes:
            lines.append(f"    assumes: {', '.join(p.assumes)}")
        if p.why:
            lines.append(f"    why: {p.why}")
    lines += ["", summary(v)]
    if v.assumptions:
        lines += ["", "assumptions (each holds for every point of its kind):"]
        lines += [f"  {a.id}: {a.says}" for a in v.assumptions]
    if v.left_out:
        lines += ["", "left out (too thin to build a profile, or not what the model predicts):"]
        lines += [f"  {x.source}: {x.why}" for x in v.left_out]
    if v.notes:
        lines += ["", *[f"note: {n}" for n in v.notes]]
    return "\n".join(lines)


def to_json(v: Validation) -> dict[str, Any]:
    w = v.worst
    return {
        "file": os.path.relpath(v.path),
        "points": [r.to_json() for r in v.rows],
        "independent_points": len(v.independent),
        "sources": v.sources,
        "median_abs_error": v.median_error,
        "worst": {"id": w.point.id, "error": w.error, "why": w.point.why},
        "misses": [r.point.id for r in v.misses],
        "consistency": {
            "points": [r.point.id for r in v.consistency],
            "median_abs_error": v.consistency_median_error if v.consistency else None,
        },
        "assumptions": [a.model_dump() for a in v.assumptions],
        "left_out": [x.model_dump() for x in v.left_out],
        "notes": v.notes,
    }
