"""What each path costs the host, from a run's rows (analysis.cost), its report section and
Figure 9, the traits' derived DRAM traffic, and this machine's host inputs in the model. The
fixture run (tests/fixtures/README.md) carries the host columns; the older default run does
not, and must still report its process figures."""

from __future__ import annotations

import csv
import dataclasses
import math
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, assert_answers_first, assert_glossary_complete

from analysis import cost, runs
from analysis.model.calibrate import from_run
from analysis.model.host import host_need
from analysis.model.profiles import load_profiles, reference_cpu_cost
from analysis.report.build import build
from analysis.report.host import host_answer, with_run_cost
from bench.common.traits import BUILTIN

FIX = Path(__file__).parent / "fixtures" / "runs"
HOST = FIX / "20261205T113902Z-default-3518d9"  # recorded with the host columns
OLD = FIX / "20261202T160516Z-default-b10c3b"  # recorded before them


@pytest.fixture(scope="module")
def run() -> runs.Run:
    return runs.load(str(HOST))


def timed_rows(path: Path) -> list[dict[str, str]]:
    with open(path / "results.csv", newline="") as f:
        return [r for r in csv.DictReader(f) if r["warmup"] == "False" and not r["error"]]


def test_table_is_the_median_per_gb_of_every_timed_repetition(run: runs.Run) -> None:
    t = cost.table(run).set_index("engine")
    rows = timed_rows(HOST)
    for e in ("gds", "cpu-single", "cpu-double", "dcp"):
        mine = [r for r in rows if r["engine"] == e]
        gb = [float(r["total_bytes"]) / 1e9 for r in mine]

        def med(f: object, mine: list[dict[str, str]] = mine, gb: list[float] = gb) -> float:
            return statistics.median(f(r) / g for r, g in zip(mine, gb, strict=True))  # type: ignore[operator]

        assert t.loc[e, "n"] == len(mine) == 12
        assert t.loc[e, "process_cpu_s_per_GB"] == pytest.approx(
            med(lambda r: float(r["cpu_user_s"]) + float(r["cpu_sys_s"]))
        )
        assert t.loc[e, "host_cpu_s_per_GB"] == pytest.approx(med(lambda r: float(r["host_cpu_s"])))
        if e != "gds":  # the snapshot paths; gds persists inside its stall (below)
            assert t.loc[e, "stall_host_cpu_s_per_GB"] == pytest.approx(
                med(lambda r: float(r["stall_host_cpu_s"]))
            )
    # a snapshot path: the cores busy while it persists = the persist phase's host CPU / persist_s
    cd = [r for r in rows if r["engine"] == "cpu-double"]
    assert t.loc["cpu-double", "cores_persisting"] == pytest.approx(
        statistics.median(
            (float(r["host_cpu_s"]) - float(r["stall_host_cpu_s"])) / float(r["persist_s"])
            for r in cd
        )
    )
    # a path durable when save() returns has no persist phase: all of its cost is its stall's
    for e in ("gds", "torch-save"):
        assert t.loc[e, "persist_host_cpu_s_per_GB"] == 0
        assert t.loc[e, "stall_host_cpu_s_per_GB"] == pytest.approx(t.loc[e, "host_cpu_s_per_GB"])


def test_dram_is_derived_from_the_traits_where_no_counter_was_read(run: runs.Run) -> None:
    t = cost.table(run).set_index("engine")
    assert set(t["dram_source"]) == {"derived (emulated)"}
    # host-emulated: a snapshot is a memcpy (2), a buffered write copies (2), the disk reads (1)
    assert t.loc["cpu-double", "dram_bytes_per_byte"] == 5
    assert t.loc["cpu-single", "dram_bytes_per_byte"] == 3
    assert t.loc["gds", "dram_bytes_per_byte"] == 1  # the disk reads the "device" memory
    assert t.loc["torch-save", "dram_bytes_per_byte"] == 3  # serialised from the tensors in place
    # on a GPU: the DMA lands each byte once, GDS never touches host memory
    assert t.loc["cpu-double", "dram_bytes_per_byte_gpu"] == 4
    assert t.loc["gds", "dram_bytes_per_byte_gpu"] == 0
    # where the memory controllers were read, the measurement wins, and says so
    ok = run.ok.assign(dram_bytes=2.5 * run.ok["total_bytes"])
    m = cost.table(dataclasses.replace(run, ok=ok)).set_index("engine")
    assert set(m["dram_source"]) == {"measured"}
    assert m.loc["cpu-double", "dram_bytes_per_byte"] == pytest.approx(2.5)


def test_traits_derive_dram_per_byte_for_each_path() -> None:
    gpu = {e: t.dram_per_byte(False) for e, t in BUILTIN.items()}
    assert gpu == {
        "gds": (0.0, 0.0),
        "cpu-single": (1.0, 1.0),  # DMA into staging | the SSD reads it
        "cpu-double": (1.0, 3.0),  # DMA | copy into the page cache (2), the SSD reads it
        "torch-save": (4.0, 0.0),  # all in its stall
        "dcp": (1.0, 3.0),
    }
    emu = {e: sum(t.dram_per_byte(True)) for e, t in BUILTIN.items()}
    assert emu == {"gds": 1, "cpu-single": 3, "cpu-double": 5, "torch-save": 3, "dcp": 5}
    fp = dataclasses.replace(BUILTIN["torch-save"], page_cache=False, o_direct=True, host_passes=1)
    assert fp.dram_per_byte(False) == (4.0, 0.0)  # FastPersist's copy into its pinned buffer


def test_kernel_beside_reads_the_spread_not_one_number(run: runs.Run) -> None:
    more, less = cost.kernel_beside(run)
    assert not set(more) & set(less)
    # plant kernel work of 50 ms beside every cpu-double save
    ok = run.ok.copy()
    cd = ok["engine"] == "cpu-double"
    ok.loc[cd, "host_cpu_s"] = ok.loc[cd, "cpu_user_s"] + ok.loc[cd, "cpu_sys_s"] + 0.05
    more, _ = cost.kernel_beside(dataclasses.replace(run, ok=ok))
    assert "cpu-double" in more


def test_a_run_before_the_host_columns_reports_its_process_figure() -> None:
    old = runs.load(str(OLD))
    assert not cost.has_host(old)
    t = cost.table(old).set_index("engine")
    assert t["host_cpu_s_per_GB"].isna().all()
    assert (t["process_cpu_s_per_GB"] > 0).all()
    assert {e: w for e, (_, _, w) in cost.cpu_cost(old).items()} == {e: "process" for e in t.index}
    assert "no host figure in this run" in host_answer(old, [])


def test_report_section_and_figure(run: runs.Run, tmp_path: Path) -> None:
    built = build(str(HOST), str(tmp_path))
    md = (tmp_path / "report.md").read_text()
    assert "## What each path costs the host" in md
    assert_answers_first(md)
    assert_glossary_complete(md)
    assert (tmp_path / "host_cpu.png").stat().st_size > 10_000
    assert (tmp_path / "host_cpu.pdf").read_bytes().startswith(b"%PDF")
    assert str(tmp_path / "host_cost.csv") in built.paths
    t = cost.table(run).set_index("engine")
    cd = t.loc["cpu-double"]
    row = (
        f"| cpu-double | 12 | {cd['process_cpu_s_per_GB']:.2f} | {cd['host_cpu_s_per_GB']:.2f} | "
        f"{cd['stall_host_cpu_s_per_GB']:.2f} | {cd['persist_host_cpu_s_per_GB']:.2f} | "
        f"{cd['cores_persisting']:.2f} | 5.0 (derived (emulated)) | 4.0 |"
    )
    assert row in md
    # the answer's line, with this run's figures and the servers' verdicts
    line = next(ln for ln in md.splitlines() if ln.startswith("**What it costs the host"))
    assert f"cpu-double {cd['host_cpu_s_per_GB']:.2f} ({cd['process_cpu_s_per_GB']:.2f})" in line
    assert "dgx-h100-gen4: affords every path" in line
    assert "nd-h200-v5: unknown for cpu-single" in line
    # the verdicts charge this run's CPU cost, not the reference file's
    assert "| dgx-h100-gen4 | cpu-double | " in md
    need = host_need(with_run_cost(load_profiles(), run)[1], "cpu-double")
    assert f"| dgx-h100-gen4 | cpu-double | {need.host_cores:.1f} (112) |" in md
    assert need.cpu_s_per_GB == pytest.approx(cd["host_cpu_s_per_GB"])


def test_this_machine_takes_its_host_from_the_run(run: runs.Run) -> None:
    p = from_run(run)
    assert p.host_cores == run.env["cpu"]["logical_cores"] == 2
    copy = float(
        np.mean([np.median(run.env[k]["copy_runs"]) for k in ("ceilings", "ceilings_after")])
    )
    assert p.dram_Bps == pytest.approx(2 * copy) and p.dram_lower_bound
    assert "a lower bound" in p.sources["dram_GBps"][1]
    costs = {e: t for e, t, _ in p.cpu_cost}
    assert costs["cpu-double"] == pytest.approx(
        cost.table(run).set_index("engine").loc["cpu-double", "host_cpu_s_per_GB"]
    )
    # more DRAM traffic than the run saw the host move is not "cannot afford": not known
    n = host_need(p, "cpu-double")
    assert n.dram_Bps > p.dram_Bps
    assert n.verdict.startswith("unknown: ") and "more than the" in n.verdict
    assert host_need(
        dataclasses.replace(p, dram_lower_bound=False), "cpu-double"
    ).verdict.startswith("cannot afford")
    assert not math.isnan(n.cpu_s_per_GB or math.nan)


def test_cpu_cost_script_writes_what_the_model_reads(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "scripts/cpu_cost.py", str(HOST), "--note", "a test"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (tmp_path / "cpu-cost").mkdir()
    (tmp_path / "cpu-cost" / "reference.yaml").write_text(out)
    rows, source = reference_cpu_cost(tmp_path)
    got = {e: (t, p) for e, t, p in rows}
    t = cost.table(runs.load(str(HOST))).set_index("engine")
    assert got["dcp"][0] == pytest.approx(t.loc["dcp", "host_cpu_s_per_GB"], abs=1e-4)
    assert got["dcp"][1] == pytest.approx(t.loc["dcp", "persist_host_cpu_s_per_GB"], abs=1e-4)
    assert "20261205T113902Z-default-3518d9" in source and "a test" in source
    bad = subprocess.run(
        [sys.executable, "scripts/cpu_cost.py", str(tmp_path / "nope")],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1


def test_the_report_judges_the_servers_with_the_runs_own_cpu_cost(run: runs.Run) -> None:
    # the same run on a host 100 times slower per byte: the servers' verdicts follow it
    ok = run.ok.copy()
    for c in ("host_cpu_s", "stall_host_cpu_s", "cpu_user_s", "cpu_sys_s", "stall_cpu_s"):
        ok[c] = ok[c] * 100
    slow = dataclasses.replace(run, ok=ok)
    servers = load_profiles()
    judged = with_run_cost(servers, slow)
    assert all(slow.run_id in p.cpu_cost_source for p in judged)
    line = host_answer(slow, servers)
    assert "dgx-h100-gen4: cannot afford gds, cpu-single, cpu-double, torch-save, dcp" in line
    assert "dgx-h100-gen4: affords every path" in host_answer(run, servers)
