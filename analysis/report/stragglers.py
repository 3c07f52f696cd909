"""The report's section on stragglers (analysis.stragglers): per engine and case, the spread of
every rank's stall, durable time and restore (p50, p99, max / p50), and the slowest rank and its
host named where it is more than 1.5x the p50."""

from __future__ import annotations

from analysis import stragglers
from analysis.report.doc import Doc
from analysis.runs import Run


def stragglers_section(d: Doc, run: Run) -> None:
    """The answer (which rank, on which host, is last), then the table."""
    ss = stragglers.spreads(run)
    if not ss:
        return
    d.h(2, "Stragglers")
    named = stragglers.stragglers(ss)
    if named:
        d.p("A slow rank sets the aggregate time: " + named[0] + ".")
        if len(named) > 1:
            d.ul(named[1:])
    else:
        d.p(
            f"No rank is a straggler: in every case the slowest rank's median is within "
            f"{stragglers.SLOW:g}x the p50 of all ranks."
        )
    headers = ["engine", "workload", "ranks", "time", "n", "p50 s", "p99 s", "max/p50", "slowest"]
    rows = [
        [
            str(s.case[-1]),
            str(s.case[0]),
            f"{s.case[3]} {s.case[2]}",
            s.time,
            str(s.n),
            f"{s.p50_s:.3f}",
            f"{s.p99_s:.3f}",
            f"{s.max_over_p50:.2f}",
            f"rank {s.slowest_rank} ({s.slowest_host}) {s.slowest_over_p50:.2f}x"
            + (" **straggler**" if s.named else ""),
        ]
        for s in ss
    ]
    d.table(headers, rows)
    d.p(
        "Every rank's own row, every timed repetition: stall (save() returns), durable (save() "
        "until durable) and restore. p50 and p99 over ranks x repetitions; slowest: the rank "
        "whose median is largest, against the p50, named a straggler above "
        f"{stragglers.SLOW:g}x. The aggregate rows take the slowest rank's time."
    )
