"""The row types of the results files (bench/measure/results.py, bench/measure/columns.py): each
column declared once, with a doc; the CSV header in the type's order; the docs tables
(docs/results.md) the type's; older runs read with the defaults of the columns they lack."""

from __future__ import annotations

import csv
import dataclasses
import os
import re
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPO, result_row

from bench.measure import columns, hostcost, results, timers
from bench.measure.columns import column

FIXTURES = REPO / "tests" / "fixtures" / "runs"
OLDEST = FIXTURES / "20261202T160516Z-default-b10c3b"  # before ranks, caps and host columns
KINDS = list(results.DOCS.values())


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
def test_every_column_has_a_doc_and_a_csv_type(kind: type) -> None:
    got = columns.columns(kind)
    assert [c.name for c in got] == [f.name for f in dataclasses.fields(kind)]
    for c in got:
        assert len(c.doc) > 10 and c.doc.endswith("."), c
        assert c.kind in ("bool", "int", "float", "text"), c


def test_a_column_added_without_a_doc_is_refused() -> None:
    @dataclasses.dataclass(kw_only=True)
    class Grown(results.Row):
        fresh_s: float | None = None

    with pytest.raises(TypeError, match=r"Grown\.fresh_s: not declared with column\(\) \(no doc\)"):
        columns.columns(Grown)
    with pytest.raises(ValueError, match="a column needs a doc"):
        column("  ")

    @dataclasses.dataclass
    class Odd:
        blob: list[int] = column("A list, which no CSV cell holds.", None)

    with pytest.raises(TypeError, match="column blob: type"):
        columns.columns(Odd)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
def test_floats_carry_their_unit_in_the_name(kind: type) -> None:
    """Times in seconds (`_s`), CPU rates in cores (`_cores`), ratios `_efficiency`; the
    step's loss has no unit."""
    for c in columns.columns(kind):
        if c.kind == "float":
            assert c.name == "loss" or c.name.endswith(("_s", "_cores", "_efficiency")), c.name


def test_results_header_is_the_row_type_in_order(tmp_path: Path) -> None:
    assert results.COLUMNS == columns.names(results.Row)
    assert results.COLUMNS[:6] == ["run_id", "case_id", "engine", "device", "emulated", "gds_mode"]
    assert results.COLUMNS[-2:] == ["device_read_bytes", "restore_witness"]
    w = results.RowWriter(str(tmp_path / "results.csv"))
    w.write(result_row(stall_s=0.5, error="OSError: x"))
    w.close()
    with open(tmp_path / "results.csv", newline="") as f:
        head, cells = list(csv.reader(f))
    assert head == results.COLUMNS
    got = dict(zip(head, cells, strict=True))
    assert (got["stall_s"], got["error"], got["total_s"], got["rank"]) == (
        "0.5",
        "OSError: x",
        "",
        "0",
    )
    with pytest.raises(TypeError, match="a StepRow, not a Row"):
        results.RowWriter(str(tmp_path / "b.csv")).write(
            results.StepRow(
                run_id="r",
                engine="none",
                device="cuda",
                emulated=False,
                step=0,
                step_s=1.0,
                compute_s=1.0,
                t_start_s=0.0,
                t_end_s=1.0,
                loss=2.0,
            )
        )


@pytest.mark.parametrize("run", sorted(p.name for p in FIXTURES.iterdir() if p.is_dir()))
def test_written_results_keep_their_columns_names_and_order(run: str) -> None:
    """Every committed run's header: its columns are the type's, in the type's order (newer
    columns may sit between them), or retired ones; none renamed, none moved."""
    with open(FIXTURES / run / "results.csv", newline="") as f:
        head = next(csv.reader(f))
    known = [c for c in head if c in results.COLUMNS]
    assert set(head) - set(known) <= set(results.RETIRED), set(head) - set(known)
    assert known == [c for c in results.COLUMNS if c in known]
    assert columns.missing(results.Row, head) == []


def test_an_older_run_reads_the_defaults_of_the_columns_it_lacks() -> None:
    with open(OLDEST / "results.csv", newline="") as f:
        head = next(csv.reader(f))
    assert "rank" not in head and "host_cpu_s" not in head and "capped" not in head
    df = results.read_rows(str(OLDEST))
    assert list(df.columns) == results.COLUMNS  # every column, in the type's order
    assert set(df["rank"]) == {0} and set(df["world_size"]) == {1} and set(df["node"]) == {""}
    assert not df["aggregate"].any() and not df["capped"].any()
    assert set(df["ranks_active"]) == {1} and set(df["target_map"]) == {""}
    assert df["host_cpu_s"].isna().all() and df["restore_into"].isna().all()
    for c in ("emulated", "warmup", "verified", "checksums", "aggregate", "ceiling_beaten"):
        assert df[c].dtype == bool, c
    assert set(df["error"]) == {""} and df["rank"].dtype.kind == "i"


def test_empty_cells_read_the_columns_defaults(tmp_path: Path) -> None:
    row = result_row(gds_mode="", node="", error="")
    w = results.RowWriter(str(tmp_path / "results.csv"))
    w.write(row)
    w.close()
    df = results.read_rows(str(tmp_path))
    r = df.iloc[0]
    assert (r["gds_mode"], r["error"], r["options"], r["run_id"]) == ("none", "", "{}", "r")
    assert df["staging_grew"].dtype == bool and not r["staging_grew"]
    assert pd.isna(r["stall_s"]) and pd.isna(r["restore_into"])


def test_a_file_without_the_first_columns_is_refused(tmp_path: Path) -> None:
    (tmp_path / "results.csv").write_text("run_id,engine,stall_s\nx,gds,1.0\n")
    with pytest.raises(results.MissingColumns, match="lacks columns case_id, device, emulated"):
        results.read_rows(str(tmp_path))


def test_rows_are_built_by_keyword_with_their_identity() -> None:
    """The case's identity (the columns without a default) must be given, by name; every
    measurement starts empty."""
    with pytest.raises(TypeError):
        results.Row("r", "c")  # type: ignore[misc]
    identity = {c.name for c in columns.columns(results.Row) if not c.has_default}
    cells = {k: v for k, v in columns.values(result_row()).items() if k in identity}
    del cells["options"]
    with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'options'"):
        results.Row(**cells)
    row = result_row()
    assert (row.stall_s, row.verified, row.error, row.rank) == (None, False, "", 0)
    assert (row.gds_mode, row.aggregate, row.node, row.world_size) == ("none", False, "", 1)


def test_measurements_fill_the_columns_of_their_names() -> None:
    """hostcost.Cost and timers.Sample are named as columns: they fill a row, and a field that
    is no column is refused."""
    row = result_row()
    cost = hostcost.Cost(1.0, 0.5, 0.25, 2.0, 0.3, 3.0, 0.1, 0.01, 0.02, 7, 3)
    columns.fill(row, cost)
    columns.fill(row, timers.Sample(page_cache_peak_bytes=5, rss_peak_bytes=6))
    assert (row.host_cpu_s, row.stall_dram_bytes, row.page_cache_peak_bytes) == (2.0, 3, 5)
    assert (row.cpu_user_s, row.cpu_sys_s) == (0.0, 0.0)  # the Sample's, filled after

    @dataclasses.dataclass
    class Stray:
        not_a_column_s: float = 1.0

    with pytest.raises(KeyError, match="Stray.not_a_column_s is no column of Row"):
        columns.fill(row, Stray())


def test_the_docs_tables_are_the_row_types() -> None:
    """docs/results.md carries one table per row type, as `make columns` writes it: a column
    added, moved or documented anew without it fails here."""
    text = (REPO / "docs" / "results.md").read_text()
    assert columns.doc_blocks(text) == list(results.DOCS)
    assert columns.render_docs(text, results.DOCS) == text, "docs/results.md: run make columns"
    table = columns.markdown_table(results.Row, ranks=True).splitlines()
    assert table[0] == "| column | type | aggregate row | what it holds |"
    assert table[2].startswith("| `run_id` | text | first rank's | The run: ")
    assert "| `stall_s` | float or empty | max | " in text
    moved = text.replace("| `stall_s` |", "| `stall_seconds` |")
    assert columns.render_docs(moved, results.DOCS) == text


def test_analysis_readme_names_only_columns_that_exist() -> None:
    """analysis/README.md explains how the host columns are measured in a table of its own
    (grouped, with the method): every column it names is a column of results.csv, and every
    host column of results.Row is explained there."""
    lines = (REPO / "analysis" / "README.md").read_text().splitlines()
    start = lines.index("| column | what |")
    named: list[str] = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        named += re.findall(r"`(\w+)`", line.split("|")[1])
    assert named and set(named) <= set(results.COLUMNS), set(named) - set(results.COLUMNS)
    assert {f.name for f in dataclasses.fields(hostcost.Cost)} <= set(named)


def test_a_new_run_dir_under_a_relative_root_that_does_not_exist(tmp_path, monkeypatch) -> None:
    """`-o a/b` relative and missing: every folder made, each named durably in its parent (the
    walk up to the first existing folder once looped forever on a relative path)."""
    from bench.measure import results as results_mod

    synced: list[str] = []
    monkeypatch.setattr(results_mod, "fsync_dir", synced.append)
    monkeypatch.chdir(tmp_path)
    run_id, path = results_mod.new_run_dir(os.path.join("a", "b"), "cfg")
    assert os.path.isdir(path) and path == os.path.join("a", "b", run_id)
    made = [tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / run_id]
    assert synced == [str(d.parent) for d in made]
