"""Host-side shaping of per-parameter gradient statistics (pure functions, no MindSpore)."""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

# Forensics (gradmon.cells.forensics): columns of the per-layer ring at most (past this, parameters
# are grouped by name prefix; K x 512 float32 is 16 KiB at K=8, one small read at an alarm), and
# the layers an alarm event names, largest first.
MAX_FORENSICS_COLUMNS = 512
TOP_LAYERS = 10


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


def forensics_columns(names: Sequence[str],
                      max_columns: int = MAX_FORENSICS_COLUMNS) -> tuple[list[str], list[int] | None]:
    """The per-layer ring's columns for parameters ``names``: ``(column names, group of each parameter)``.

    Up to ``max_columns`` parameters: one column each (``groups`` is None). More: parameters are
    grouped by the longest dotted name prefix that gives at most ``max_columns`` groups
    (``blocks.3.attn.q.weight`` -> ``blocks.3.attn``, then ``blocks.3``, ...), in order of first
    appearance; if even the first name part gives too many, consecutive runs of parameters.
    """
    if max_columns < 1:
        raise ValueError(f"max_columns must be >= 1, got {max_columns}")
    names = list(names)
    if len(names) <= max_columns:
        return names, None
    depth = max(n.count(".") for n in names)
    for d in range(depth, 0, -1):
        keys = [".".join(n.split(".")[:d]) for n in names]
        order = list(dict.fromkeys(keys))
        if len(order) <= max_columns:
            index = {k: i for i, k in enumerate(order)}
            return order, [index[k] for k in keys]
    per = math.ceil(len(names) / max_columns)
    groups = [i // per for i in range(len(names))]
    runs = [(g * per, min(len(names), (g + 1) * per) - 1) for g in range(groups[-1] + 1)]
    columns = [names[a] if a == b else f"{names[a]}..{names[b]}" for a, b in runs]
    return columns, groups


def forensics_fields(columns: Sequence[str], layer_sq: Sequence[float], rank_norms: Sequence[float] | None,
                     sample_ids: Sequence[Sequence[int]] | None, top_k: int = TOP_LAYERS) -> dict[str, Any]:
    """The ``forensics`` object of an alarm event from one step's ring rows (docs/format.md).

    ``layers``: the ``top_k`` largest per-layer norms ``{name, grad_norm}`` (non-finite first),
    ``layer_count`` the columns kept; ``rank_norms`` each rank's own norm, by rank, and
    ``top_rank`` the largest (a non-finite one counts as largest); ``sample_ids`` the ids by rank.
    """
    rows = []
    for name, sq in zip(columns, layer_sq):
        sq = float(sq)
        rows.append({"name": name, "grad_norm": math.sqrt(sq) if sq >= 0.0 else math.nan})
    # NaN compares false with everything: non-finite norms sort first explicitly.
    rows.sort(key=_sort_key)
    out: dict[str, Any] = {"layers": rows[: max(0, int(top_k))], "layer_count": len(rows)}
    if rank_norms is not None and len(rank_norms):
        norms = [float(v) for v in rank_norms]
        out["rank_norms"] = norms
        # The largest rank's norm; a non-finite one counts as larger than any.
        out["top_rank"] = min(range(len(norms)), key=lambda i: _sort_key({"grad_norm": norms[i]}))
    if sample_ids is not None:
        out["sample_ids"] = [[int(i) for i in ids] for ids in sample_ids]
    return out


def ring_slot(total: int, size: int, steps_back: int) -> int | None:
    """Row of a ring of ``size`` rows after ``total`` writes that holds the write ``steps_back``
    before the last (0: the last); None when it was never written or has been overwritten."""
    if steps_back < 0 or steps_back >= min(total, size):
        return None
    return (total - 1 - steps_back) % size
