"""The model held against published measurements (analysis/model/published.py,
configs/published.yaml): planted points with a known profile give the predictions worked out by
hand, a malformed file is one line naming the field (exit 2), the committed table covers what
the issue asks for, and `ckptbench model --validate` prints it (--json parses)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from analysis.model import published
from analysis.report.doc import Doc
from analysis.report.model import published_section, published_summary
from bench.cli import main
from bench.common.errors import UserError

GIB = 1024**3
REPO = Path(__file__).resolve().parent.parent


def q(value: float | str, kind: str = "measured", **kw: object) -> dict[str, object]:
    out: dict[str, object] = {"value": value, "kind": kind, "source": "planted for the test"}
    if kind in ("measured", "derived"):
        out["experiment"] = "planted-drive-run"
    return {**out, **kw}


# b = 10 GB/s out of the GPU, h = 5 GB/s into it, a drive writes 1 and reads 2 GB/s, C = 100.
PROFILE = {
    "description": "planted",
    "hardware": {"gpu": "G", "pcie": "Gen4", "ssd": "D", "filesystem": "ext4"},
    "d2h_GBps": q(10),
    "h2d_GBps": q(5, "assumed"),
    "ssd_write_GBps": q(1, ends="O_DIRECT"),
    "ssd_read_GBps": q(2),
    "host_copy_GBps": q(100, "assumed"),
}


def point(id: str, path: str, direction: str, ssds: int, measured: float, **kw: object) -> dict:
    base: dict[str, object] = {
        "id": id,
        "source": "planted",
        "where": "here",
        "quote": "a planted value",
        "profile": "planted",
        "tool": "hand",
        "path": path,
        "direction": direction,
        "ssds": ssds,
        "size": "10GB",
        "what": "throughput",
        "measured": measured,
        "unit": "GB/s",
        "value_kind": "quoted",
        "test": "independent",
        "experiment": "planted-point-run",
    }
    if direction == "write":
        base["ends"] = "O_DIRECT"
    base.update(kw)
    return base


# (point, the prediction worked out by hand from PROFILE)
PLANTED = [
    # GDS writes at min(L = b, 4 drives x 1) = 4 GB/s
    (point("gds-w", "gds", "write", 4, 4.0), 4.0),
    # GDS reads at min(3 x 2, h = 5) = 5 GB/s
    (point("gds-r", "gds", "read", 3, 5.0), 5.0),
    # the one-step bounce: copy out, then write: 1 / (1/10 + 1/4) GB/s
    (point("bounce-w", "cpu-bounce", "write", 4, 3.0), 1 / (1 / 10 + 1 / 4)),
    # the one-step bounce read: read 2 x 2, then copy in at h: 1 / (1/4 + 1/5)
    (point("bounce-r", "cpu-bounce", "read", 2, 2.2), 1 / (1 / 4 + 1 / 5)),
    # in chunks, side by side: the slower of the two
    (point("pipe-w", "cpu-bounce-pipelined", "write", 4, 4.0), 4.0),
    (point("pipe-r", "cpu-bounce-pipelined", "read", 2, 4.0), 4.0),
    # the storage alone: 3 drives read 6 GB/s; one drive writes 1 GB/s = 0.931 GiB/s
    (point("cpu-r", "cpu-buffer", "read", 3, 6.0), 6.0),
    (point("cpu-w", "cpu-buffer", "write", 1, 1.0, unit="GiB/s"), 1e9 / GIB),
    # an async save stalls for the copy out: 10 GB / 10 GB/s
    (point("async", "async-save", "write", 1, 1.0, what="downtime", unit="s"), 1.0),
    # torch.save stalls until durable: 10 GB / 10 + 10 GB / 2 (two drives, one volume)
    (point("ts", "torch-save", "write", 2, 6.0, what="stall", unit="s"), 1.0 + 5.0),
    # four GPUs share one drive: each writes its 10 GB at 1/4 GB/s
    (point("shared", "gds", "write", 1, 40.0, what="stall", unit="s", gpus=4), 40.0),
]


def write(tmp_path: Path, points: list[dict], profile: dict | None = None) -> Path:
    f = tmp_path / "published.yaml"
    doc = {"profiles": {"planted": profile or PROFILE}, "points": points}
    f.write_text(yaml.safe_dump(doc, sort_keys=False))
    return f


def test_planted_points_give_the_predictions_worked_by_hand(tmp_path: Path) -> None:
    v = published.validate(write(tmp_path, [p for p, _ in PLANTED]))
    got = {r.point.id: r.predicted for r in v.rows}
    for p, want in PLANTED:
        assert got[p["id"]] == pytest.approx(want, rel=1e-9), p["id"]
    # the error is (predicted - measured) / measured, in the point's unit
    bounce = next(r for r in v.rows if r.point.id == "bounce-w")
    assert bounce.error == pytest.approx((1 / (1 / 10 + 1 / 4)) / 3.0 - 1)
    assert not bounce.miss
    # the assumed inputs a prediction rests on are named
    assert next(r for r in v.rows if r.point.id == "gds-r").assumed == ("h2d_GBps",)
    assert next(r for r in v.rows if r.point.id == "cpu-r").assumed == ()
    # an assumed figure that binds nothing (C = 100 GB/s, h on a write) is not named
    assert next(r for r in v.rows if r.point.id == "pipe-w").assumed == ()
    assert next(r for r in v.rows if r.point.id == "bounce-r").assumed == ("h2d_GBps",)


def test_a_miss_needs_its_why_and_the_summary_names_the_worst(tmp_path: Path) -> None:
    off = point("off", "gds", "write", 4, 2.0)  # the model says 4: +100 %
    with pytest.raises(UserError) as e:
        published.validate(write(tmp_path, [off]))
    assert "points.0.why: the model misses off by +100 %" in str(e.value)
    v = published.validate(write(tmp_path, [{**off, "why": "planted reason"}, PLANTED[0][0]]))
    assert v.median_error == pytest.approx(0.5)  # median of 1.0 and 0.0
    assert v.worst.point.id == "off"
    s = published.summary(v)
    assert "median error is 50 %" in s
    assert (
        "Worst: off (planted, here), measured 2 GB/s, predicted 4 GB/s (+100 %): planted reason"
        in s
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"direction": "sideways"}, "points.0.direction: Input should be 'write' or 'read'"),
        ({"colour": "red"}, "points.0.colour: unknown key"),
        ({"profile": "nowhere"}, "points.0.profile: unknown profile 'nowhere' (known: planted)"),
        ({"unit": "s"}, "points.0.unit: a throughput is given in GB/s or GiB/s, not s"),
        ({"size": "ten"}, "points.0.size"),
        ({"ssds": 0}, "points.0.ssds: Input should be greater than or equal to 1"),
        ({"path": "magic"}, "points.0.path: Input should be"),
    ],
)
def test_a_malformed_point_is_one_line_naming_the_field(
    tmp_path: Path, change: dict, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    f = write(tmp_path, [{**PLANTED[0][0], **change}])
    assert main(["model", "--validate", str(f)]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_a_malformed_profile_names_its_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = {**PROFILE, "ssd_write_GBps": q("fast", ends="O_DIRECT")}
    assert main(["model", "--validate", str(write(tmp_path, [PLANTED[0][0]], bad))]) == 2
    assert "profiles.planted.ssd_write_GBps.value: expected a number, got 'fast'" in (
        capsys.readouterr().err
    )
    assert main(["model", "--validate", str(tmp_path / "none.yaml")]) == 2
    assert "--validate: no such file" in capsys.readouterr().err
    no_hw = {k: v for k, v in PROFILE.items() if k != "hardware"}
    assert main(["model", "--validate", str(write(tmp_path, [PLANTED[0][0]], no_hw))]) == 2
    assert "profiles.planted.hardware: Field required" in capsys.readouterr().err


def test_the_committed_table_covers_what_the_issue_asks() -> None:
    v = published.validate()
    rows = v.rows
    # issue 44: at least 20 independent points from at least 6 sources; the consistency
    # checks kept apart
    assert len(v.independent) >= 20
    assert v.sources >= 6
    assert v.consistency and not {r.point.id for r in v.independent} & {
        r.point.id for r in v.consistency
    }
    kinds = {(r.point.path, r.point.direction) for r in v.independent}
    assert {("gds", "write"), ("gds", "read")} <= kinds
    bounce = {d for p, d in kinds if p.startswith("cpu-bounce")}
    assert bounce == {"write", "read"}
    for r in rows:
        assert r.point.quote and r.point.source and r.point.where
        assert math.isfinite(r.predicted) and r.predicted > 0
        if r.miss:
            assert r.point.why
    assert v.left_out  # the sources too thin for a profile, each with why
    assert all(x.why for x in v.left_out)


def test_cli_prints_the_table_and_json_parses(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model", "--validate"]) == 0
    out = capsys.readouterr().out
    v = published.validate()
    assert out.splitlines()[0].startswith("independent points")
    assert out.splitlines()[2].split()[:3] == ["point", "src", "path"]
    assert "consistency checks (inputs from the same run or page; not in the headline):" in out
    for r in v.rows:
        assert r.point.id in out
    assert published.summary(v) in out
    assert "left out (too thin to build a profile, or not what the model predicts):" in out
    assert main(["model", "--validate", "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert js["file"].endswith("published.yaml")
    assert len(js["points"]) == len(v.rows)
    assert js["median_abs_error"] == pytest.approx(v.median_error)
    first = js["points"][0]
    assert first["measured"] == v.rows[0].point.measured
    assert first["error"] == pytest.approx(v.rows[0].error)
    assert js["worst"]["id"] == v.worst.point.id
    assert js["independent_points"] == len(v.independent) and js["sources"] == v.sources
    assert js["misses"] == [r.point.id for r in v.independent if r.miss]
    assert js["consistency"]["points"] == [r.point.id for r in v.consistency]


def test_cli_validate_refuses_a_profile_and_a_profile_is_needed_without_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["model", "dgx-h100-gen4", "--validate"]) == 2
    assert "--validate: takes no PROFILE, --from-run or --mtbf" in capsys.readouterr().err
    assert main(["model"]) == 2
    assert "model: give a PROFILE (e.g. dgx-h100-gen4), or --validate" in capsys.readouterr().err


def test_the_report_section_carries_the_summary_and_the_table(tmp_path: Path) -> None:
    d = Doc()
    published_section(d)
    md = d.markdown()
    v = published.validate()
    assert "### Model against published measurements" in md
    assert published.summary(v) in md
    assert all(r.point.id in md for r in v.rows)
    assert "Left out, too thin to build a profile or not what the model predicts:" in md
    # a broken file does not break a report: one line says why
    bad = tmp_path / "bad.yaml"
    bad.write_text("points: [")
    assert published_summary(bad).startswith(
        "The model against published measurements: not available ("
    )


def test_the_readmes_quote_the_table_as_it_computes() -> None:
    """docs/analysis.md and analysis/README.md state the point count, the median error and the
    misses: they must follow the file."""
    v = published.validate()
    for doc in ("docs/analysis.md", "analysis/README.md"):
        text = " ".join((REPO / doc).read_text().split())
        page = doc == "docs/analysis.md"  # the docs page words it as the README once did
        n = len(v.independent)
        assert f"{n} independent points from {v.sources} sources" in text, doc
        assert f"{len(v.consistency)} consistency checks" in text, doc
        assert f"edian {'' if page else 'absolute '}error {100 * v.median_error:.0f} %" in text, doc
        misses = len(v.misses)
        said = f"{misses} of {n} independent points miss" if page else f"The {misses} misses"
        assert said in text, doc


def test_a_yaml_syntax_error_is_one_line_naming_the_file_line_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The parser's own message spans 8 lines with an excerpt of the file: one line instead."""
    f = tmp_path / "published.yaml"
    f.write_text("profiles:\n  planted: {description: x\npoints: []\n")
    assert main(["model", "--validate", str(f)]) == 2
    err = capsys.readouterr().err
    assert f"{f}: line 3, column 7: not valid YAML (expected ',' or '}}', but got ':')" in err
    assert err.count("\n") == 1 and "Traceback" not in err


GDS_W = PLANTED[0][0]  # gds-w: a write whose prediction uses ssd_write_GBps (and L = b)
RULES = [
    # (what breaks the rule: point changes, profile changes, assumptions), the one-line error
    (({"test": None}, {}, []), "points.0 (gds-w).test: every point says its test"),
    (({"experiment": None}, {}, []), "points.0 (gds-w).experiment: name the experiment"),
    (({"ends": None}, {}, []), "points.0 (gds-w).ends: a write says what ended its timing"),
    (
        ({"ends": "page cache"}, {}, []),
        "points.0 (gds-w).ends: timed without fsync (the page cache), not a durable write",
    ),
    (
        ({"experiment": "planted-drive-run"}, {}, []),
        "points.0 (gds-w).test: an independent point is predicted from other experiments, but "
        "profiles.planted.ssd_write_GBps comes from its own (planted-drive-run): mark it "
        "consistency",
    ),
    (({"per": "all", "what": "stall", "unit": "s"}, {}, []), "points.0 (gds-w).per: a time"),
    (
        ({"assumes": ["nope"]}, {}, []),
        "points.0 (gds-w).assumes: unknown assumption 'nope' (known: none)",
    ),
    (
        ({}, {}, [{"id": "one-hand", "says": "x", "tool": "hand", "paths": ["gds"]}]),
        "points.0 (gds-w).assumes: assumption 'one-hand' holds for every point of its kind "
        "('hand' on gds) and no other: name it, or drop it for all",
    ),
    (
        (
            {"assumes": ["one-hand"]},
            {},
            [{"id": "one-hand", "says": "x", "tool": "hand", "paths": ["cpu-bounce"]}],
        ),
        "points.0 (gds-w).assumes: assumption 'one-hand' holds for every point of its kind "
        "('hand' on cpu-bounce) and no other: this point is not of that kind",
    ),
    (
        ({}, {"d2h_GBps": q(10, source="an H100's figure, assumed the same for this GPU")}, []),
        "profiles.planted.d2h_GBps.kind: marked measured, but its source says it is assumed",
    ),
    (
        ({}, {"ssd_read_GBps": q(2, experiment=None)}, []),
        "profiles.planted.ssd_read_GBps.experiment: a measured figure names the experiment",
    ),
    (
        ({}, {"ssd_write_GBps": q(1)}, []),
        "profiles.planted.ssd_write_GBps.ends: a measured write rate says what ended its timing",
    ),
    (
        ({}, {"ssd_write_GBps": q(1, ends="page cache")}, []),
        "profiles.planted.ssd_write_GBps.ends: timed without fsync (the page cache), it predicts "
        "no durable write",
    ),
]


@pytest.mark.parametrize(("breach", "message"), RULES, ids=[m[:40] for _, m in RULES])
def test_each_rule_of_the_loader_refuses_a_file_that_breaks_it(
    tmp_path: Path,
    breach: tuple[dict, dict, list],
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    change, figures, assumptions = breach
    pt = {k: v for k, v in {**GDS_W, **change}.items() if v is not None}
    f = write(tmp_path, [pt], {**PROFILE, **figures})
    if assumptions:
        doc = yaml.safe_load(f.read_text())
        doc["assumptions"] = assumptions
        f.write_text(yaml.safe_dump(doc, sort_keys=False))
    assert main(["model", "--validate", str(f)]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert err.count("\n") == 1 and "Traceback" not in err
    # the same file without the breach passes
    assert published.validate(write(tmp_path, [GDS_W])).rows[0].point.id == "gds-w"


def test_an_assumption_for_every_point_of_its_kind_and_the_own_experiment_as_consistency(
    tmp_path: Path,
) -> None:
    one = {"id": "one-hand", "says": "x", "tool": "hand", "paths": ["gds"]}
    pts = [{**GDS_W, "assumes": ["one-hand"]}, {**PLANTED[1][0], "assumes": ["one-hand"]}]
    f = write(tmp_path, [*pts, PLANTED[6][0]])  # cpu-r (cpu-buffer) is not of its kind
    doc = yaml.safe_load(f.read_text())
    doc["assumptions"] = [one]
    f.write_text(yaml.safe_dump(doc, sort_keys=False))
    v = published.validate(f)
    assert [r.point.assumes for r in v.rows] == [["one-hand"], ["one-hand"], []]
    # a point predicted from its own run is kept as a consistency check
    own = {**GDS_W, "experiment": "planted-drive-run", "test": "consistency"}
    v = published.validate(write(tmp_path, [own, PLANTED[1][0]]))
    assert [r.point.id for r in v.consistency] == ["gds-w"]
    # a figure of the same experiment that binds nothing does not count: the GDS read of three
    # drives is bound by h (5 GB/s), so its drives' figure (6 GB/s) is not among its inputs
    v = published.validate(write(tmp_path, [{**PLANTED[1][0], "experiment": "planted-drive-run"}]))
    assert v.independent[0].point.id == "gds-r"


def test_the_headline_is_over_independent_points_only(tmp_path: Path) -> None:
    """A consistency check that misses moves neither the median nor the misses; a file with
    no independent point has no headline."""
    off = {**point("off", "gds", "write", 4, 2.0), "test": "consistency", "why": "planted"}
    v = published.validate(write(tmp_path, [off, GDS_W]))
    assert v.median_error == 0 and not v.misses and v.worst.point.id == "gds-w"
    assert v.consistency_median_error == pytest.approx(1.0)
    s = published.summary(v)
    assert "Held against 1 independent published measurements from 1 sources" in s
    assert "Apart, 1 consistency checks" in s and "median error 100 %." in s
    with pytest.raises(UserError, match="points: no independent point"):
        published.validate(write(tmp_path, [off]))
