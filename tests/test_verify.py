"""bench.storage.verify: the byte-for-byte comparison of a restored state with its source."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import pytest
import torch

from bench.storage import verify
from bench.storage.verify import first_difference, first_tensor_difference, same_tensor


def _state() -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    return {
        "model": OrderedDict(
            [("w", torch.randn(4, 3, generator=g)), ("b", torch.arange(5, dtype=torch.int64))]
        ),
        "optim": {
            "state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.randn(4, 3, generator=g)}},
            "param_groups": [{"lr": 0.1, "betas": (0.9, 0.95), "params": [0], "fused": None}],
        },
        "extra": [torch.empty(0), "name", 7, True, 2.5],
    }


def _clone(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, dict):
        return type(obj)((k, _clone(v)) for k, v in obj.items())
    if isinstance(obj, list | tuple):
        return type(obj)(_clone(v) for v in obj)
    return obj


def test_equal_copy_has_no_difference() -> None:
    a = _state()
    assert first_difference(a, _clone(a)) is None
    assert first_tensor_difference(a, _clone(a)) is None


def test_dtype_change() -> None:
    a, b = _state(), _state()
    b["model"]["w"] = b["model"]["w"].view(torch.int32)  # same bits, another dtype
    assert first_difference(a, b) == "['model']['w']"
    assert first_tensor_difference(a, b) == "model/w"


def test_shape_change() -> None:
    a, b = _state(), _state()
    b["model"]["w"] = b["model"]["w"].reshape(3, 4)  # same bytes, another shape
    assert first_difference(a, b) == "['model']['w']"
    assert first_tensor_difference(a, b) == "model/w"


def test_one_flipped_bit() -> None:
    a, b = _state(), _state()
    exp_avg = b["optim"]["state"][0]["exp_avg"]
    exp_avg.view(torch.int32)[2, 1] ^= 1 << 7
    assert first_difference(a, b) == "['optim']['state'][0]['exp_avg']"
    assert first_tensor_difference(a, b) == "optim/state/0/exp_avg"
    assert not same_tensor(a["optim"]["state"][0]["exp_avg"], exp_avg)


def test_key_order_change() -> None:
    a, b = _state(), _state()
    b["model"] = OrderedDict(reversed(list(b["model"].items())))
    assert first_difference(a, b) == "['model'] (keys differ)"
    assert first_tensor_difference(a, b) is None  # the same tensors under the same paths


def test_dict_vs_ordered_dict() -> None:
    a, b = _state(), _state()
    b["model"] = dict(b["model"])
    assert first_difference(a, b) == "['model'] (type OrderedDict vs dict)"


def test_list_vs_tuple() -> None:
    a, b = _state(), _state()
    b["optim"]["param_groups"][0]["betas"] = [0.9, 0.95]
    assert first_difference(a, b) == "['optim']['param_groups'][0]['betas'] (type tuple vs list)"
    b = _state()
    b["extra"] = tuple(b["extra"])
    assert first_difference(a, b) == "['extra'] (type list vs tuple)"


def test_int_key_vs_str_key() -> None:
    a, b = _state(), _state()
    b["optim"]["state"] = {str(k): v for k, v in b["optim"]["state"].items()}
    assert first_difference(a, b) == "['optim']['state'] (keys differ)"
    # DCP loads int keys back as str: the looser check for baselines ignores that.
    assert first_tensor_difference(a, b) is None


@pytest.mark.parametrize(
    ("x", "y", "says"),
    [
        (7, 8, "['extra'][2]"),
        (7, 7.0, "['extra'][2] (type int vs float)"),
        (1, True, "['extra'][2] (type int vs bool)"),
        (None, 0, "['extra'][2] (type NoneType vs int)"),
        ("a", "b", "['extra'][2]"),
    ],
)
def test_plain_values(x: Any, y: Any, says: str) -> None:
    a, b = _state(), _state()
    a["extra"][2], b["extra"][2] = x, y
    assert first_difference(a, b) == says


def test_length_and_missing_tensors() -> None:
    a, b = _state(), _state()
    b["extra"].append(1)
    assert first_difference(a, b) == "['extra'] (length 5 vs 6)"
    b = _state()
    del b["model"]["b"]
    assert first_difference(a, b) == "['model'] (keys differ)"
    assert first_tensor_difference(a, b) == "tensor set differs at model/b"
    b = _state()
    b["model"]["b"] = 5  # a tensor replaced by a plain value
    assert first_difference(a, b) == "['model']['b']"


def test_nan_equals_nan() -> None:
    a, b = _state(), _state()
    a["extra"][4] = b["extra"][4] = float("nan")
    a["model"]["w"][0, 0] = b["model"]["w"][0, 0] = float("nan")
    assert first_difference(a, b) is None
    assert first_tensor_difference(a, b) is None
    # Only the very same bits are equal: another NaN payload is a difference.
    b["model"]["w"].view(torch.int32)[0, 0] ^= 1
    assert first_difference(a, b) == "['model']['w']"


def test_root_and_special_tensors() -> None:
    t = torch.arange(6.0)
    assert first_difference(t, t.clone()) is None
    assert first_difference(t, t + 1) == "(root)"
    assert first_difference({"a": t}, [t]) == "(root) (type dict vs list)"
    nc = torch.arange(12.0).reshape(3, 4).t()  # non-contiguous
    assert same_tensor(nc, nc.contiguous())
    assert same_tensor(torch.tensor(1.5), torch.tensor(1.5))
    assert not same_tensor(torch.tensor(1.5), torch.tensor([1.5]))
    assert same_tensor(torch.empty(0, 3), torch.empty(0, 3))
    assert not same_tensor(torch.empty(0, 3), torch.empty(3, 0))
    assert not same_tensor(torch.zeros(2, dtype=torch.bool), torch.zeros(2, dtype=torch.uint8))


def test_lengths_either_way_and_values_that_are_equal_but_not_identical() -> None:
    assert first_difference([1, 2, 3], [1, 2]) == "(root) (length 3 vs 2)"
    assert first_difference({"x": (1,)}, {"x": (1, 2)}) == "['x'] (length 1 vs 2)"
    big = 10**20
    assert (
        first_difference({"x": big, "s": "a" * 50}, {"x": int(str(big)), "s": "".join(["a"] * 50)})
        is None
    )
    assert first_difference(1.0, float("nan")) == "(root)"
    assert first_difference(float("nan"), 1.0) == "(root)"
    assert first_difference([float("nan")], [float("nan")]) is None
    # lengths past the small ints Python keeps once: compared by value
    assert first_difference(list(range(300)), list(range(300))) is None


def test_tensor_sets_inside_lists_and_extra_tensors_are_named() -> None:
    a = {"l": [torch.zeros(2), torch.ones(2)]}
    b = {"l": [torch.zeros(2), torch.zeros(2)]}
    assert first_tensor_difference(a, b) == "l/1"
    c = {"l": [torch.zeros(2), torch.ones(2)], "extra": torch.ones(1)}
    assert first_tensor_difference(a, c) == "tensor set differs at extra"
    assert first_tensor_difference(c, a) == "tensor set differs at extra"


def test_fingerprint_is_each_tensors_dtype_shape_and_xxh3_of_its_bytes():
    """Worked out here with xxhash directly: dtype, shape and the xxh3-64 of the bytes in
    memory order, for a contiguous, a non-contiguous, a one-element, a 0-dim and an empty
    tensor, under the state's own paths."""
    import xxhash

    g = torch.Generator().manual_seed(9)
    state = {
        "a": torch.randn(4, 5, generator=g),
        "t": torch.randn(3, 2, generator=g).t(),
        "one": torch.tensor([7], dtype=torch.int64),
        "step": torch.tensor(3.5),
        "empty": torch.empty(0, 3),
    }
    got = verify.fingerprint(state)

    def want(t: torch.Tensor) -> str:
        raw = t.contiguous().numpy().tobytes()
        return f"{t.dtype}{tuple(t.shape)}:{xxhash.xxh3_64_hexdigest(raw)}"

    assert got == [(f"[{k!r}]", want(t)) for k, t in state.items()]


def test_first_fingerprint_difference_names_the_first_tensor_that_differs():
    before = [("['a']", "x:1"), ("['b']", "x:5"), ("['c']", "x:3")]
    assert verify.first_fingerprint_difference(before, list(before)) is None
    lower = [("['a']", "x:1"), ("['b']", "x:4"), ("['c']", "x:0")]
    higher = [("['a']", "x:1"), ("['b']", "x:6"), ("['c']", "x:9")]
    assert verify.first_fingerprint_difference(before, lower) == "['b']"
    assert verify.first_fingerprint_difference(before, higher) == "['b']"
    assert verify.first_fingerprint_difference(lower, before) == "['b']"
    assert verify.first_fingerprint_difference(before, before[:2]) == "(root) (3 tensors vs 2)"
    assert verify.first_fingerprint_difference(before[:1], before) == "(root) (1 tensors vs 3)"
    assert verify.first_fingerprint_difference([], []) is None
    # Equal, not identical: digests made anew, and more tensors than Python caches ints for.
    many = [(f"['t{i}']", f"x:{i}") for i in range(300)]
    again = [(p, "".join(list(d))) for p, d in many]
    assert verify.first_fingerprint_difference(many, again) is None
