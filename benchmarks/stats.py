"""Pure statistics of the benchmarks: summaries, bracketed ratios, percentiles, block sizing.

No I/O, no MindSpore: unit-tested by ``tests/test_benchmarks_smoke.py``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation between order statistics
    (numpy's default method). Raises ``ValueError`` on an empty sequence."""
    if not values:
        raise ValueError("percentile of an empty sequence")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"q must be in [0, 100], got {q}")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    if lo == hi:
        return float(ordered[lo])
    return float(ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo))


def summarize(values: Sequence[float]) -> dict[str, float]:
    """``n``, ``median``, ``q1``, ``q3``, ``iqr``, ``min``, ``max``, ``mean`` of ``values``."""
    if not values:
        raise ValueError("summary of an empty sequence")
    q1, q3 = percentile(values, 25), percentile(values, 75)
    return {
        "n": len(values),
        "median": percentile(values, 50),
        "q1": q1,
        "q3": q3,
        "iqr": q3 - q1,
        "min": float(min(values)),
        "max": float(max(values)),
        "mean": float(sum(values) / len(values)),
    }


def bracket_schedule(variants: Sequence[str], rounds: int, baseline: str = "plain") -> list[str]:
    """The block order of an interleaved run: every variant block sits between two baseline blocks.

    Round ``r`` is ``B V_a B V_b ... B V_z`` with the variants rotated by ``r`` places, so no variant
    always runs right after the same neighbour; one final ``B`` closes the last bracket. Example with
    ``variants=["x", "y"]``, ``rounds=2``: ``B x B y B y B x B``.
    """
    if baseline in variants:
        raise ValueError(f"the baseline {baseline!r} is not a variant")
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    order: list[str] = []
    k = len(variants)
    for r in range(rounds):
        shift = r % k if k else 0
        rotated = list(variants[shift:]) + list(variants[:shift])
        if r % 2 == 1:
            rotated.reverse()
        for name in rotated:
            order.append(baseline)
            order.append(name)
    order.append(baseline)
    return order


def bracketed_ratios(
    order: Sequence[str], seconds: Sequence[float], baseline: str = "plain"
) -> dict[str, list[float]]:
    """Per-variant ratios ``t(variant) / mean(t(baseline before), t(baseline after))``.

    ``order`` and ``seconds`` are parallel (block names and block durations). Every variant block
    must have a baseline block on both sides, as :func:`bracket_schedule` arranges; averaging the
    two neighbours cancels a linear drift of the machine's speed across the three blocks.
    """
    if len(order) != len(seconds):
        raise ValueError("order and seconds differ in length")
    ratios: dict[str, list[float]] = {}
    for i, name in enumerate(order):
        if name == baseline:
            continue
        if i == 0 or i == len(order) - 1 or order[i - 1] != baseline or order[i + 1] != baseline:
            raise ValueError(f"block {i} ({name}) is not bracketed by {baseline!r} blocks")
        ref = (seconds[i - 1] + seconds[i + 1]) / 2.0
        if ref <= 0:
            raise ValueError(f"non-positive baseline time around block {i}")
        ratios.setdefault(name, []).append(seconds[i] / ref)
    return ratios


def steps_per_block(step_seconds: float, target_block_seconds: float, lo: int, hi: int) -> int:
    """How many steps make a block of about ``target_block_seconds``, clamped to ``[lo, hi]``.

    Blocks much shorter than a scheduler time slice (~10 ms) measure the scheduler, not the step.
    """
    if lo < 1 or hi < lo:
        raise ValueError(f"need 1 <= lo <= hi, got lo={lo} hi={hi}")
    if step_seconds <= 0 or not math.isfinite(step_seconds):
        return hi
    return max(lo, min(hi, math.ceil(target_block_seconds / step_seconds)))


def latency_summary(latencies_s: Sequence[float]) -> dict[str, float]:
    """p50 / p90 / p99 / max of latencies in seconds, reported in milliseconds."""
    if not latencies_s:
        raise ValueError("no latencies")
    return {
        "n": len(latencies_s),
        "p50_ms": percentile(latencies_s, 50) * 1e3,
        "p90_ms": percentile(latencies_s, 90) * 1e3,
        "p99_ms": percentile(latencies_s, 99) * 1e3,
        "max_ms": float(max(latencies_s)) * 1e3,
    }
