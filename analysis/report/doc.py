"""A small document model, rendered to Markdown and HTML alike (report.md and report.html,
compare.md), and writing it. Imports nothing of the project.
"""

from __future__ import annotations

import html
import os
from dataclasses import dataclass, field

from markdown_it import MarkdownIt


@dataclass
class Doc:
    """Blocks of a report, each kept as Markdown; the HTML is that Markdown rendered by
    markdown-it-py (CommonMark with tables), so the two cannot say different things."""

    blocks: list[str] = field(default_factory=list)

    def h(self, level: int, text: str) -> None:
        self.blocks.append(f"{'#' * level} {text}")

    def p(self, text: str) -> None:
        self.blocks.append(text)

    def warn(self, text: str) -> None:
        self.blocks.append(f"> **{text}**")

    def ul(self, items: list[str]) -> None:
        self.blocks.append("\n".join(f"- {i}" for i in items))

    def table(self, headers: list[str], rows: list[list[str]]) -> None:
        self.blocks.append(md_table(headers, rows))

    def img(self, path: str, caption: str) -> None:
        self.blocks.append(f"![{caption.split('.')[0]}]({path})\n\n*{caption}*")

    def pre(self, text: str) -> None:
        self.blocks.append(f"```\n{text}\n```")

    def markdown(self) -> str:
        return "\n\n".join(self.blocks) + "\n"

    def html(self, title: str) -> str:
        # html=False: text that looks like a tag is shown, never passed through as markup.
        body = MarkdownIt("commonmark", {"html": False}).enable("table").render(self.markdown())
        head = f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title>"
        return "\n".join([head, CSS, body])


CSS = """<style>
body{font-family:sans-serif;max-width:75em;margin:1em auto;padding:0 1em;font-size:14px}
table{border-collapse:collapse;font-size:12px;margin:.5em 0}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}th{background:#f3f3f3}
img{max-width:100%}blockquote{color:#a00;margin:.5em 0}code{background:#f3f3f3}
</style>"""


def columns(
    table: tuple[list[str], list[list[str]]], keep: list[str]
) -> tuple[list[str], list[list[str]]]:
    """The columns of `table` (headers, rows) named in `keep`, in that order: a table's first
    columns for a reader, the whole table kept for the appendix. A header named twice in
    `table` is taken at its first place."""
    headers, rows = table
    at = [headers.index(k) for k in keep]
    return list(keep), [[r[i] for i in at] for r in rows]


def md_table(headers: list[str], rows: list[list[str]]) -> str:
    def cell(c: str) -> str:
        return str(c).replace("|", "\\|")

    lines = [
        "| " + " | ".join(cell(h) for h in headers) + " |",
        "|" + "|".join("---" for _ in headers) + "|",
    ]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def write_doc(doc: Doc, outdir: str, run_id: str) -> list[str]:
    """report.md and report.html of `doc` in `outdir`; their paths."""
    md = os.path.join(outdir, "report.md")
    with open(md, "w") as f:
        f.write(doc.markdown())
    html_path = os.path.join(outdir, "report.html")
    with open(html_path, "w") as f:
        f.write(doc.html(f"ckptbench report {run_id}"))
    return [md, html_path]
