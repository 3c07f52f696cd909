"""bench.common.sizes: human sizes to bytes (the one parser for configs and the CLI) and back."""

from __future__ import annotations

import pytest

from bench.common.errors import UserError
from bench.common.sizes import format_size, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4096", 4096),
        (4096, 4096),
        ("4KiB", 4096),
        ("256MiB", 256 * 2**20),
        ("1GiB", 2**30),
        ("1GB", 10**9),
        ("1kB", 1000),
        ("1.5GiB", 1_610_612_736),
        ("4096B", 4096),
        (" 64MiB ", 64 * 2**20),
    ],
)
def test_parse_size(text: object, expected: int) -> None:
    n = parse_size(text, "chunk_bytes")
    assert n == expected
    assert type(n) is int


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("12 parsecs", "cannot read '12 parsecs' as a size"),
        ("", "cannot read '' as a size"),
        ("-1GiB", "size must be positive, got '-1GiB'"),
        ("0B", "size must be positive, got '0B'"),
        (0, "size must be positive, got 0"),
        (-4096, "size must be positive, got -4096"),
        ("1.5B", "'1.5B' is not a whole number of bytes"),
        ("0.1KiB", "'0.1KiB' is not a whole number of bytes"),
        (True, "expected a size like '256MiB', got True"),
        (None, "expected a size like '256MiB', got None"),
        ([], "expected a size like '256MiB', got []"),
        (4096.0, "expected a size like '256MiB', got 4096.0"),
        # bitmath reads a lowercase b as bits; a size in bits is refused, not divided by 8.
        ("1Gb", "'1Gb' is in bits"),
        ("4kb", "'4kb' is in bits"),
    ],
)
def test_parse_size_errors_name_field_and_value(value: object, says: str) -> None:
    with pytest.raises(UserError) as e:
        parse_size(value, "total_sizes.0")
    msg = str(e.value)
    assert msg.startswith("total_sizes.0: ")
    assert says in msg
    assert "\n" not in msg


def test_parse_size_zero_allowed_when_asked() -> None:
    assert parse_size("0B", "x", allow_zero=True) == 0
    assert parse_size(0, "x", allow_zero=True) == 0
    with pytest.raises(UserError, match="x: size must be positive"):
        parse_size("-1GiB", "x", allow_zero=True)


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0B"),
        (1023, "1023B"),
        (1024, "1KiB"),
        (4097, "4.0KiB"),
        (6144, "6KiB"),
        (256 * 2**20, "256MiB"),
        (2**30, "1GiB"),
        (1_610_612_736, "1.5GiB"),
        (10**9, "953.7MiB"),
        (2**40, "1TiB"),
        (2**50, "1024TiB"),
    ],
)
def test_format_size(n: int, text: str) -> None:
    assert format_size(n) == text


@pytest.mark.parametrize("n", [4096, 2**20, 3 * 2**30, 1_610_612_736])
def test_format_then_parse_round_trips_whole_units(n: int) -> None:
    assert parse_size(format_size(n)) == n
