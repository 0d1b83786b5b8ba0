"""The learning rate each recent optimizer step used, read from a MindSpore optimizer on the host.

A MindSpore optimizer keeps its rate as a Parameter (fixed), a table of per-step values
(``learning_rate=[...]``, e.g. from ``nn.piecewise_constant_lr``) or a ``LearningRateSchedule``
cell (``nn.CosineDecayLR``...), indexed by ``optimizer.global_step``, which it increments after
reading the rate. So after ``G`` steps the last ``n`` steps used the indices ``G-n .. G-1``.
Called on log steps only: one read of ``global_step``, plus one schedule evaluation for a
schedule cell (all ``n`` steps at once, padded to a fixed length so a GRAPH-mode schedule is
compiled once). Never raises: a rate that cannot be read is ``None``.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

__all__ = ["LrReader", "step_indices"]

_log = logging.getLogger("gradmon.monitor.lr")


def step_indices(global_step: int, skipped: list[bool]) -> list[int]:
    """The ``global_step`` each of the last ``len(skipped)`` steps ran with, oldest first, given
    the optimizer's ``global_step`` now. A step that skipped the optimizer did not advance it."""
    indices = [0] * len(skipped)
    nxt = global_step
    for i in range(len(skipped) - 1, -1, -1):
        if not skipped[i]:
            nxt -= 1
        indices[i] = max(nxt, 0)
    return indices


class LrReader:
    """Reads the learning rate of the first parameter group of ``optimizer``."""

    def __init__(self, optimizer: Any, *, pad_to: int = 1) -> None:
        self._opt = optimizer
        self._pad_to = max(int(pad_to), 1)
        self._failed = False
        lr = getattr(optimizer, "learning_rate", None)
        if getattr(optimizer, "is_group_lr", False) and lr is not None:
            lr = lr[0]
        self._lr = lr
        self._dynamic = bool(getattr(optimizer, "dynamic_lr", False))
        self._table: np.ndarray | None = None
        if self._dynamic and lr is not None:
            table = getattr(lr, "learning_rate", None)  # optimizer's _IteratorLearningRate
            if table is not None and hasattr(table, "asnumpy") and len(getattr(table, "shape", ())) == 1:
                self._table = table.asnumpy().astype(np.float64)

    def values(self, n: int, skipped: list[bool] | None = None) -> list[float | None]:
        """Rates of the last ``n`` training steps, oldest first.

        ``skipped[i]``: step ``i`` did not run the optimizer (so ``global_step`` did not advance);
        it is given the rate it would have used."""
        if n <= 0:
            return []
        try:
            return self._values(n, skipped or [False] * n)
        except Exception as exc:  # a monitoring read must not break training
            if not self._failed:
                self._failed = True
                _log.warning("gradmon: cannot read the learning rate: %s", exc)
            return [None] * n

    def _values(self, n: int, skipped: list[bool]) -> list[float | None]:
        lr = self._lr
        if lr is None:
            return [None] * n
        if not self._dynamic:
            return [float(np.asarray(lr.asnumpy()).reshape(-1)[0])] * n
        g = int(np.asarray(self._opt.global_step.asnumpy()).reshape(-1)[0])
        indices = step_indices(g, skipped)
        if self._table is not None:
            last = len(self._table) - 1
            # Out of the table: the optimizer's Gather is out of range there; report the last entry.
            return [float(self._table[min(i, last)]) for i in indices]
        return self._evaluate_schedule(indices)

    def _evaluate_schedule(self, indices: list[int]) -> list[float | None]:
        import mindspore as ms

        n = len(indices)
        size = max(n, self._pad_to)
        padded = np.array(indices + [indices[-1]] * (size - n), dtype=np.int32)
        out = np.asarray(self._lr(ms.Tensor(padded)).asnumpy()).reshape(-1)
        if out.shape == (size,):
            return [float(v) for v in out[:n]]
        # A schedule that does not broadcast over a vector of steps: one call per step.
        return [float(np.asarray(self._lr(ms.Tensor(np.array([i], np.int32))).asnumpy()).reshape(-1)[0])
                for i in indices]
