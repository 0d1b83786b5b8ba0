"""Host-side shaping of per-parameter gradient statistics (pure functions, no MindSpore)."""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np


def current_lr(optimizer: Any) -> float:
    """Learning rate of ``optimizer`` now (first group when grouped); NaN if it cannot tell."""
    try:
        lr = optimizer.get_lr()
        if isinstance(lr, (tuple, list)):
            lr = lr[0]
        return float(np.asarray(lr.asnumpy() if hasattr(lr, "asnumpy") else lr).reshape(-1)[0])
    except Exception:  # an optimizer without get_lr: update_ratio becomes NaN, nothing breaks
        return math.nan


def _ratio(lr: float, grad_norm: float, param_norm: float) -> float:
    return lr * grad_norm / param_norm if param_norm > 0.0 else math.inf if grad_norm > 0.0 else 0.0


def _sort_key(row: dict) -> tuple[bool, float]:
    g = row["grad_norm"]
    return (math.isfinite(g), -g if math.isfinite(g) else 0.0)


def layer_rows(names: Sequence[str], grad_sq: Sequence[float], param_sq: Sequence[float], lr: float,
               top_k: int | None = 10, groups: Iterable[str] | None = None) -> list[dict]:
    """Rows ``{name, grad_norm, param_norm, update_ratio}`` sorted by ``grad_norm``, largest first.

    ``grad_sq``/``param_sq`` are per-parameter squared L2 norms. ``update_ratio`` is
    ``lr * grad_norm / param_norm``: the relative size of a plain SGD step with this gradient (for
    adaptive optimizers a proxy, not the applied update). With ``groups`` (glob patterns over
    parameter names, e.g. ``"blocks.0.*"``) one row per pattern aggregates its parameters
    (norms combine as root of summed squares); patterns matching nothing are left out.
    ``top_k=None`` keeps every row. Non-finite gradient norms sort first.
    """
    if not len(names) == len(grad_sq) == len(param_sq):
        raise ValueError("names, grad_sq and param_sq must have the same length")
    if groups is None:
        items = [(n, float(g), float(p)) for n, g, p in zip(names, grad_sq, param_sq)]
    else:
        items = []
        for pattern in groups:
            hit = [i for i, n in enumerate(names) if fnmatch.fnmatchcase(n, pattern)]
            if hit:
                g_sq = sum(float(grad_sq[i]) for i in hit)
                items.append((pattern, g_sq, sum(float(param_sq[i]) for i in hit)))
    rows = []
    for name, g_sq, p_sq in items:
        g = math.sqrt(g_sq) if g_sq >= 0.0 else math.nan
        p = math.sqrt(p_sq) if p_sq >= 0.0 else math.nan
        rows.append({"name": name, "grad_norm": g, "param_norm": p, "update_ratio": _ratio(lr, g, p)})
    # NaN compares false with everything: sort non-finite norms first explicitly.
    rows.sort(key=_sort_key)
    return rows if top_k is None else rows[: max(0, int(top_k))]
