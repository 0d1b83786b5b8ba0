"""Interleaved A/B timing of training-step cells in one process.

Each candidate cell runs in blocks of ``steps`` calls; every candidate block is bracketed by two
baseline blocks (see :func:`benchmarks.stats.bracket_schedule`). A block ends with ``.asnumpy()``
of its last output so the time covers the device work, not just the dispatch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from benchmarks.stats import bracket_schedule, bracketed_ratios, steps_per_block, summarize


def sync(output: Any) -> None:
    """Wait for a step's device work: read its first tensor back to the host."""
    first = output[0] if isinstance(output, (tuple, list)) else output
    first.asnumpy()


CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


def time_block(cell: Callable[..., Any], inputs: Sequence[Any], steps: int,
               clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds for ``steps`` calls of ``cell(*inputs)`` plus the final sync, by ``clock``.

    ``time.process_time`` (the ``cpu`` clock) counts this process's CPU time only: in a process pinned
    to one core it leaves out the time other processes hold that core (a shared machine's main noise).
    """
    t0 = clock()
    out = None
    for _ in range(steps):
        out = cell(*inputs)
    sync(out)
    return clock() - t0


def warm_up(cell: Callable[..., Any], inputs: Sequence[Any], steps: int) -> dict[str, float]:
    """Compile (first call) and run ``steps`` more calls; return first-call and mean step seconds."""
    t0 = time.perf_counter()
    sync(cell(*inputs))
    first = time.perf_counter() - t0
    per_step = time_block(cell, inputs, steps) / steps if steps > 0 else first
    return {"first_call_s": first, "warm_step_s": per_step}


TIMING_KEYS = ("rounds", "target_block_s", "min_steps", "max_steps", "warmup_steps")


def timing_options(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The :func:`run_interleaved` keyword arguments held in a section's ``settings``."""
    options = {key: settings[key] for key in TIMING_KEYS}
    if "clock" in settings:
        options["clock"] = settings["clock"]
    return options


def run_interleaved(
    cells: Mapping[str, Callable[..., Any]],
    inputs: Sequence[Any],
    *,
    baseline: str,
    rounds: int,
    target_block_s: float,
    min_steps: int,
    max_steps: int,
    warmup_steps: int,
    log: Callable[[str], None] = lambda _msg: None,
    clock: str = "wall",
) -> dict[str, Any]:
    """Time every cell against ``cells[baseline]`` with bracketed interleaving.

    Returns ``{"steps_per_block", "rounds", "compile", "variants": {name: {...}}}`` where each
    variant has ``ratio`` (summary of per-bracket ratios), ``ratios`` (raw), ``ms_per_step``
    (summary over its blocks); the baseline has ``ms_per_step`` only. ``clock``: ``"wall"`` (default)
    or ``"cpu"`` (see :func:`time_block`).
    """
    if baseline not in cells:
        raise ValueError(f"baseline {baseline!r} missing from cells")
    compile_info: dict[str, dict[str, float]] = {}
    for name, cell in cells.items():
        compile_info[name] = warm_up(cell, inputs, warmup_steps)
        log(
            f"  warm {name}: first call {compile_info[name]['first_call_s']:.2f}s, "
            f"{compile_info[name]['warm_step_s'] * 1e3:.2f} ms/step"
        )
    # Re-measure the baseline after everything compiled (the machine is warm now), by the timing clock.
    base_steps = max(1, warmup_steps)
    base_step = time_block(cells[baseline], inputs, base_steps, CLOCKS[clock]) / base_steps
    steps = steps_per_block(base_step, target_block_s, min_steps, max_steps)
    variants = [n for n in cells if n != baseline]
    order = bracket_schedule(variants, rounds, baseline)
    log(f"  {len(order)} blocks of {steps} steps (baseline {base_step * 1e3:.2f} ms/step)")
    seconds = [time_block(cells[name], inputs, steps, CLOCKS[clock]) for name in order]
    ratios = bracketed_ratios(order, seconds, baseline)
    per_name: dict[str, list[float]] = {}
    for name, sec in zip(order, seconds):
        per_name.setdefault(name, []).append(sec / steps * 1e3)
    results: dict[str, Any] = {baseline: {"ms_per_step": summarize(per_name[baseline])}}
    for name in variants:
        results[name] = {
            "ratio": summarize(ratios[name]),
            "ratios": ratios[name],
            "ms_per_step": summarize(per_name[name]),
        }
    return {
        "steps_per_block": steps,
        "rounds": rounds,
        "blocks": len(order),
        "clock": clock,
        "compile": compile_info,
        "variants": results,
    }
