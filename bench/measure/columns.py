"""Typed rows: one dataclass per results file, whose fields are the file's columns.

A row type is a dataclass whose every field is made by `column()`: its name (units in it:
`_s`, `_bytes`), its type, a doc, a default, and two facts about the files already written:
whether every file of that kind holds the column (`required`), and how the aggregate row of a
multi-rank repetition combines the ranks' values (`ranks`, results.csv only). Everything else
is derived from the type, so that nothing lists the columns a second time:

- the CSV header, in the fields' order (`names`), and a row's cells (`values`);
- reading a file back (`frame`): the columns a file must have, what a file written before a
  column existed reads for it (the field's default, else empty), the text and true/false
  columns typed, empty cells of a column with a default read as that default;
- the docs table (`markdown_table`), which docs/results.md carries between
  `<!-- columns: NAME -->` and `<!-- /columns -->` (`make columns` writes them, a test checks
  them).

Imports pandas only for its types: the runs themselves never load it.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import types
import typing
from typing import TYPE_CHECKING, Any, Literal, Union

if TYPE_CHECKING:
    import pandas as pd

# How the aggregate row of a multi-rank repetition combines its ranks' values
# (bench.run.rows.aggregate): the first rank's value, the maximum (the job waits for its slowest
# rank), the sum, true if all or any rank's is, or a rule of the aggregate's own (`own`). `max`
# and `sum` are empty where a rank has no value.
Ranks = Literal["first", "max", "sum", "all", "any", "own"]
RANKS_SAID: dict[str, str] = {
    "first": "first rank's",
    "max": "max",
    "sum": "sum",
    "all": "all ranks",
    "any": "any rank",
    "own": "own rule",
}
KINDS = {bool: "bool", int: "int", float: "float", str: "text"}


def column(
    doc: str,
    default: Any = dataclasses.MISSING,
    *,
    required: bool = False,
    ranks: Ranks = "first",
) -> Any:
    """A column of a row type. `doc`: what it holds, in a sentence or two (the docs table);
    `default`: its value until measured, and what a file written before the column existed
    reads (none: whoever builds a row must give it, and an older file reads it empty);
    `required`: every file of this kind holds it (the first runs wrote it), so a file without
    it is no such file; `ranks`: how an aggregate row combines the ranks' values."""
    text = " ".join(doc.split())
    if not text:
        raise ValueError("a column needs a doc")
    meta = {"doc": text, "required": required, "ranks": ranks}
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass(frozen=True)
class Column:
    """One column of a row type, as `column()` declared it; `kind` is bool, int, float or text,
    `optional` whether it may be empty (its type admits None)."""

    name: str
    kind: str
    optional: bool
    doc: str
    default: Any
    required: bool
    ranks: Ranks

    @property
    def has_default(self) -> bool:
        return self.default is not dataclasses.MISSING

    @property
    def type_said(self) -> str:
        """The type as the docs table says it: `float`, `int or empty`, `text`..."""
        return f"{self.kind} or empty" if self.optional else self.kind


def _kind(name: str, hint: Any) -> tuple[str, bool]:
    """(kind, optional) of a field's type: a bool, int, float or str, or one of them | None."""
    args = typing.get_args(hint)
    optional = typing.get_origin(hint) in (Union, types.UnionType) and type(None) in args
    if optional:
        rest = [a for a in args if a is not type(None)]
        hint = rest[0] if len(rest) == 1 else hint
    if hint not in KINDS:
        raise TypeError(f"column {name}: type {hint!r} is not bool, int, float or str (| None)")
    return KINDS[hint], optional


@functools.cache
def columns(kind: type) -> tuple[Column, ...]:
    """The columns of row type `kind`, in the file's order. Raises TypeError for a field not
    made by `column()` (no doc) or of a type a CSV cell cannot hold."""
    hints = typing.get_type_hints(kind)
    out = []
    for f in dataclasses.fields(kind):
        if "doc" not in f.metadata:
            raise TypeError(f"{kind.__name__}.{f.name}: not declared with column() (no doc)")
        k, optional = _kind(f.name, hints[f.name])
        out.append(
            Column(
                f.name,
                k,
                optional,
                f.metadata["doc"],
                f.default,
                f.metadata["required"],
                f.metadata["ranks"],
            )
        )
    return tuple(out)


def names(kind: type) -> list[str]:
    """The CSV header of row type `kind`."""
    return [c.name for c in columns(kind)]


def values(row: Any) -> dict[str, Any]:
    """A row's cells by column, in the file's order."""
    kind: type = type(row)  # mypy takes type(an Any) for unhashable (python/mypy#11470)
    return {c.name: getattr(row, c.name) for c in columns(kind)}


def fill(row: Any, part: Any) -> None:
    """Set the row's columns from `part`, a dataclass whose fields are named as columns (a
    measurement's result: bench.measure.hostcost.Cost, timers.Sample). Raises KeyError for a
    field that is no column of the row."""
    known = set(names(type(row)))
    for f in dataclasses.fields(part):
        if f.name not in known:
            raise KeyError(f"{type(part).__name__}.{f.name} is no column of {type(row).__name__}")
        setattr(row, f.name, getattr(part, f.name))


def missing(kind: type, header: Any) -> list[str]:
    """The required columns of row type `kind` that a file's header lacks."""
    have = set(header)
    return [c.name for c in columns(kind) if c.required and c.name not in have]


def read_types(kind: type) -> dict[str, Any]:
    """`dtype` for pandas.read_csv: the text and true/false columns as text (typed by `frame`;
    a text column of digits must not read as numbers)."""
    return {c.name: str for c in columns(kind) if c.kind in ("text", "bool")}


def frame(df: pd.DataFrame, kind: type) -> pd.DataFrame:
    """A file's rows typed as row type `kind` says (a copy). A column the file lacks (written
    before it existed) reads its default, else empty; true/false columns become bools (an
    empty cell: the default, else false, or empty where the column may be); an empty cell of a text column, or of a whole-number
    column that is never empty, reads the column's default; text stays text. The type's
    columns come first, in its order; columns that are not the type's follow as they are."""
    df = df.copy()
    for c in columns(kind):
        fallback = c.default if c.has_default else None
        if c.kind == "bool" and not c.optional:
            fallback = bool(fallback)
        if c.name not in df:
            df[c.name] = fallback
            continue
        s = df[c.name]
        if c.kind == "bool":
            df[c.name] = as_bool(s).astype(object).where(s.notna(), fallback)
            if not c.optional:
                df[c.name] = df[c.name].astype(bool)
        elif c.kind == "text" and not c.optional:
            text = as_text(s, "")
            df[c.name] = text.where(text != "", fallback) if fallback else text
        elif c.kind == "int" and not c.optional and c.has_default:
            df[c.name] = s.fillna(fallback).astype(int)
    ours = names(kind)
    return df[ours + [c for c in df.columns if c not in ours]]


def markdown_table(kind: type, ranks: bool = False) -> str:
    """The docs table of row type `kind`: column, type, (how an aggregate row combines the
    ranks) and what it holds."""
    head = ["column", "type"] + (["aggregate row"] if ranks else []) + ["what it holds"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in columns(kind):
        cells = [f"`{c.name}`", c.type_said]
        cells += [RANKS_SAID[c.ranks]] if ranks else []
        cells.append(c.doc.replace("|", "\\|"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def as_bool(s: pd.Series) -> pd.Series:
    """A true/false column as bools, whether pandas read it as bools or as text."""
    if s.dtype == bool:
        return s
    return s.astype(str).str.strip().str.lower().isin(["true", "1", "yes"])


def as_text(s: pd.Series, missing: str) -> pd.Series:
    """A text column with `missing` for empty cells (pandas reads an all-empty column as NaN)."""
    return s.astype(object).where(s.notna(), missing).astype(str)


# A docs block: `<!-- columns: NAME ... -->`, the table, `<!-- /columns -->`.
_BLOCK = re.compile(
    r"(?P<open><!-- columns: (?P<name>\S+)[^>]*-->\n)(?P<table>.*?)(?P<close><!-- /columns -->)",
    re.S,
)


def doc_blocks(text: str) -> list[str]:
    """The names of the docs blocks in `text`, in order."""
    return [m["name"] for m in _BLOCK.finditer(text)]


def render_docs(text: str, kinds: dict[str, type]) -> str:
    """`text` (a docs page) with every docs block's table written again from its row type
    (`kinds`: block name -> row type); an aggregate-row column where the type has rules other
    than `first`. Raises KeyError for a block of no known type."""

    def table(m: re.Match[str]) -> str:
        kind = kinds[m["name"]]
        ranks = any(c.ranks != "first" for c in columns(kind))
        return m["open"] + markdown_table(kind, ranks) + "\n" + m["close"]

    return _BLOCK.sub(table, text)
