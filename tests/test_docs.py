"""The docs (README.md and docs/*.md) as a reader follows them: every relative link and #anchor
resolves, anchors as GitHub renders headings; every `ckptbench ...` line of a code block parses
with the CLI's own parser (bench.cli.parser, nothing run) and names configs that exist; every
`make ...` line names real Makefile targets (`make -n`, the venv's stamp marked old so that
nothing bootstraps). The checkers are held against planted mistakes too."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO

from bench import cli
from bench.measure import columns

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# The venv's stamp (Makefile `$(BIN)/.installed`): with `-o` make neither remakes it nor runs a
# target's recipe on its account, so `make -n` prints the target's own commands only.
STAMP = ".venv/bin/.installed"
# The committed runs the README explains (tests/fixtures/README.md).
CMPA = "20261202T161542Z-cmpa-0ead53"
CMPB = "20261202T161559Z-cmpb-52ec19"
_FENCE = re.compile(r"^\s*(```|~~~)")
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def _lines(text: str) -> Iterator[tuple[bool, str]]:
    """Each line of a markdown text, with whether it lies inside a fenced code block (the fences
    count as inside)."""
    fenced = False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            yield True, line
        else:
            yield fenced, line


def _prose(text: str) -> str:
    """The text outside code blocks and code spans: where links and headings are."""
    kept = [ln for fenced, ln in _lines(text) if not fenced]
    return "\n".join(_CODE_SPAN.sub(" ", ln) for ln in kept)


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text (links, code and emphasis marks dropped),
    lower case, every character that is not a letter, digit, space, `-` or `_` removed, spaces
    made `-`."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of a page's headings; a repeated one gets `-1`, `-2`... as on GitHub."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for fenced, line in _lines(text):
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if fenced or not m:
            continue
        base = slug(m[1])
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(page: Path, text: str) -> list[str]:
    """Each relative link or #anchor of `text` (the page `page`) that leads nowhere."""
    bad = []
    for target in _LINK.findall(_prose(text)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not ours to check
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(
                f"{target}: no file {dest.relative_to(REPO) if dest.is_relative_to(REPO) else dest}"
            )
            continue
        if anchor:
            if dest.suffix != ".md" or dest.is_dir():
                bad.append(f"{target}: an anchor into something that is no markdown page")
            elif anchor not in anchors(dest.read_text() if dest != page else text):
                bad.append(f"{target}: no heading makes #{anchor}")
    return bad


def command_lines(text: str) -> list[str]:
    """The command lines of a page's code blocks: a `$ ` prompt dropped, lines continued with a
    backslash joined."""
    out: list[str] = []
    held = ""
    for fenced, line in _lines(text):
        if not fenced or _FENCE.match(line):
            held = ""
            continue
        line = held + line.strip()
        if line.endswith("\\"):
            held = line[:-1].rstrip() + " "
            continue
        held = ""
        out.append(line.removeprefix("$ "))
    return out


def _argv(line: str) -> list[str]:
    try:
        return shlex.split(line, comments=True)
    except ValueError:  # an unbalanced quote: not a shell line (python, output)
        return []


def ckptbench_args(line: str) -> list[str] | None:
    """The arguments of a `ckptbench` (or `python -m bench`, `torchrun ... -m bench`) command
    line, None for any other line."""
    argv = _argv(line)
    if argv and Path(argv[0]).name == "ckptbench":
        return argv[1:]
    for i in range(len(argv) - 1):
        if argv[i] == "-m" and argv[i + 1] == "bench":
            return argv[i + 2 :]
    return None


def bad_ckptbench(line: str) -> str | None:
    """Why a ckptbench command line would not run as written: argparse's own complaint, or a
    config it names that does not exist; None when it parses."""
    args = ckptbench_args(line)
    if args is None:
        return None
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            cli.parser().parse_args(args)
    except SystemExit as e:
        if e.code:
            return err.getvalue().strip().splitlines()[-1]
    missing = [a for a in args if re.fullmatch(r"configs/[\w./-]+\.yaml", a)]
    missing = [a for a in missing if not (REPO / a).is_file()]
    return f"no such config: {', '.join(missing)}" if missing else None


def make_args(line: str) -> list[str] | None:
    """The arguments of a `make ...` line (variables and targets), None for any other line."""
    argv = _argv(line)
    return argv[1:] if argv[:1] == ["make"] and len(argv) > 1 else None


def bad_make(args: list[str]) -> str | None:
    """Why `make ARGS` would not run here as written: make's complaint about a target; None
    when `make -n` accepts it without bootstrapping the venv."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    p = subprocess.run(
        ["make", "-n", "-o", STAMP, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if p.returncode:
        return (p.stderr.strip() or p.stdout.strip()).splitlines()[-1]
    if " -m venv " in p.stdout:
        return "make -n would bootstrap the venv"
    return None


def _inline_make(text: str) -> list[str]:
    """`make ...` code spans in prose (`make scaling`, `make TORCH=... test`)."""
    spans = [m[2] for _, ln in _lines(text) for m in _CODE_SPAN.finditer(ln)]
    return [s for s in spans if s.startswith("make ")]


@pytest.mark.parametrize("page", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_and_anchor_resolves(page: Path) -> None:
    bad = broken_links(page, page.read_text())
    assert not bad, "\n".join([f"{page.name}: broken links", *bad])


@pytest.mark.parametrize("page", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_ckptbench_line_parses_with_the_cli(page: Path) -> None:
    lines = command_lines(page.read_text())
    bad = [f"{ln}\n    {why}" for ln in lines if (why := bad_ckptbench(ln))]
    assert not bad, "\n".join([f"{page.name}: commands that do not parse", *bad])


def test_the_docs_show_ckptbench_commands() -> None:
    """The checks above see the commands (a checker that found none would pass anything)."""
    shown = [ckptbench_args(ln) for p in DOCS for ln in command_lines(p.read_text())]
    subcommands = {args[0] for args in shown if args}
    assert {"run", "report", "compare", "model", "engines", "clean"} <= subcommands


def test_every_make_line_names_real_targets() -> None:
    """Every `make ...` of a code block, and every `make ...` code span in prose."""
    seen: dict[str, str] = {}
    for page in DOCS:
        text = page.read_text()
        for line in command_lines(text) + _inline_make(text):
            args = make_args(line)
            if args is not None:
                seen.setdefault(shlex.join(args), str(page.relative_to(REPO)))
    assert {"bench", "test", "columns", "report"} <= {a for k in seen for a in shlex.split(k)}
    bad = [
        f"{page}: make {args}\n    {why}"
        for args, page in seen.items()
        if (why := bad_make(shlex.split(args)))
    ]
    assert not bad, "\n".join(["make lines that name no target", *bad])


def test_the_columns_tables_live_on_the_results_page_only() -> None:
    """`make columns` writes docs/results.md; no other page carries a generated table."""
    results_page = REPO / "docs" / "results.md"
    assert columns.doc_blocks(results_page.read_text())
    for page in DOCS:
        if page != results_page:
            assert columns.doc_blocks(page.read_text()) == [], page.name


def _block_after(text: str, opening: str) -> list[str]:
    """The lines of the code block whose first lines are `opening`."""
    return text.split(opening, 1)[1].split("```", 1)[0].splitlines()


def _shown(shown: list[str], real: list[str]) -> list[str]:
    """The lines of a pasted output that the real output does not have; a line cut at `[...]`
    needs only to begin a real line."""
    out = []
    for line in shown:
        head, cut, _ = line.partition(" [...]")
        if not (any(r.startswith(head) for r in real) if cut else line in real):
            out.append(line)
    return out


def test_the_readme_pastes_the_real_output_of_the_committed_runs() -> None:
    """The summary and the comparison in README.md are what the analysis computes for the
    committed cmpa and cmpb runs today (the report's summary table and `compare`'s text, the
    repository's path left out as the README leaves it out)."""
    from analysis import compare, runs, stats
    from analysis.tables import text_table

    text = (REPO / "README.md").read_text()
    a, b = (str(REPO / "tests" / "fixtures" / "runs" / n) for n in (CMPA, CMPB))
    summary = text_table(*stats.summary_rows(stats.summary_table(runs.load(a))))
    shown = _block_after(text, f"$ ckptbench report tests/fixtures/runs/{CMPA} ")[1:]
    table = [ln for ln in shown if not ln.startswith("note: ")]
    assert len(table) == 8 and _shown(table, summary.splitlines()) == []
    real = compare.text(compare.compare([a, b])).replace(f"{REPO}{os.sep}", "")
    shown = _block_after(text, "```\nA = ")
    assert _shown(["A = " + shown[0], *shown[1:]], real.splitlines()) == []
    assert "4 of 6 differences are outside the noise (95% CI excludes 1)" in shown


# The checkers against planted mistakes: each must say what is wrong.


def test_github_anchors() -> None:
    text = "# A `b` c\n\n## No GPU: `host-emulated`\n\n## Results\n\n## Results\n\n```\n# not a heading\n```\n"
    assert anchors(text) == {"a-b-c", "no-gpu-host-emulated", "results", "results-1"}
    assert slug("Configs (`configs/*.yaml`)") == "configs-configsyaml"
    assert slug("MLPerf Storage's checkpoint workload") == "mlperf-storages-checkpoint-workload"
    assert slug("results.csv: one row per repetition") == "resultscsv-one-row-per-repetition"


def test_a_broken_link_or_anchor_is_named() -> None:
    page = REPO / "README.md"
    text = (
        "[ok](docs/engines.md) [ok](docs/engines.md#what-it-measures) [ok](#here)\n\n"
        "[gone](docs/enignes.md) [no](docs/engines.md#what-it-measure) [x](#there)\n\n"
        "`[in code](nowhere.md)` [web](https://example.com/x)\n\n# Here\n"
    )
    assert broken_links(page, text) == [
        "docs/enignes.md: no file docs/enignes.md",
        "docs/engines.md#what-it-measure: no heading makes #what-it-measure",
        "#there: no heading makes #there",
    ]


def test_a_misspelt_subcommand_option_or_config_is_named() -> None:
    text = (
        "```sh\n.venv/bin/ckptbench run configs/smoke.yaml -o out   # fine\n"
        "$ ckptbench compre results/a results/b\n"
        "ckptbench run configs/smoke.yaml \\\n    --sett repetitions=5\n"
        "torchrun --nproc-per-node 2 -m bench run configs/nosuch.yaml\n"
        "ckptbench: error: an error line, not a command\n```\n"
    )
    lines = command_lines(text)
    assert lines[2] == "ckptbench run configs/smoke.yaml --sett repetitions=5"
    said = [bad_ckptbench(ln) for ln in lines]
    assert said[0] is None and said[4] is None
    assert "invalid choice: 'compre'" in str(said[1])
    assert "unrecognized arguments: --sett" in str(said[2])
    assert said[3] == "no such config: configs/nosuch.yaml"


def test_a_make_line_with_no_such_target_is_named() -> None:
    assert bad_make(["bench", "CONFIG=configs/models.yaml", "ARGS=--set ssd_counts=[1]"]) is None
    assert "No rule to make target 'benhc'" in str(bad_make(["benhc"]))
    assert make_args("make mutate ARGS='--only plants'") == ["mutate", "ARGS=--only plants"]
    assert make_args("make") is None and make_args("python -m make x") is None


def test_make_columns_writes_the_results_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """scripts/columns.py (`make columns`) checks and writes docs/results.md: a table gone stale
    is said by --check (exit 1, nothing written) and written again without it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("columns_script", REPO / "scripts" / "columns.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.PAGE == REPO / "docs" / "results.md"
    page = tmp_path / "results.md"
    good = script.PAGE.read_text()
    page.write_text(good.replace("| `stall_s` |", "| `stall_seconds` |"))
    monkeypatch.setattr(script, "PAGE", page)
    monkeypatch.setattr("sys.argv", ["columns.py", "--check"])
    assert script.main() == 1 and page.read_text() != good
    assert "results.md: a columns table differs from its row type" in capsys.readouterr().out
    monkeypatch.setattr("sys.argv", ["columns.py"])
    assert script.main() == 0 and page.read_text() == good
