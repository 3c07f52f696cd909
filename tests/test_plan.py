"""bench.storage.plan and its use by the striped engines: a state's layout is planned once, a
save of the same layout walks the state and reuses the plan, and anything that changes the
layout (a key, a key's type, a dtype, a shape, a container) makes a new one. Whatever the plan,
the manifest says what the state is, bit for bit (issue 32)."""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import bits
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.storage import manifest, plan
from bench.storage.tree import flatten
from bench.workloads import synthetic_state

SEP = (",", ":")


def sample() -> dict[str, Any]:
    return {
        "model": OrderedDict(
            [("w", torch.arange(12.0).reshape(3, 4)), ("b", torch.ones(3, dtype=torch.bfloat16))]
        ),
        "optim": {
            "state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.zeros(3, 4)}},
            "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": [0], "name": None}],
        },
        (1, "k"): [True, "s", torch.zeros(0)],
    }


def test_walk_lists_the_tensors_as_flatten_does() -> None:
    s = sample()
    w = plan.walk(s)
    assert w is not None
    assert [id(t) for t in w.tensors] == [id(t) for _, t in flatten(s)[1]]
    scalars: list[Any] = []
    flatten(s, scalars)
    assert w.scalars == scalars == [1e-3, 0.9, 0.999, 0, None, True, "s"]


@pytest.mark.parametrize(
    "change",
    [
        lambda s: s["model"].__setitem__("extra", torch.zeros(1)),  # a new key
        lambda s: s["optim"]["state"].__setitem__(True, s["optim"]["state"].pop(0)),  # 0 -> True
        lambda s: s.__setitem__((True, "k"), s.pop((1, "k"))),  # a tuple key's item type
        lambda s: s["model"].__setitem__("w", torch.zeros(3, 4, dtype=torch.float64)),  # dtype
        lambda s: s["model"].__setitem__("w", torch.zeros(4, 3)),  # shape
        lambda s: s.__setitem__("model", dict(s["model"])),  # OrderedDict -> dict
        lambda s: s[(1, "k")].append(1),  # a list's length
        lambda s: s["optim"]["param_groups"][0].__setitem__("lr", 1),  # a scalar's type
    ],
)
def test_a_changed_layout_does_not_fit_the_plan(change: Any) -> None:
    s = sample()
    p, _, _ = plan.SavePlan.build(s, plan.walk(s))
    assert p.fits(plan.walk(sample()))
    change(s)
    assert not p.fits(plan.walk(s))


def test_scalar_values_and_tensor_bytes_do_not_change_the_layout() -> None:
    s = sample()
    p, _, _ = plan.SavePlan.build(s, plan.walk(s))
    s["optim"]["param_groups"][0]["lr"] = 5e-4
    s["model"]["w"] = torch.randn(3, 4)
    w = plan.walk(s)
    assert p.fits(w)
    assert json.loads(p.tree_json(w.scalars)) == flatten(s)[0]


@pytest.mark.parametrize(
    "state",
    [
        {"a": np.zeros(3)},  # flatten refuses it, with the path
        {"a": torch.zeros(3).to_sparse()},
        {"a": {1, 2}},
        {"a": np.float64(1.0)},  # a float subclass: flatten stores it, the walk hands it over
    ],
)
def test_the_walk_hands_what_it_does_not_know_to_flatten(state: dict[str, Any]) -> None:
    assert plan.walk(state) is None


scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    st.text(max_size=8),
)
key = st.one_of(st.integers(-3, 3), st.booleans(), st.text(max_size=4), st.none())
trees = st.recursive(
    st.one_of(scalar, st.builds(lambda n: torch.zeros(n), st.integers(0, 3))),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(key, inner, max_size=4),
    ),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(trees)
def test_the_tree_text_is_what_json_writes(state: Any) -> None:
    """With its scalars apart or whole, the plan writes the tree's text as json.dumps does."""
    w = plan.walk(state)
    assert w is not None
    p, _, scalars = plan.SavePlan.build(state, w)
    assert scalars == w.scalars
    assert p.tree_json(w.scalars) == json.dumps(flatten(state)[0], separators=SEP)


def test_a_string_that_holds_the_mark_is_still_written_right() -> None:
    s = {"a": "\x00ckptbench-scalar\x00", "b": 2.5, "t": torch.zeros(2)}
    p, _, scalars = plan.SavePlan.build(s, plan.walk(s))
    assert p.tree_json(scalars) == json.dumps(flatten(s)[0], separators=SEP)
    assert p.tree_json(["x", 3.5]) == json.dumps(
        flatten({"a": "x", "b": 3.5, "t": torch.zeros(2)})[0], separators=SEP
    )


entries = st.lists(
    st.builds(
        manifest.TensorEntry,
        path=st.text(max_size=6),
        dtype=st.sampled_from(["float32", "bfloat16", "int8"]),
        shape=st.lists(st.integers(0, 5), max_size=3),
        nbytes=st.integers(0, 10**9),
        extents=st.lists(st.lists(st.integers(0, 10**12), min_size=3, max_size=3), max_size=3),
        xxh3=st.one_of(st.none(), st.text("0123456789abcdef", min_size=16, max_size=16)),
        wsum64=st.one_of(st.none(), st.just("00ff-1a")),
    ),
    max_size=6,
)


@settings(max_examples=100, deadline=None)
@given(entries)
def test_the_entry_table_writes_what_the_manifest_wrote(es: list[manifest.TensorEntry]) -> None:
    table = manifest.EntryTable(es)
    want = json.dumps([e.__dict__ for e in es], separators=SEP)
    assert table.render([e.xxh3 for e in es], [e.wsum64 for e in es]) == want


# -- the engines ---------------------------------------------------------------------------------


def counting_flatten(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the plans built (each calls flatten once)."""
    calls: list[int] = []
    real = plan.flatten

    def counted(state: Any, scalars: Any = None) -> Any:
        calls.append(1)
        return real(state, scalars)

    monkeypatch.setattr(plan, "flatten", counted)
    return calls


@pytest.mark.parametrize(
    "engine,opts",
    [
        ("cpu-single", {}),
        ("cpu-single", {"overlap": True, "chunk_bytes": "64KiB"}),
        ("cpu-double", {}),
        ("cpu-single", {"staging_chunks": 2, "chunk_bytes": "64KiB"}),
        ("gds", {"coalesce_bytes": "64KiB", "chunk_bytes": "16KiB"}),
    ],
    ids=["single", "single-overlap", "double", "single-ring", "gds-coalesced"],
)
def test_the_same_layout_is_planned_once_and_saved_right(
    make_engine: Any, scratch: Path, monkeypatch: pytest.MonkeyPatch, engine: str, opts: dict
) -> None:
    dirs = [str(scratch / "a"), str(scratch / "b")]
    for d in dirs:
        Path(d).mkdir()
    eng = make_engine(engine, dirs, device="host-emulated", **opts)
    built = counting_flatten(monkeypatch)
    state = {
        "t": synthetic_state(600 * 4096 + 300, 4096 + 100, seed=1),  # 601 tensors, odd sizes
        "opt": {"lr": 1e-3, "step": torch.tensor(1.0)},
    }
    eng.warm(state)
    assert len(built) == 1
    for k in range(3):
        for t in state["t"].values():
            t.view(torch.int32).add_(1)  # new bytes, same layout
        state["opt"]["lr"] = 1e-3 / (k + 1)  # a scheduler's new learning rate
        eng.save(state, f"c{k}").wait()
        back = eng.load(f"c{k}")
        assert back["opt"]["lr"] == 1e-3 / (k + 1)
        for name, t in state["t"].items():
            assert torch.equal(bits(back["t"][name]), bits(t)), (k, name)
    assert len(built) == 1  # warm() planned it; three saves reused the plan
    state["t"]["extra"] = torch.ones(5)  # a new key: a new plan, and still right
    eng.save(state, "c3").wait()
    assert len(built) == 2
    assert torch.equal(eng.load("c3")["t"]["extra"], torch.ones(5))


def test_release_frees_the_staging_the_plan_pointed_into(make_engine: Any, scratch: Path) -> None:
    """The plan's views into staging go with release(): nothing keeps the old mapping alive."""
    eng = make_engine("cpu-single", [str(scratch)], device="host-emulated")
    state = synthetic_state(64 * 4096, 4096)
    eng.warm(state)
    held = eng.staging._host
    assert held is not None
    eng.release()
    assert held._map.closed
    eng.save(state, "again").wait()  # planned already; staging made and bound again
    back = eng.load("again")
    assert all(torch.equal(bits(back[k]), bits(t)) for k, t in state.items())
