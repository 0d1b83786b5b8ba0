"""A record's values as numbers: the one reading of "a number" that every reader of a run log shares
(the alarm rule and ``Recovery``'s rules on the writer's side; the index, the pyramid and the
history's read-back in the server). A bool is not a number; an integer too big for a float is
infinite, as JSON allows such an integer and another writer's log may hold one."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["FAST_TYPES", "finite", "number", "plain_floats"]

FAST_TYPES = frozenset({float, int})  # a column of only these needs no per-value check


def number(v: Any) -> float | None:
    """``v`` as a float when it is a number (an ``int`` or a ``float``, a subclass too, such as
    ``numpy.float64``; not a bool); an integer too big for a float is ``inf`` or ``-inf``."""
    t = type(v)
    if t is float:  # (a decoded JSON value is exactly float, int, bool, str or None)
        return v
    if t is int or (isinstance(v, (int, float)) and t is not bool):
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
