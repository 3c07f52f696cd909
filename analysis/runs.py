"""A run as analysis sees it: results.csv rows (normalised, with derived GB/s) and env.json.

Reads results files only, through `bench.measure.results`. Rows kept for statistics are the timed
repetitions that succeeded: warm-ups, rows with an error and rows that did not verify are set
aside (and counted). Bandwidths are derived here, in GB/s (1e9 B/s), never stored.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pandas as pd

from bench.common.errors import UserError
from bench.common.traits import Traits
from bench.measure import results
from bench.measure.clock import STALL_CLOCK
from bench.measure.efficiency import best_ceilings as ceilings  # noqa: F401 (the run's)
from bench.measure.efficiency import (
    efficiency_by,
    engine_traits,
    judges,
    restore_efficiency_by,
)

# The order engines are listed in (the paper's paths, then the baselines); others follow.
ENGINE_ORDER = ["gds", "cpu-single", "cpu-double", "torch-save", "dcp"]
GB = 1e9


# env.json `stall_clock` of a run whose stalls the harness timed around save() (ckptbench 0.2.0
# and later, bench.measure.clock). Earlier runs lack the key: each engine stopped its own stall
# clock, which could miss work save() still did after it.
HARNESS_CLOCK = STALL_CLOCK


def harness_clock(env: dict[str, Any]) -> bool:
    """True when the run's stalls were timed by the harness (env.json `stall_clock: harness`)."""
    return env.get("stall_clock") == HARNESS_CLOCK


def clock_note(env: dict[str, Any], who: str = "This run", plural: bool = False) -> str | None:
    """The one line that marks a run timed by the engines' own clocks; None for a newer run.
    `who` names the run (or, `plural`, the runs) it is said of."""
    if harness_clock(env):
        return None
    said = env.get("stall_clock")
    why = "env.json has no `stall_clock: harness`" if said is None else f"stall_clock {said!r}"
    were, its = ("were", "their") if plural else ("was", "its")
    return (
        f"{who} {were} made before ckptbench 0.2.0 ({why}): each engine stopped its own stall "
        "clock, which could miss work save() still did after it (up to 38-89 % of the stall on "
        f"states of 20,000 x 4 KiB tensors), so {its} stall_s may read short against newer runs."
    )


def add_efficiencies(df: pd.DataFrame, env: dict[str, Any]) -> pd.DataFrame:
    """`write_eff`, `snapshot_eff` and `restore_eff` of every row (bench.measure.efficiency, the
    one definition), against the run's best ceilings (across hosts: a rank's row against its
    host's, an aggregate row against every host's); NaN where the run has none."""
    w, s, rs = [], [], []
    for r in df.to_dict("records"):
        t = engine_traits(env, r["engine"])
        row = cast(dict[str, Any], r)  # a results row, its columns str (Hashable to pandas-stubs)
        node = row.get("node_rank")
        c = judges(env, int(node) if node == node and node is not None else 0)
        a, b = efficiency_by(row, c, t) if (c and t) else (None, None)
        if row.get("restore_s") != row.get("restore_s"):  # NaN: no restore
            row = {**row, "restore_s": None}
        x = restore_efficiency_by(row, c, t) if (c and t) else None
        w.append(np.nan if a is None else a)
        s.append(np.nan if b is None else b)
        rs.append(np.nan if x is None else x)
    return df.assign(write_eff=w, snapshot_eff=s, restore_eff=rs)


@dataclass(frozen=True)
class Run:
    """One results/<run-id>/ folder: every row, the rows for statistics, and the environment."""

    path: str
    run_id: str
    rows: pd.DataFrame
    env: dict[str, Any]
    ok: pd.DataFrame = field(repr=False)
    excluded: dict[str, int] = field(default_factory=dict)
    # Multi-rank runs (bench.run.distributed): the timed, successful rows of cases where more than
    # one rank checkpointed at once, per rank and aggregate; `ok` keeps the one-rank cases.
    ranked: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False)

    @property
    def emulated(self) -> bool:
        return bool(self.rows["emulated"].any()) or bool(self.env.get("device", {}).get("emulated"))

    @property
    def harness_clock(self) -> bool:
        """Stalls timed by the harness around save() (ckptbench 0.2.0 on), not by the engines."""
        return harness_clock(self.env)

    @property
    def shared_device(self) -> bool:
        """All targets on one block device: SSD-count scaling on this run is not real scaling."""
        return bool(self.env.get("storage", {}).get("shared_device"))

    @property
    def unfinished(self) -> tuple[int, int] | None:
        """(saves recorded, saves planned) of a sweep that never reached its end (interrupted,
        killed, stopped by a failed case); None when it finished or its env.json predates the
        record."""
        sweep = self.env.get("sweep")
        if not isinstance(sweep, dict) or sweep.get("finished", True):
            return None
        done = self.rows[["case_id", "warmup", "rep"]].drop_duplicates()
        return len(done), int(sweep.get("planned_saves") or 0)

    @property
    def engines(self) -> list[str]:
        return order_engines(self.ok["engine"].unique())

    def traits(self, engine: str) -> Traits | None:
        return engine_traits(self.env, engine)

    def first_with(self, **want: Any) -> str | None:
        """The first engine of the run (house order) whose traits have these values."""
        for e in self.engines:
            t = self.traits(e)
            if t is not None and all(getattr(t, k) == v for k, v in want.items()):
                return e
        return None

    def gds_modes(self) -> dict[str, str]:
        """Engine -> its mode(s) on this run ('emulated', 'compat', 'gds', 'none')."""
        return {
            str(e): "/".join(sorted(set(g["gds_mode"])))
            for e, g in self.rows.groupby("engine", sort=False)
        }


def order_engines(names: Any) -> list[str]:
    """Engines in the house order (gds, cpu-single, cpu-double, torch-save, dcp), others after."""
    names = list(dict.fromkeys(names))
    return [e for e in ENGINE_ORDER if e in names] + sorted(
        n for n in names if n not in ENGINE_ORDER
    )


def mode_tag(row: Any) -> str:
    """What must be said next to a number: 'compat', 'emulated' or '' (a real GPU row)."""
    if row["gds_mode"] == "compat":
        return "compat"
    if row["gds_mode"] == "emulated" or bool(row["emulated"]):
        return "emulated"
    return ""


def label(engine: str, tag: str) -> str:
    """Legend and table label: 'gds [emulated]', 'gds [compat]', 'cpu-single'."""
    return f"{engine} [{tag}]" if tag else engine


def normalise(df: pd.DataFrame) -> pd.DataFrame:
    """Mode tags, derived bandwidths (GB/s) and costs per tensor (us) of rows read with their
    types (bench.measure.results.read_rows: older runs' missing columns at their defaults)."""
    df = df.copy()
    df["tag"] = [mode_tag(r) for _, r in df.iterrows()]
    df["label"] = [label(e, t) for e, t in zip(df["engine"], df["tag"], strict=True)]
    s = df["total_bytes"].astype(float)
    df["write_GBps"] = s / df["total_s"] / GB
    df["restore_GBps"] = s / df["restore_s"] / GB
    df["snapshot_GBps"] = s / df["stall_s"] / GB
    df["persist_GBps"] = s / df["persist_s"].where(df["persist_s"] > 0) / GB
    # What a save costs per tensor beside what it costs per byte (us = microseconds): the stall
    # and the persist after it over the tensors of the state.
    n = df["n_tensors"].astype(float).where(df["n_tensors"] > 0)
    df["stall_us_per_tensor"] = df["stall_s"] / n * 1e6
    df["persist_us_per_tensor"] = df["persist_s"] / n * 1e6
    df["pinned_x"] = df["pinned_bytes"] / s
    df["page_cache_x"] = df["page_cache_peak_bytes"] / s
    return deny(df)


# What a row's time to durability feeds (left out where the device denied it), and what its
# restore time feeds (left out where the restore read from memory).
DURABLE_COLUMNS = ("total_s", "persist_s", "write_GBps", "persist_GBps", "persist_us_per_tensor")
RESTORE_COLUMNS = ("restore_s", "restore_GBps")


def witness_said(df: pd.DataFrame, column: str, start: str) -> pd.Series:
    """Rows whose witness column (durable_witness, restore_witness) begins with `start`."""
    if column not in df:
        return pd.Series(False, index=df.index)
    return df[column].fillna("").astype(str).str.startswith(start)


def deny(df: pd.DataFrame) -> pd.DataFrame:
    """Rows whose save the block device denied durable (`durable_witness` no: the bytes or a
    flush never reached it) keep their stall, but their total_s is no time to durability: it
    and what derives from it are left out (NaN), and `denied` marks them. A restore the device
    did not read (`restore_witness` no) loses its restore time the same way (`restore_denied`).
    Rows written before the witness existed have neither column said and keep everything."""
    df = df.copy()
    df["denied"] = witness_said(df, "durable_witness", "no")
    df["restore_denied"] = witness_said(df, "restore_witness", "no")
    for flag, cols in (("denied", DURABLE_COLUMNS), ("restore_denied", RESTORE_COLUMNS)):
        for c in cols:
            if c in df:
                df[c] = df[c].where(~df[flag])
    return df


def denied_counts(df: pd.DataFrame, flag: str = "denied") -> dict[str, int]:
    """Timed rows per engine marked `flag` (denied, restore_denied), engines without any left out."""
    if flag not in df:
        return {}
    timed = df[~df["warmup"].astype(bool) & df[flag]]
    return {str(e): int(n) for e, n in timed.groupby("engine").size().items() if n}


def witness_lines(df: pd.DataFrame) -> list[str]:
    """What the block device said of the run's timed saves and restores, in a line each where
    it said no (per engine), and once where it could not witness."""
    out = []
    for flag, what in (
        (
            "denied",
            "save(s) the block device denied durable (its counters saw fewer bytes or "
            "no cache flush): their total_s is no time to durability and is left out (stall kept)",
        ),
        (
            "restore_denied",
            "restore(s) that read less than their files from the device: their "
            "restore time is a memory read and is left out",
        ),
    ):
        n = denied_counts(df, flag)
        if n:
            out.append(f"{sum(n.values())} {what}: " + ", ".join(f"{e} {k}" for e, k in n.items()))
    # timed rows, as the denials above count them
    un = witness_said(df, "durable_witness", "unavailable") & ~df["warmup"].astype(bool)
    if un.any():
        why = str(df.loc[un, "durable_witness"].iloc[0]).removeprefix("unavailable: ")
        out.append(f"durability not witnessed by the device on {int(un.sum())} timed row(s): {why}")
    return out


def read_env(run_dir: str) -> dict[str, Any]:
    """RUN_DIR/env.json ({} if the run has none); an unreadable one is a UserError."""
    env_path = os.path.join(run_dir, "env.json")
    if not os.path.isfile(env_path):
        return {}
    try:
        with open(env_path) as f:
            return json.load(f)
    except (ValueError, OSError) as e:
        raise UserError(f"{env_path}: cannot read ({e})") from None


def load(path: str) -> Run:
    """Read RUN_DIR (results.csv + env.json); a missing or malformed run is a UserError."""
    if not os.path.isdir(path):
        raise UserError(f"{path}: no such run directory (give results/<run-id>)")
    csv_path = os.path.join(path, "results.csv")
    if not os.path.isfile(csv_path):
        raise UserError(f"{path}: no results.csv here; is this a results/<run-id> folder?")
    try:
        raw = results.read_rows(path)  # typed by results.Row; refused without its first columns
    except results.MissingColumns as e:
        raise UserError(f"{csv_path}: {e}") from None
    except (ValueError, OSError) as e:
        raise UserError(f"{csv_path}: cannot read ({e})") from None
    env = read_env(path)
    rows = normalise(raw) if len(raw) else raw
    if rows.empty:
        raise UserError(f"{csv_path}: no rows")
    warm = rows["warmup"]
    failed = ~warm & (rows["error"] != "")
    # A run with `verify: false` never compared its restores: its rows are not unverified.
    checked = bool(env.get("config", {}).get("verify", True))
    unverified = ~warm & ~failed & ~rows["verified"] & checked
    good = rows[~warm & ~failed & ~unverified]
    multi = good["aggregate"] | (good["ranks_active"] > 1)
    ok, ranked = good[~multi].copy(), good[multi].copy()
    if ok.empty and not ranked.empty:
        # No case with one rank alone: the aggregate rows (one checkpoint of all ranks' shards)
        # of the fewest ranks, under the first mapping, stand in for the one-rank figures.
        agg = ranked[ranked["aggregate"]]
        agg = agg[agg["ranks_active"] == agg["ranks_active"].min()]
        ok = agg[agg["target_map"] == agg["target_map"].iloc[0]].copy() if len(agg) else agg
    run_id = str(rows["run_id"].iloc[0]) if "run_id" in rows else os.path.basename(path)
    excluded = {
        "warm-up": int(warm.sum()),
        **({} if checked else {"restores not compared (verify: false)": 0}),
        "error": int(failed.sum()),
        "not verified": int(unverified.sum()),
    }
    if ok.empty:
        raise UserError(f"{csv_path}: no successful timed repetitions to analyse")
    ok = add_efficiencies(ok, env)
    return Run(os.path.abspath(path), run_id, rows, env, ok, excluded, ranked)
