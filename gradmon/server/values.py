"""JSON values as numbers: the one reading of "a number" that the index, the pyramid and the
history's read-back share (a bool is not a number; an integer too big for a float is infinite)."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["FAST_TYPES", "finite", "number", "plain_floats"]

FAST_TYPES = frozenset({float, int})  # a column of only these needs no per-value check


def number(v: Any) -> float | None:
    """``v`` as a float when it is a JSON number (not a bool); a huge integer is ``inf``."""
    t = type(v)
    if t is float:
        return v
    if t is int:
        try:
            return float(v)
        except OverflowError:
            return math.inf if v > 0 else -math.inf
    return None


def finite(v: Any) -> float | None:
    x = number(v)
    return x if x is not None and math.isfinite(x) else None


def plain_floats(column: list[Any], finite_only: bool) -> list[float] | None:
    """The column as floats when every value is a number (and finite, if asked), else ``None``."""
    if not set(map(type, column)) <= FAST_TYPES:
        return None
    try:
        values = list(map(float, column))
    except OverflowError:
        return None
    if finite_only and not math.isfinite(sum(values)):
        return None
    return values
