"""report.md's shape on the committed fixture runs: each section answers its question first, in
a sentence with the run's numbers, then its figure, then its table's first columns; the whole
tables under All columns; a glossary of every column at the end, from the row types' docs.
(The report's numbers and wording section by section: test_analysis_*.py, test_cost.py,
test_contention.py, test_training.py, test_mlperf.py.)"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pandas as pd
import pytest
from conftest import assert_answers_first, assert_glossary_complete, report_sections

from analysis import contention, cost, mlperf, scaling, stats, training
from analysis import runs as runs_mod
from analysis.model.calibrate import from_run
from analysis.model.profiles import load_profiles
from analysis.model.published import table as validation_table
from analysis.model.published import validate
from analysis.model.render import FORMULAS_MD
from analysis.report import glossary, restore, tuning
from analysis.report.answer import PROFILE_FIRST, profile_rows
from analysis.report.build import build
from analysis.report.doc import Doc
from analysis.report.host import host_profile_rows
from analysis.report.model import model_frame, model_vs_measured
from analysis.report.summary import FIRST
from analysis.report.training import restart_rows

DEFAULT = Path(__file__).parent / "fixtures" / "runs" / "20261202T160516Z-default-b10c3b"


@pytest.fixture(scope="module")
def md(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("report")
    build(str(DEFAULT), str(out))
    return (out / "report.md").read_text()


def test_each_section_opens_with_its_answer(md: str) -> None:
    assert_answers_first(md)
    secs = report_sections(md)
    assert list(secs) == [
        "Is GDS worth it here?",
        "Summary",
        "Restores",
        "What each path costs the host",
        "The model",
        "Environment",
        "All columns",
        "Glossary",
    ]
    # the answers, with this run's numbers
    assert secs["Is GDS worth it here?"][0] == (
        "Here gds stalled training 1.73x as long as cpu-single (median of 4 cases, "
        "host-emulated); the profiled servers would need 2-4 SSDs per GPU for GDS to stall no "
        "longer, and carry about 1."
    )
    assert secs["Summary"][0].startswith("The shortest stall is by cpu-single, ")
    # then the figure, then the table of the columns a reader needs first
    gds = [b for b in secs["Is GDS worth it here?"] if not b.startswith("*Figure")]
    assert gds[1].startswith("![Figure 4](feasibility.png)")
    assert gds[2].startswith("| " + " | ".join(PROFILE_FIRST) + " |")
    summ = secs["Summary"]
    fig = next(i for i, b in enumerate(summ) if b.startswith("!["))
    tab = next(i for i, b in enumerate(summ) if b.startswith("|"))
    assert fig < tab and summ[tab].startswith("| " + " | ".join(FIRST) + " |")
    rest = secs["Restores"]
    fig = next(i for i, b in enumerate(rest) if b.startswith("!["))
    tab = next(i for i, b in enumerate(rest) if b.startswith("|"))
    assert fig < tab and len(rest[tab].splitlines()[0].split(" | ")) == len(restore.FIRST)


def test_the_first_tables_are_narrow_and_every_column_is_kept(md: str) -> None:
    """The sections' tables show at most 10 columns; All columns holds the whole tables."""
    for head, blocks in report_sections(md).items():
        if head in ("All columns", "The model"):
            continue  # the appendix; the model's own tables are its comparison
        for b in blocks:
            if b.startswith("|"):
                assert b.splitlines()[0].count(" | ") + 1 <= 10, (head, b.splitlines()[0])
    whole = "\n\n".join(report_sections(md)["All columns"])
    run = runs_mod.load(str(DEFAULT))
    table = stats.summary_table(run)
    for headers, rows in (
        stats.summary_rows(table),
        restore.restore_rows(run, table),
        cost.rows_md(cost.table(run)),
        profile_rows(load_profiles() + [from_run(run)]),
    ):
        assert "| " + " | ".join(headers) + " |" in whole
        for r in rows:
            assert "| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" in whole


def test_the_glossary_holds_every_column_of_the_tables(md: str) -> None:
    assert_glossary_complete(md)
    gl = md.split("\n## Glossary\n", 1)[1]
    # a derived column beside the results column it is computed from, whose doc is the row
    # type's own (bench.measure.results), not a copy
    assert "- **stall us/tensor**: Median stall_s over the tensor count" in gl
    assert "- `n_tensors`: Tensors in the state." in gl
    # the definitions left the sections for it
    before = md.split("\n## Glossary\n", 1)[0]
    assert "'stall us/tensor' and 'persist us/tensor' = median" not in before
    assert "'page cache left xS' = " not in before


def test_every_table_the_report_can_print_has_its_terms() -> None:
    """Every header the report's tables can carry has a glossary term: the tables of every
    kind of run, not only the fixture's (a new column without a term fails here)."""
    run = runs_mod.load(str(DEFAULT))
    table = stats.summary_table(run).assign(write_eff=0.5)  # with the efficiency columns
    this = from_run(run)
    profiles = load_profiles() + [this]
    empty = pd.DataFrame(columns=["engine", "n_targets", "restart_s"])
    d = Doc()
    d.p(FORMULAS_MD)  # a table inside a Markdown block
    for t in (
        stats.summary_rows(table),
        restore.restore_rows(run, table),
        cost.rows_md(cost.table(run)),
        host_profile_rows(profiles),
        profile_rows(profiles),
        model_vs_measured(model_frame(run, this)),
        validation_table(validate()),
        (["input", "value", "kind", "source"], []),
        (mlperf.HEADERS, []),
        (tuning.HEADERS, []),
        scaling.rows(empty),
        contention.rows(empty),
        training.summary_rows(empty),
        restart_rows(cast(training.TrainingRun, SimpleNamespace(engines=[], ckpts=empty))),
    ):
        d.table(*t)
    used = glossary.table_headers(d.markdown())
    assert glossary.undefined(used) == []
    assert len(used) > 80
