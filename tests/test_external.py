"""`ckptbench compare RUN OTHER`: other tools' result files (fio, gdsio, DLIO / MLPerf Storage)
read from real outputs (tests/fixtures/external/README.md) and set against a committed run."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import compare, external
from bench.cli import main
from bench.common.errors import UserError

EXT = Path(__file__).parent / "fixtures" / "external"
FIO = EXT / "fio-vda.json"
GDSIO = EXT / "gdsio-nvidia-guide.txt"
DLIO = EXT / "dlio-tiny"
MLPERF_CSV = EXT / "mlperf-results.csv"
A = Path(__file__).parent / "fixtures" / "runs" / "20261202T161542Z-cmpa-0ead53"
GB, GIB = 1e9, 2**30


def by_label(e: external.External) -> dict[str, external.Point]:
    return {p.label: p for p in e.points}


def test_fio_jobs_become_points_with_their_durability() -> None:
    raw = json.loads(FIO.read_text())
    e = external.load(str(FIO))
    assert e.tool == "fio" and e.env["tool"] == raw["fio version"] and e.env["storage"] == "vda"
    pts = by_label(e)
    assert sorted((p.label, p.direction) for p in e.points) == sorted(
        (f"fio job {j['jobname']}", d) for j in raw["jobs"] for d in ("read", "write")
        if j[d]["io_bytes"] > 0
    )  # fmt: skip
    for j in raw["jobs"]:
        d = "write" if j["write"]["io_bytes"] else "read"
        p = pts[f"fio job {j['jobname']}"]
        assert p.GBps == pytest.approx((j[d]["io_bytes"] / (j[d]["runtime"] / 1e3) / GB,))
        assert not p.gpu and "bs=16M" in p.detail
    assert pts["fio job odirect-write"].durable is True  # end_fsync=1
    assert pts["fio job odirect-write"].path.startswith("O_DIRECT")
    assert pts["fio job buffered-write-no-fsync"].durable is False
    assert pts["fio job buffered-write-no-fsync"].path.startswith("buffered")
    assert pts["fio job odirect-read"].durable is None


@pytest.mark.parametrize(
    "options,durable",
    [
        ({"fsync_on_close": "1"}, None),
        ({"fdatasync": "4"}, None),  # every 4 writes: the last ones may follow the last fsync
        ({"fdatasync": "4", "end_fsync": "1"}, True),
        ({"fsync": "1"}, True),
        ({"sync": "dsync"}, True),
    ],
)
def test_fio_durability_options(tmp_path: Path, options: dict[str, str], durable: object) -> None:
    raw = json.loads(FIO.read_text())
    job = next(j for j in raw["jobs"] if j["jobname"] == "buffered-write-no-fsync")
    job["job options"].update(options)
    f = tmp_path / "fio.json"
    f.write_text("note: a line fio printed first\n" + json.dumps(raw))
    assert by_label(external.load(str(f)))["fio job buffered-write-no-fsync"].durable is durable


def test_gdsio_lines_in_decimal_GB() -> None:
    text = GDSIO.read_text()
    e = external.load(str(GDSIO))
    quoted = [float(x) for x in re.findall(r"Throughput: ([\d.]+) GiB/sec", text)]
    assert len(e.points) == len(quoted) == 3  # the prompt lines are not results
    assert [p.GBps[0] for p in e.points] == pytest.approx([q * GIB / GB for q in quoted])
    assert [p.direction for p in e.points] == ["read", "write", "read"]
    assert all(p.gpu and p.path.startswith("GDS") and p.durable is None for p in e.points)


def test_gdsio_batch_lines_and_lines_not_understood(tmp_path: Path) -> None:
    """The batch mode's lines carry an IoDepth (a published output's shape); a result line of
    another shape is refused, never dropped."""
    f = tmp_path / "gdsio.log"
    f.write_text(
        "IoType: WRITE XferType: GPU_BATCH Threads: 1 IoDepth: 8 DataSetSize: 524206080/8388608"
        "(KiB) IOSize: 16384(KiB) Throughput: 4.5 GiB/sec, Avg_Latency: 1.0 usecs ops: 1 "
        "total_time 1.0 secs\n"
    )
    (p,) = external.load(str(f)).points
    assert p.direction == "write" and p.gpu and p.GBps == pytest.approx((4.5 * GIB / GB,))
    f.write_text(GDSIO.read_text() + "IoType: READ XferType: GPUD Throughput: fast\n")
    with pytest.raises(UserError, match=r"gdsio.log: line 7: a gdsio result line not understood"):
        external.load(str(f))


def test_dlio_summary_and_its_folder() -> None:
    summary = json.loads((DLIO / "summary.json").read_text())
    per_epoch = json.loads((DLIO / "0_per_epoch_stats.json").read_text())
    for path in (DLIO, DLIO / "summary.json"):
        e = external.load(str(path))
        pts = by_label(e)
        save, load = pts["DLIO tiny_llama save"], pts["DLIO tiny_llama load"]
        for p, prefix in ((save, "save_ckpt"), (load, "load_ckpt")):
            rank0 = [r["throughput"] for ep in per_epoch.values() for k, r in ep.items()
                     if k.startswith(prefix)]  # fmt: skip
            assert len(p.GBps) == len(rank0) == 10
            assert p.GBps == pytest.approx(tuple(v * GIB / GB for v in rank0))
        # DLIO's own mean is the mean of those samples (its GiB/s)
        mean = summary["metric"]["save_checkpoint_io_mean_GB_per_second"]
        assert np.mean(save.GBps) == pytest.approx(mean * GIB / GB)
        assert save.durable is False and "never fsyncs" in save.note
        assert load.durable is None
        assert e.env["accelerators"] == str(summary["num_accelerators"])
        assert e.env["cores"] == "2" and e.env["memory"] == "24 GiB"


def test_mlperf_results_table(tmp_path: Path) -> None:
    e = external.load(str(MLPERF_CSV))
    row = pd.read_csv(MLPERF_CSV).iloc[0]
    assert sorted(p.direction for p in e.points) == ["read", "write"]
    assert {p.label for p in e.points} == {"MLPerf Storage tiny_llama"}
    assert next(p for p in e.points if p.direction == "write").durable is False
    assert sorted(p.GBps[0] for p in e.points) == pytest.approx(
        sorted(row[c] * GIB / GB for c in external.MLPERF_COLUMNS.values())
    )
    bad = tmp_path / "results.csv"
    bad.write_text(MLPERF_CSV.read_text().replace("0.93", "fast", 1))
    with pytest.raises(UserError, match=r"line 2, 'Write B/W \(GiB/s\)' is not a number"):
        external.load(str(bad))
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    with pytest.raises(UserError, match="without MLPerf Storage's checkpointing columns"):
        external.load(str(other))


def test_files_of_no_known_kind(tmp_path: Path) -> None:
    junk = tmp_path / "notes.txt"
    junk.write_text("write 3 GB/s, trust me\n")
    with pytest.raises(UserError, match=r"notes.txt: not a result file compare knows"):
        external.load(str(junk))
    with pytest.raises(UserError, match="no such run directory or result file"):
        external.load(str(tmp_path / "missing.json"))
    with pytest.raises(UserError, match="nor a DLIO output folder"):
        external.load(str(tmp_path))
    broken = tmp_path / "fio.json"
    raw = json.loads(FIO.read_text())
    raw["jobs"][0]["write"]["runtime"] = "soon"
    broken.write_text(json.dumps(raw))
    with pytest.raises(UserError, match=r"jobs\[0\]\.write\.runtime is not a number"):
        external.load(str(broken))


def test_a_run_against_fio() -> None:
    c = compare.compare([str(A), str(FIO)])
    assert c.table.empty and [lb for lb, _ in c.others] == ["B"]
    t = c.external_table
    assert t is not None
    cases = c.runs[0].ok.groupby(compare.CASE_KEY).ngroups
    writes = [p for p in c.others[0][1].points if p.direction == "write"]
    assert len(t) == cases * len(writes) == 12
    ok = c.runs[0].ok
    for r in t.to_dict("records"):
        mine = ok[(ok["engine"] == r["engine"]) & (ok["workload"] == r["workload"])]
        assert r["median_a"] == pytest.approx(float(np.median(mine["write_GBps"])))
        assert r["ratio"] == pytest.approx(r["median_b"] / r["median_a"])
        assert r["verdict"] == "n < 2: no interval"
    # the job without fsync is named as a different yardstick, the end_fsync job is not
    assert any("buffered-write-no-fsync" in w and "does not include" in w for w in c.warnings)
    assert not any("odirect-write" in w for w in c.warnings)
    r = compare.compare([str(A), str(FIO)], metric="restore").external_table
    assert r is not None and set(r["source"]) == {"fio job odirect-read"}


def test_gds_on_a_gpu_against_an_emulated_run_is_refused() -> None:
    with pytest.raises(UserError, match=r"C \(gdsio\) moved bytes to or from GPU memory"):
        compare.compare([str(A), str(FIO), str(GDSIO)])
    c = compare.compare([str(A), str(GDSIO)], force=True)
    assert c.refusals and "host-emulated" in c.refusals[0]
    assert "WARNING: NOT COMPARABLE" in compare.text(c)


def test_what_an_external_comparison_refuses() -> None:
    with pytest.raises(UserError, match="first argument is the ckptbench run"):
        compare.compare([str(FIO), str(A)])
    with pytest.raises(UserError, match="--metric stall: .* gives bandwidth only"):
        compare.compare([str(A), str(FIO)], metric="stall")


def test_cli_writes_the_side_by_side(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    shutil.copytree(A, run)
    assert main(["compare", str(run), str(FIO), str(DLIO)]) == 0
    out = capsys.readouterr().out
    assert "Environments:" in out and "fio-3.33" in out and "DLIO (MLPerf Storage)" in out
    outdir = run / "report" / "compare-vs-fio-vda"
    md = (outdir / "compare.md").read_text()
    assert "## Against other tools' results" in md and "## Environments" in md
    assert "never fsyncs" in md  # DLIO's writes named as not durable
    t = pd.read_csv(outdir / "compare-external.csv")
    assert set(t["run"]) == {"B", "C"} and not (outdir / "compare_bandwidth.png").exists()
    assert main(["compare", str(run), str(tmp_path / "nothing.json")]) == 2
    err = capsys.readouterr().err
    assert "nothing.json: no such run directory or result file" in err and err.count("\n") == 1


def test_two_runs_and_a_file() -> None:
    b = A.parent / "20261202T161559Z-cmpb-52ec19"
    c = compare.compare([str(A), str(b), str(FIO)])
    assert set(c.table["run"]) == {"B"} and c.external_table is not None
    assert set(c.external_table["run"]) == {"C"}
    h, rows = compare.environments(c)
    assert h == ["", "A", "B", "C"] and rows[0][0] == "tool"


@pytest.mark.parametrize("rate", ["0.000000", "0", "00.0"])
def test_a_gdsio_rate_of_zero_is_refused_naming_its_line(
    tmp_path: Path, rate: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A gdsio line that moved nothing is no measurement: compare refuses it in one line (exit 2)
    instead of writing a comparison against zero."""
    lines = GDSIO.read_text().splitlines()
    n = next(i for i, line in enumerate(lines, 1) if "Throughput:" in line)
    lines[n - 1] = re.sub(r"Throughput: [\d.]+", f"Throughput: {rate}", lines[n - 1])
    f = tmp_path / "gdsio.txt"
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError, match=rf"gdsio.txt: line {n}: Throughput \(GiB/sec\) is not"):
        external.load(str(f))
    run = tmp_path / "run"
    shutil.copytree(A, run)
    assert main(["compare", str(run), str(f)]) == 2
    err = capsys.readouterr().err
    assert f"line {n}: Throughput (GiB/sec) is not a rate above zero ({rate!r})" in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (run / "report").exists()  # no comparison written against it


@pytest.mark.parametrize("value", ["0", "-1.5", "inf", "nan"])
def test_rates_of_zero_negative_or_not_finite_are_refused_for_every_tool(
    tmp_path: Path, value: str
) -> None:
    csv = tmp_path / "results.csv"
    csv.write_text(MLPERF_CSV.read_text().replace("0.931558873539722", value, 1))
    with pytest.raises(UserError, match=r"results.csv: line 2, 'Write B/W \(GiB/s\)' is not a"):
        external.load(str(csv))
    dlio = tmp_path / "dlio"
    shutil.copytree(DLIO, dlio)
    summary = json.loads((dlio / "summary.json").read_text())
    summary["metric"]["save_checkpoint_io_mean_GB_per_second"] = float(value)
    (dlio / "summary.json").write_text(json.dumps(summary))
    (dlio / "0_per_epoch_stats.json").unlink()  # the mean is then the only sample
    with pytest.raises(UserError, match=r"metric.save_checkpoint_io_mean_GB_per_second is not a"):
        external.load(str(dlio))
    if value != "0":  # fio's zero runtime is a direction the job did not run, skipped
        fio = tmp_path / "fio.json"
        raw = json.loads(FIO.read_text())
        raw["jobs"][0]["write"]["runtime"] = float(value)
        fio.write_text(json.dumps(raw))
        with pytest.raises(UserError, match=r"jobs\[0\].write.runtime is not a number >= 0"):
            external.load(str(fio))
