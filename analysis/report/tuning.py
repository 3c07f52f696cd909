"""The report's section on a tuned run (`ckptbench run --tuned`): per engine, the knobs applied,
what the tune measured with the engine's defaults and with them, this run's durable GB/s at the
SSD count they were tuned for, and the run's ceiling for the engine's kind of write beside them.
"""

from __future__ import annotations

from typing import Any

from analysis.report.doc import Doc
from analysis.runs import Run

HEADERS = [
    "engine",
    "tuned on SSDs",
    "run SSDs",
    "knobs",
    "default GB/s (tune)",
    "tuned GB/s (tune)",
    "this run GB/s",
    "ceiling GB/s",
]


def present(run: Run) -> bool:
    return bool(run.env.get("tuned"))


def rows(run: Run) -> list[dict[str, Any]]:
    """One per engine applied: its knobs, the tune's default and tuned GB/s, and this run's
    median durable GB/s and ceiling (GB/s over write_efficiency) at the tuned SSD count (or the
    nearest the run has)."""
    out = []
    ok = run.ok
    for engine, a in sorted(run.env["tuned"]["applied"].items()):
        # this run's rows at the SSD count tuned for, else at its nearest below (peers run on
        # one SSD only), else at its smallest
        ran = sorted(set(ok.loc[ok["engine"] == engine, "n_targets"]))
        n = max([c for c in ran if c <= a["ssd_count"]] or ran[:1] or [a["ssd_count"]])
        mine = ok[(ok["engine"] == engine) & (ok["n_targets"] == n)]
        gbps = mine["total_bytes"] / mine["total_s"] / 1e9
        eff = mine["write_efficiency"] if "write_efficiency" in mine else None
        ceiling = (gbps / eff).median() if eff is not None and eff.notna().any() else None
        out.append(
            {
                "engine": engine,
                "ssds": a["ssd_count"],
                "run_ssds": n,
                "knobs": " ".join(f"{k}={v}" for k, v in a["knobs"].items()),
                "default": a.get("default_GBps"),
                "tuned": a.get("tuned_GBps"),
                "run": float(gbps.median()) if len(gbps) else None,
                "ceiling": float(ceiling) if ceiling is not None else None,
            }
        )
    return out


def _g(v: float | None) -> str:
    return "" if v is None else f"{v:.2f}"


def headline(run: Run, table: list[dict[str, Any]]) -> str:
    """What the defaults lose, in one sentence: the engine whose tune gained most."""
    src = run.env["tuned"]["profile"]
    gains = [r for r in table if r["default"] and r["tuned"]]
    if not gains:
        return f"Run with the knobs of {src}; the tune measured no default to compare with."
    r = max(gains, key=lambda r: r["tuned"] / r["default"])
    return (
        f"Run with the knobs of {src}: the most the defaults lost was {r['engine']}'s, "
        f"{r['default']:.2f} GB/s durable against {r['tuned']:.2f} tuned "
        f"({r['tuned'] / r['default']:.2f}x) on {r['ssds']} SSD(s); this run wrote "
        f"{_g(r['run'])} GB/s with it on {r['run_ssds']} SSD(s)"
        + (f", against a ceiling of {r['ceiling']:.2f}." if r["ceiling"] is not None else ".")
    )


def tuning_section(d: Doc, run: Run) -> None:
    table = rows(run)
    d.h(2, "What the defaults lose")
    d.p(headline(run, table))
    d.table(
        HEADERS,
        [
            [
                r["engine"],
                str(r["ssds"]),
                str(r["run_ssds"]),
                r["knobs"],
                _g(r["default"]),
                _g(r["tuned"]),
                _g(r["run"]),
                _g(r["ceiling"]),
            ]
            for r in table
        ],
    )
