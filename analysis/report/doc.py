"""A small document model, rendered to Markdown and HTML alike (report.md and report.html,
compare.md), and writing it. Imports nothing of the project.
"""

from __future__ import annotations

import html
import os
import re
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Doc:
    """Blocks of a report, rendered to Markdown and HTML alike."""

    blocks: list[tuple[str, Any]] = field(default_factory=list)

    def h(self, level: int, text: str) -> None:
        self.blocks.append(("h", (level, text)))

    def p(self, text: str) -> None:
        self.blocks.append(("p", text))

    def warn(self, text: str) -> None:
        self.blocks.append(("warn", text))

    def ul(self, items: list[str]) -> None:
        self.blocks.append(("ul", items))

    def table(self, headers: list[str], rows: list[list[str]]) -> None:
        self.blocks.append(("table", (headers, rows)))

    def img(self, path: str, caption: str) -> None:
        self.blocks.append(("img", (path, caption)))

    def pre(self, text: str) -> None:
        self.blocks.append(("pre", text))

    def markdown(self) -> str:
        out: list[str] = []
        for kind, v in self.blocks:
            if kind == "h":
                out.append(f"{'#' * v[0]} {v[1]}")
            elif kind == "p":
                out.append(v)
            elif kind == "warn":
                out.append(f"> **{v}**")
            elif kind == "ul":
                out.append("\n".join(f"- {i}" for i in v))
            elif kind == "table":
                out.append(md_table(*v))
            elif kind == "img":
                out.append(f"![{v[1].split('.')[0]}]({v[0]})\n\n*{v[1]}*")
            elif kind == "pre":
                out.append(f"```\n{v}\n```")
        return "\n\n".join(out) + "\n"

    def html(self, title: str) -> str:
        out = [f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title>", CSS]
        for kind, v in self.blocks:
            if kind == "h":
                out.append(f"<h{v[0]}>{_inline(v[1])}</h{v[0]}>")
            elif kind == "p":
                out.append(f"<p>{_inline(v)}</p>")
            elif kind == "warn":
                out.append(f"<p class='warn'>{_inline(v)}</p>")
            elif kind == "ul":
                out.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in v) + "</ul>")
            elif kind == "table":
                head = "".join(f"<th>{_inline(h)}</th>" for h in v[0])
                body = "".join(
                    "<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in v[1]
                )
                out.append(f"<table><tr>{head}</tr>{body}</table>")
            elif kind == "img":
                out.append(
                    f"<figure><img src='{html.escape(v[0])}' alt=''>"
                    f"<figcaption>{_inline(v[1])}</figcaption></figure>"
                )
            elif kind == "pre":
                out.append(f"<pre>{html.escape(v)}</pre>")
        return "\n".join(out) + "\n"


CSS = """<style>
body{font-family:sans-serif;max-width:75em;margin:1em auto;padding:0 1em;font-size:14px}
table{border-collapse:collapse;font-size:12px;margin:.5em 0}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}th{background:#f3f3f3}
img{max-width:100%}.warn{color:#a00;font-weight:bold}code{background:#f3f3f3}
figure{margin:1em 0}figcaption{font-size:12px;color:#444}
</style>"""


def _inline(text: str) -> str:
    t = html.escape(text)
    t = re.sub(r"`([^`]+)`", r"<code>\1</code>", t)
    return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", t)


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
