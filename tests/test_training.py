"""The training-loop workload (`ckptbench train`): strict config, a tiny real run through four
engines (rows, flags, timings, the last checkpoint restored bit for bit), the summary's numbers,
the training figure and the report of a training-only and of a combined run directory."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from conftest import assert_answers_first, assert_glossary_complete, scratch_base

from analysis import training as tstats
from analysis.figures.training import _step_x, training_stall
from analysis.model import published
from analysis.report.build import Report, build
from bench import engines
from bench.cli import main
from bench.common.errors import UserError
from bench.config import training
from bench.measure import columns, results
from bench.run.training import loop
from bench.storage import odirect, verify

REPO = Path(__file__).resolve().parent.parent
FIX = REPO / "tests" / "fixtures" / "runs" / "20261202T160516Z-default-b10c3b"
ENGINES = ["none", "cpu-single", "torch-save", "gds"]
TINY_MODEL = {
    "d_model": 32,
    "n_layers": 1,
    "n_heads": 4,
    "d_ff": 64,
    "vocab": 256,
    "seq_len": 8,
    "batch_size": 2,
}
STEPS, EVERY = 12, 4
CKPT_STEPS = [0, 4, 8]


def tiny(root: Path, **changes: Any) -> dict[str, Any]:
    raw = {
        "name": "tiny-train",
        "engines": ENGINES,
        "steps": STEPS,
        "checkpoint_every": EVERY,
        "warmup_steps": 1,
        "model": TINY_MODEL,
        "scratch": str(root / "scratch"),
        "engine_options": {"cpu-single": {"chunk_bytes": "64KiB"}, "gds": {"chunk_bytes": "64KiB"}},
    }
    raw.update(changes)
    return raw


# --- config -----------------------------------------------------------------------------------


def test_shipped_config_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    cfg = training.load("configs/training.yaml")
    assert cfg.engines == ["none", "gds", "cpu-double", "cpu-single", "torch-save", "dcp"]
    assert (cfg.steps, cfg.checkpoint_every, cfg.warmup_checkpoints) == (60, 10, 1)
    assert cfg.checkpoint_steps() == [0, 10, 20, 30, 40, 50]
    assert cfg.lr == pytest.approx(3e-4) and cfg.threads is None
    assert cfg.resolved_targets() == [str(REPO / "scratch" / "training" / "target-0")]
    # a few hundred MB of state: parameters plus AdamW's two moments, fp32
    assert 200e6 < training.state_bytes(cfg.model) < 400e6
    r = training.resolved(cfg)
    assert set(r["engine_options"]) == set(cfg.engines) - {"none"}
    assert r["engine_options"]["cpu-single"]["device"] == "auto"


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"stepz": 3}, "config: stepz: unknown key"),
        ({"model": {"d_modle": 3}}, "config: model.d_modle: unknown key"),
        ({"steps": 0}, "config: steps: Input should be greater than 0, got 0"),
        (
            {"checkpoint_every": "ten"},
            "config: checkpoint_every: Input should be a valid integer, got 'ten'",
        ),
        ({"engines": ["none", "nvme"]}, "config: engines.1: unknown engine 'nvme' (known: none, "),
        ({"engines": ["none", "none"]}, "config: engines: an engine is listed twice"),
        (
            {"model": {"d_model": 100, "n_heads": 8}},
            "config: model.n_heads: 8 does not divide d_model 100",
        ),
        ({"lr": "fast"}, "config: lr: expected a number, got 'fast'"),
        ({"lr": -1.0}, "config: lr: Input should be greater than 0, got -1.0"),
        (
            {"engine_options": {"cpu-single": {"chunk": 1}}},
            "config: engine_options.cpu-single.chunk: unknown key (known: chunk_bytes, "
            "threads_per_target, checksums, device, fallocate, max_write_bw, staging_chunks, "
            "copy_threads, overlap, overlap_writes, read_threads_per_target, restore_direct)",
        ),
        (
            {"engine_options": {"none": {}}},
            "config: engine_options.none: none is not an engine and takes no options",
        ),
        (
            {"n_targets": 3, "targets": ["a"]},
            "config: n_targets: 3 targets asked for, but targets lists only 1",
        ),
        (
            {"device": "tpu"},
            "config: device: Input should be 'auto', 'cuda' or 'host-emulated', got 'tpu'",
        ),
        ({"threads": 0}, "config: threads: Input should be greater than 0, got 0"),
        ({"name": "a/b"}, "config: name: 'a/b' must be a non-empty name without '/'"),
        ({"verify": "yes"}, "config: verify: Input should be a valid boolean, got 'yes'"),
    ],
)
def test_bad_values_fail_with_their_key_path(change: dict, says: str) -> None:
    with pytest.raises(UserError) as e:
        training.from_dict(change)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(says), msg


def test_load_overrides_and_file_errors(scratch: Path) -> None:
    path = scratch / "t.yaml"
    path.write_text("steps: 8\nlr: 3e-4\n")  # YAML reads 3e-4 as a string; it means a number
    cfg = training.load(str(path), ["model.n_layers=2", "engines=[none,torch-save]"])
    assert (cfg.steps, cfg.model.n_layers, cfg.engines, cfg.lr) == (
        8,
        2,
        ["none", "torch-save"],
        3e-4,
    )
    with pytest.raises(UserError, match=r"^config .*t.yaml: model.n_layers: Input should be"):
        training.load(str(path), ["model.n_layers=x"])
    with pytest.raises(UserError, match=r"^config nope.yaml: no such file$"):
        training.load("nope.yaml")
    path.write_text("steps: [1\n")
    with pytest.raises(UserError, match=r"not valid YAML at line 2$"):
        training.load(str(path))


# --- a tiny real run ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_run() -> Iterator[tuple[str, dict[tuple[str, int], Any], dict[str, Any]]]:
    """The tiny run, the state cloned at each timed save, and the resolved config."""
    root = Path(tempfile.mkdtemp(prefix="test_training-", dir=scratch_base()))
    cfg = training.from_dict(tiny(root, keep_last=True))
    t = cfg.resolved_targets()[0]
    Path(t).mkdir(parents=True)
    if odirect.probe(t):
        pytest.skip(f"cpu-single and gds need O_DIRECT: {odirect.probe(t)}")
    clones: dict[tuple[str, int], Any] = {}
    tr = loop.TrainingRun(
        cfg,
        str(root / "results"),
        quiet=True,
        on_save=lambda e, s, state: clones.__setitem__((e, s), loop.clone_state(state)),
    )
    run_dir = tr.run()
    assert tr.failures == []
    yield run_dir, clones, {"targets": cfg.resolved_targets(), "run_id": tr.run_id}
    shutil.rmtree(root, ignore_errors=True)


def test_step_rows(tiny_run: tuple) -> None:
    run_dir, _, _ = tiny_run
    steps = pd.read_csv(Path(run_dir) / loop.STEPS_CSV)
    assert list(steps.columns) == columns.names(results.StepRow)
    assert steps.groupby("engine", sort=False).size().to_dict() == {e: STEPS for e in ENGINES}
    for e, g in steps.groupby("engine"):
        assert g["step"].tolist() == list(range(STEPS))
        want = [s in CKPT_STEPS and e != "none" for s in range(STEPS)]
        assert g["checkpoint"].tolist() == want
        assert g["device"].eq("host-emulated").all() and g["emulated"].all()
        assert (g["step_s"] > 0).all()
        ck = g[g["checkpoint"]]
        assert (ck["stall_s"] > 0).all()
        assert ck["step_s"].to_numpy() == pytest.approx(
            (ck["compute_s"] + ck["save_call_s"]).to_numpy()
        )
        assert (ck["save_call_s"] >= ck["stall_s"]).all()  # the call holds the engine's stall
        assert g.loc[~g["checkpoint"], "stall_s"].isna().all()
        assert (g["t_start_s"].diff().dropna() > 0).all()
    # the same seed trains the same model whatever checkpoints it: losses agree bit for bit
    losses = steps.pivot(index="step", columns="engine", values="loss")
    for e in ENGINES[1:]:
        assert losses[e].tolist() == losses["none"].tolist()
    assert set(steps.loc[steps["engine"] == "gds", "gds_mode"]) == {"emulated"}
    # only the background engine has steps that ran beside its persist
    assert not steps.loc[steps["engine"] != "cpu-single", "during_persist"].any()


def test_checkpoint_rows(tiny_run: tuple) -> None:
    run_dir, _, _ = tiny_run
    steps = pd.read_csv(Path(run_dir) / loop.STEPS_CSV)
    ck = pd.read_csv(Path(run_dir) / loop.CKPTS_CSV)
    assert list(ck.columns) == columns.names(results.CheckpointRow)
    assert ck["error"].isna().all()
    warm = ck[ck["warmup"]]
    assert warm.groupby("engine").size().to_dict() == {"cpu-single": 1, "gds": 1, "torch-save": 1}
    assert (warm["step"] == -1).all()
    timed = ck[~ck["warmup"]]
    for e, g in timed.groupby("engine"):
        assert g["step"].tolist() == CKPT_STEPS
        assert (g["stall_s"] > 0).all() and (g["bytes"] > 0).all()
        assert g["total_s"].to_numpy() == pytest.approx((g["stall_s"] + g["persist_s"]).to_numpy())
        assert g["verified"].iloc[:-1].isna().all()  # only the last one is restored
        assert bool(g["verified"].iloc[-1]) is True
        if e in ("gds", "torch-save"):  # durable inside save(), before it returned
            assert (g["t_durable_s"] <= g["t_return_s"]).all()
        # the step rows' stall_s is the save's
        s = steps[(steps["engine"] == e) & steps["checkpoint"]]
        assert s["stall_s"].to_numpy() == pytest.approx(g["stall_s"].to_numpy())
    sync = timed[timed["engine"].isin(["torch-save", "gds"])]
    assert (sync["persist_s"] == 0).all() and (sync["overlap_steps"] == 0).all()
    assert (sync["total_s"] == sync["stall_s"]).all()
    cs = timed[timed["engine"] == "cpu-single"]
    assert (cs["persist_s"] > 0).all()
    assert set(timed.loc[timed["engine"] == "gds", "gds_mode"]) == {"emulated"}
    # overlap_steps counts the step rows marked as running beside that save's persist
    during = steps[(steps["engine"] == "cpu-single") & steps["during_persist"]]
    assert (
        during.groupby("persist_of_step").size().reindex(CKPT_STEPS, fill_value=0).tolist()
        == cs["overlap_steps"].tolist()
    )
    assert (during["step"] > during["persist_of_step"]).all()


def test_restart_from_the_last_checkpoint(tiny_run: tuple) -> None:
    """Each engine's last checkpoint is restarted from: timed in its parts, and the steps after
    the restart had the uninterrupted run's losses, bit for bit."""
    run_dir, _, _ = tiny_run
    ck = pd.read_csv(Path(run_dir) / loop.CKPTS_CSV)
    timed = ck[~ck["warmup"]]
    assert set(timed["engine"]) == set(ENGINES[1:])
    for _, g in timed.groupby("engine"):
        last, earlier = g.iloc[-1], g.iloc[:-1]
        restart = ["restart_s", "restart_load_s", "restart_first_step_s", "restart_loss_match"]
        assert earlier[restart].isna().all().all()  # only the last checkpoint is restarted from
        assert bool(last["restart_loss_match"]) is True
        assert last["restart_load_s"] > 0 and last["restart_first_step_s"] > 0
        assert last["restart_s"] >= last["restart_load_s"] + last["restart_first_step_s"]
    assert ck.loc[ck["warmup"], "restart_s"].isna().all()


def _trainer(steps: int) -> tuple[Any, list[float]]:
    from bench.run.training.model import Trainer

    cfg = training.from_dict(tiny(Path("unused")))
    tr = Trainer(cfg, torch.device("cpu"))
    return tr, [tr.step() for _ in range(steps)]


def test_a_restart_continues_the_run_bit_for_bit_even_from_string_keys() -> None:
    """A fresh trainer given a saved state and the token stream's position trains on with the
    uninterrupted run's losses; the optimizer's parameter indices as dcp gives them back
    (strings) are restored too. Planted: without the optimizer's state the second step differs."""
    from bench.run.training.model import Trainer

    tr, _ = _trainer(3)
    saved, data = loop.clone_state(tr.state()), tr.gen.get_state()
    after = [tr.step() for _ in range(2)]
    loose = loop.clone_state(saved)
    loose["optim"]["state"] = {str(k): v for k, v in loose["optim"]["state"].items()}
    for state in (saved, loose):
        fresh = Trainer(tr.cfg, torch.device("cpu"))
        fresh.gen.set_state(data)
        fresh.load_state(state)
        assert [fresh.step(), fresh.step()] == after
    fresh = Trainer(tr.cfg, torch.device("cpu"))
    fresh.gen.set_state(data)
    fresh.model.load_state_dict(saved["model"])  # the model only: AdamW starts afresh
    first, second = fresh.step(), fresh.step()
    assert first == after[0] and second != after[1]


def test_last_checkpoint_loads_back_bit_exact(tiny_run: tuple) -> None:
    run_dir, clones, info = tiny_run
    ck = pd.read_csv(Path(run_dir) / loop.CKPTS_CSV)
    assert sorted(clones) == sorted((e, s) for e in ENGINES[1:] for s in CKPT_STEPS)
    for e in ENGINES[1:]:
        name = f"ckptbench-{info['run_id']}-train-{e}-step{CKPT_STEPS[-1]}"
        assert name in set(ck["name"])
        eng = engines.create(e, info["targets"])
        try:
            loaded = eng.load(name)
            expected = clones[(e, CKPT_STEPS[-1])]
            assert verify.first_difference(expected, loaded) is None
            # the state kept training after the save: an earlier clone differs
            assert verify.first_difference(clones[(e, 0)], loaded) is not None
            eng.delete(name)
        finally:
            eng.close()
    # the others were deleted once their successor was durable
    left = [p.name for p in Path(info["targets"][0]).iterdir()]
    assert left == []


def test_summary_numbers(tiny_run: tuple) -> None:
    run_dir, _, _ = tiny_run
    tr = tstats.load(run_dir)
    assert tr.engines == ["none", "gds", "cpu-single", "torch-save"]
    assert tr.emulated and tr.label("gds") == "gds [emulated]"
    table = tstats.summary(tr).set_index("engine")
    steps = tr.steps
    base = steps[steps["engine"] == "none"]["step_s"]
    for e in ENGINES[1:]:
        g = steps[steps["engine"] == e]
        want = (g["step_s"].sum() - base.sum()) / len(CKPT_STEPS)
        assert table.loc[e, "inflation_vs_none_s"] == pytest.approx(want)
        quiet = g[~g["checkpoint"] & ~g["during_persist"]]["step_s"].median()
        # NaN when every step saved or ran beside a persist (a tiny model's steps are short)
        assert table.loc[e, "quiet_step_s"] == pytest.approx(quiet, nan_ok=True)
        hit = g[g["checkpoint"] | g["during_persist"]]["step_s"]
        assert table.loc[e, "inflation_s"] == pytest.approx((hit - quiet).sum() / 3, nan_ok=True)
        assert table.loc[e, "inflation_s"] == pytest.approx(
            table.loc[e, "save_step_s"] + table.loc[e, "contention_s"], nan_ok=True
        )
        assert table.loc[e, "checkpoints"] == 3
        stalls = tr.timed_ckpts.loc[tr.timed_ckpts["engine"] == e, "stall_s"]
        assert table.loc[e, "stall_s"] == pytest.approx(stalls.median())
    cs = steps[(steps["engine"] == "cpu-single") & steps["during_persist"] & ~steps["checkpoint"]]
    assert table.loc["cpu-single", "step_persist_s"] == pytest.approx(cs["step_s"].median())
    quiet = table.loc["cpu-single", "quiet_step_s"]
    want = (cs["step_s"] - quiet).sum() / 3
    assert table.loc["cpu-single", "contention_s"] == pytest.approx(want, nan_ok=True)
    assert table.loc["torch-save", "contention_s"] == 0
    assert np.isnan(table.loc["none", "inflation_s"])
    headers, rows = tstats.summary_rows(tstats.summary(tr))
    assert headers[:6] == [
        "engine",
        "ckpts",
        "step s (median)",
        "step s during persist",
        "inflation s / ckpt vs none",
        "vs quiet steps",
    ]
    assert [r[0] for r in rows] == [
        "none [emulated]",
        "gds [emulated]",
        "cpu-single [emulated]",
        "torch-save [emulated]",
    ]


def test_drift_notes() -> None:
    table = pd.DataFrame(
        {
            "engine": ["none", "gds", "dcp"],
            "label": ["none", "gds", "dcp"],
            "quiet_step_s": [0.25, 0.20, 0.26],
            "steps": [60, 60, 60],
            "checkpoints": [0, 6, 6],
        }
    )
    assert tstats.drift_notes(table) == [
        "the quiet steps of gds ran 20% faster than none's (0.2 s vs 0.25 s): its inflation "
        "against none carries about -0.5 s per checkpoint of that drift"
    ]


def test_training_figure(tiny_run: tuple) -> None:
    run_dir, _, _ = tiny_run
    tr = tstats.load(run_dir)
    fig = training_stall(tr)
    axes = fig.get_axes()
    assert len(axes) == len(ENGINES) + 1  # a panel per engine and the bar chart
    panels, bars = axes[:-1], axes[-1]
    assert [ax.get_title(loc="left") for ax in panels] == [tr.label(e) for e in tr.engines]
    for ax, e in zip(panels, tr.engines, strict=True):
        lines = ax.get_lines()
        # the step line, the checkpoint markers (not for none), the none median
        assert len(lines) == (2 if e == "none" else 3)
        assert len(lines[0].get_xdata()) == STEPS
        if e != "none":
            assert list(lines[1].get_xdata()) == CKPT_STEPS
        # The persist windows, as the data has them, each shaded over exactly the steps it
        # overlaps: none for the engines whose stall is the durable write (the window closes
        # before the next step starts), cpu-single's wherever its persisting ran into later
        # steps (how far it does is the machine's speed: no count is asserted).
        ck = tr.timed_ckpts[tr.timed_ckpts["engine"] == e]
        t, x = _step_x(tr.steps[tr.steps["engine"] == e])
        windows = (
            np.interp([r, d], t, x)
            for r, d in zip(ck["t_return_s"], ck["t_durable_s"], strict=True)
        )
        want = [(float(a), float(b)) for a, b in windows if b - a > 1e-6]
        if e in ("gds", "torch-save"):
            assert want == [], e
        spans = [(p.get_x(), p.get_x() + p.get_width()) for p in ax.patches]
        assert len(spans) == len(want), e
        for got, w in zip(spans, want, strict=True):
            assert got == pytest.approx(w), e
    assert panels[0].get_ylabel() == "step time (s)"
    assert panels[-1].get_xlabel() == "training step"
    assert bars.get_ylabel() == "seconds per checkpoint"
    assert [t.get_text() for t in bars.get_xticklabels()] == [
        "gds\n[emulated]",
        "cpu-single\n[emulated]",
        "torch-save\n[emulated]",
    ]
    # vs none, the save() step, contention stacked on it, stall_s: a bar per engine in each
    assert [len(c) for c in bars.containers] == [3, 3, 3, 3]
    assert "HOST-EMULATED" in fig.get_supxlabel()


@pytest.fixture(scope="module")
def tiny_report(tiny_run: tuple, tmp_path_factory: pytest.TempPathFactory) -> Report:
    """The tiny run's report, built once for the tests that read it."""
    run_dir, _, _ = tiny_run
    return build(run_dir, str(tmp_path_factory.mktemp("tiny-report")))


def test_report_of_a_training_only_run(tiny_report: Report) -> None:
    rep = tiny_report
    names = sorted(Path(p).name for p in rep.paths)
    assert names == [
        "report.html",
        "report.md",
        "training_stall.pdf",
        "training_stall.png",
        "training_summary.csv",
    ]
    md = (Path(rep.outdir) / "report.md").read_text()
    assert "## Stall in a real training loop" in md
    assert "> **HOST-EMULATED run (no GPU)" in md
    assert "![Figure 6](training_stall.png)" in md
    assert "| gds [emulated] | 3 |" in md
    # the restart table: one row per engine, its parts and the losses' match
    head = "| engine | restart s | of it load s | load_state_dict s | first step s | losses match |"
    assert head in md
    table = md.split(head)[1].split("\n\n")[0]
    rows = [r for r in table.splitlines() if r.startswith("| ") and "---" not in r]
    names = sorted(r.split(" | ")[0][2:].split(" [")[0] for r in rows)
    assert names == ["cpu-single", "gds", "torch-save"]
    assert all(r.endswith("| yes |") for r in rows)
    assert "Is GDS worth it" not in md  # no harness rows: only the training section
    assert_answers_first(md)
    assert_glossary_complete(md)
    # every report carries the model against published measurements, in a line
    assert "## The model against published measurements" in md
    assert published.summary(published.validate()) in md
    assert rep.summary_text.splitlines()[0].startswith("engine")


def test_report_of_a_training_run_says_whose_clock_timed_its_stalls(
    tiny_run: tuple, tiny_report: Report, scratch: Path
) -> None:
    """A training run whose env.json lacks `stall_clock: harness` (made before ckptbench 0.2.0)
    gets one line at the top of its report and in its notes; with the key, none. The tiny run
    says harness: its own report is the one with the key."""
    run_dir, _, _ = tiny_run
    assert json.loads((Path(run_dir) / "env.json").read_text())["stall_clock"] == "harness"
    said = {}
    for clock in (None, "harness"):
        if clock == "harness":
            rep = tiny_report
        else:
            copy = scratch / f"train-{clock}"
            shutil.copytree(run_dir, copy)
            env = json.loads((copy / "env.json").read_text())
            env.pop("stall_clock", None)
            (copy / "env.json").write_text(json.dumps(env))
            rep = build(str(copy), str(copy / "rep"))
        md = (Path(rep.outdir) / "report.md").read_text()
        said[clock] = (
            md.count("made before ckptbench 0.2.0"),
            [n for n in rep.notes if "made before ckptbench 0.2.0" in n],
        )
    count, notes = said[None]
    assert count == 1 and len(notes) == 1
    assert notes[0].startswith("This run was made before ckptbench 0.2.0 (env.json has no ")
    assert said["harness"] == (0, [])


def test_report_of_a_harness_run_with_training(tiny_run: tuple, scratch: Path) -> None:
    run_dir, _, _ = tiny_run
    both = scratch / "both"
    shutil.copytree(FIX, both)
    for f in (loop.STEPS_CSV, loop.CKPTS_CSV):
        shutil.copy(Path(run_dir) / f, both / f)
    rep = build(str(both), str(scratch / "rep"))
    assert len(rep.paths) == 23  # the harness report's 21 and Figure 6
    md = (scratch / "rep" / "report.md").read_text()
    assert "## Is GDS worth it here?" in md and "## Stall in a real training loop" in md
    assert "Figure 6 (below) shows checkpoint phases against the steps" in md
    assert_answers_first(md)
    assert_glossary_complete(md)


def test_cli_train(scratch: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = scratch / "t.yaml"
    path.write_text(yaml.safe_dump(tiny(scratch, engines=["none", "torch-save"], steps=4)))
    out = scratch / "results"
    assert main(["train", str(path), "-o", str(out), "-q", "--set", "checkpoint_every=2"]) == 0
    text = capsys.readouterr().out
    assert "4 steps per engine, a checkpoint every 2" in text
    assert "torch-save [emulated]  2 " in text
    assert "inflation s / ckpt" in text
    (run,) = out.iterdir()
    assert {p.name for p in run.iterdir()} == {"env.json", loop.STEPS_CSV, loop.CKPTS_CSV}
    assert main(["train", str(path), "--set", "stepz=1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ckptbench: error: config {path}: stepz: unknown key (known: name, ")
    assert err.count("\n") == 1


@pytest.mark.parametrize("engine", ["cpu-single", "torch-save", "dcp"])
def test_a_restart_loads_into_the_fresh_trainers_own_tensors(make_engine, targets, engine) -> None:
    """`restore: restart`: AdamW's state made in a fresh trainer (untimed), the checkpoint
    loaded into its model's and optimizer's own tensors (no load_state_dict), and the run goes
    on bit for bit. Planted: a load that reads nothing leaves the fresh trainer's values, and
    the first step differs."""
    from bench.run.training.model import Trainer

    tr, _ = _trainer(3)
    eng = make_engine(engine, targets(1))
    eng.save(tr.state(), "ckpt").wait()
    data = tr.gen.get_state()
    after = [tr.step() for _ in range(2)]
    for no_op in (False, True):
        fresh = Trainer(tr.cfg, torch.device("cpu"))
        fresh.gen.set_state(data)
        fresh.init_optimizer_state()
        into = fresh.state()
        ptrs = [p.data_ptr() for p in fresh.model.parameters()]
        if not no_op:
            eng.load("ckpt", checksums=False, into=into)
        assert [p.data_ptr() for p in fresh.model.parameters()] == ptrs
        got = [fresh.step(), fresh.step()]
        assert (got == after) is not no_op, (engine, no_op)
