"""The report's section on many ranks at once (`ckptbench run --nproc N`): the most ranks'
aggregate bandwidth in a sentence, Figure 7, the measured aggregate bandwidth against one rank's,
and the model beside it (analysis.contention).
"""

from __future__ import annotations

import pandas as pd

from analysis import contention
from analysis.model.profiles import Profile
from analysis.report.captions import CAPTIONS
from analysis.report.doc import Doc
from analysis.runs import Run


def headline(t: pd.DataFrame) -> str:
    """Many ranks at once in one sentence: the most ranks' best aggregate write bandwidth
    against one rank alone on the same targets."""
    many = t[t["ranks_active"] == t["ranks_active"].max()] if not t.empty else t
    if many.empty or int(many["ranks_active"].max()) < 2:
        return "No case ran with 2 or more ranks at once."
    r = many.nlargest(1, "agg_GBps").iloc[0]
    one = t[
        (t["ranks_active"] == 1)
        & (t["engine"] == r["engine"])
        & (t["workload"] == r["workload"])
        & (t["n_targets"] == r["n_targets"])
    ]["agg_GBps"]
    rel = f", {r['agg_GBps'] / one.iloc[0]:.2f}x one rank alone" if len(one) else ""
    n = int(r["n_targets"])
    return (
        f"{int(r['ranks_active'])} ranks at once write {r['agg_GBps']:.2f} GB/s in aggregate "
        f"at best ({r['engine']}, {r['target_map']} targets, {n} SSD{'s' if n != 1 else ''}"
        f"{rel})."
    )


def contention_section(d: Doc, run: Run, this: Profile | None) -> None:
    """The answer, its caveat, Figure 7, the measured aggregate bandwidth against one rank's,
    the table of measured beside the model."""
    t = contention.table(run, this)
    r = run.env.get("ranks", {})
    d.h(2, "Many ranks at once")
    d.p(headline(t))
    if run.shared_device:
        d.warn(
            "All targets share one device: shared and dedicated targets divide the same "
            "device's bandwidth here; the difference between them is the cost of interleaving "
            "the ranks' files, not of more devices."
        )
    d.img("contention.png", CAPTIONS["contention"])
    d.table(*contention.rows(t))
    d.p(
        f"{r.get('world_size', '?')} ranks under torchrun ({r.get('backend', '?')}), each saving "
        f"its own shard ({'the total split evenly' if r.get('shard') == 'even' else 'a whole total each'}) "
        "into its own targets; every repetition starts at a barrier, so the ranks contend for "
        "the SSDs, the PCIe root complexes and the host's memory bandwidth for real. Aggregate "
        "rows: stall and time to durability = the slowest rank's, bytes = all ranks'. "
        "Mappings: " + ", ".join(r.get("mapping", [])) + "; with one rank a case runs once and "
        "stands for every mapping. env.json `ranks.layout` lists every rank's directories."
    )
    said = contention.notes(t)
    if said:
        d.p("**Measured aggregate write bandwidth against one rank alone:**")
        d.ul(said)
    d.p(
        "The model (dotted; `analysis.model.predict_shared`): g ranks of one host each get W(m) "
        "/ g of the host's m SSDs and C / g of its memory-copy bandwidth; per-rank stall = S_r / "
        "min(L, W(m)/g) for gds, S_r / min(b, C/g) for the CPU-centric snapshot. It gives shared "
        "and dedicated targets the same share: their measured difference is what it leaves out."
    )
