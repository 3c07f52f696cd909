"""Human sizes ("256MiB", "1GB", 4096) to bytes and back: the one parser for configs and CLI."""

from __future__ import annotations

import bitmath

from bench.common.errors import UserError


def parse_size(value: object, field: str = "size", allow_zero: bool = False) -> int:
    """Bytes from an int or a string with a unit ("4KiB", "1.5GiB", "1GB", "4096B", "4096").

    `field` names the config key or option in the error message.
    """
    if isinstance(value, bool):
        raise UserError(f"{field}: expected a size like '256MiB', got {value!r}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str):
        text = value.strip()
        if text.isdigit():
            n = int(text)
        else:
            try:
                parsed = bitmath.parse_string(text)
            except ValueError:
                raise UserError(
                    f"{field}: cannot read {value!r} as a size; use a number and a unit "
                    "such as 4096B, 256KiB, 64MiB, 1GiB or 1GB"
                ) from None
            if isinstance(parsed, bitmath.Bit):
                # bitmath reads a lowercase b as bits: "1Gb" would silently be 125 MB.
                raise UserError(f"{field}: {value!r} is in bits; give bytes, e.g. 1GB or 1GiB")
            exact = parsed.bytes
            if exact != int(exact):
                raise UserError(f"{field}: {value!r} is not a whole number of bytes")
            n = int(exact)
    else:
        raise UserError(f"{field}: expected a size like '256MiB', got {value!r}")
    if n < 0 or (n == 0 and not allow_zero):
        raise UserError(f"{field}: size must be positive, got {value!r}")
    return n


def format_size(n: int | float) -> str:
    """Binary units, short: 1073741824 -> '1GiB', 4097 -> '4.0KiB'."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            if value == int(value):
                return f"{int(value)}{unit}"
            return f"{value:.1f}{unit}"
        value /= 1024
    raise AssertionError("unreachable")
