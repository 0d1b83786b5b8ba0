"""Host-side reads of a monitored step cell: its config, its history ring, its per-layer statistics.

A mixin of :class:`gradmon.cells.MonitoredTrainStep`: nothing here runs per step; each method is
called by the host (``LiveMonitor``) when it logs, and costs a few device reads at most.
"""

from __future__ import annotations

from typing import Any

import mindspore as ms
import numpy as np
from mindspore import ops

from .forensics import TOP_LAYERS, read_forensics
from .history import HistorySnapshot, unroll_ring
from .layer_stats import current_lr, layer_rows


def param_square_norms(weights: Any) -> np.ndarray:
    """Per-parameter squared L2 norms (float32 accumulation, float64 result), one device read.

    One reduction per tensor, run eagerly: the extra memory is one tensor's square at a time,
    never a copy of all weights.
    """
    sums = [ops.reduce_sum(ops.square(w if w.dtype == ms.float32 else ops.cast(w, ms.float32)))
            for w in weights]
    return ops.stack(sums).asnumpy().astype(np.float64)


class HostReadMixin:
    """``gradmon_config`` / ``gradmon_read_history`` / ``gradmon_layer_stats`` of the step cells."""

    def gradmon_config(self) -> dict:
        """Static settings for the run-log header (no device work).

        Besides the options: the parallel mode, the device count and ``norm_strategy``, the form
        of the norm actually used (``norm_strategy_requested`` is the option as given).
        """
        config = self.options.as_dict()
        config.update(skip_nonfinite=self.skip_nonfinite,
                      history_fields=list(self.fields) if self.history_size > 0 else [],
                      loss_scale=self.loss_scale)
        config.update(self.parallel_setup.as_config())
        config.update(norm_strategy=self.grad_norm.strategy,
                      norm_strategy_requested=self.options.norm_strategy)
        return config

    def gradmon_read_history(self) -> HistorySnapshot:
        """The last ``min(total_steps, history_size)`` steps, oldest first, in two device reads."""
        if self.history_size <= 0:
            raise RuntimeError("this MonitoredTrainStep keeps no history (history_size=0)")
        ring = self.history.asnumpy()
        counts = self.counts.asnumpy()
        return unroll_ring(ring, counts, self.fields)

    def gradmon_layer_stats(self, top_k: int | None = 10, groups: Any = None) -> list[dict]:
        """Per-parameter (or per-group) gradient norms of the last step; see :func:`layer_rows`.

        Needs ``layer_stats=True``. Costs a pass over the weights on the host's call, none per step.
        """
        if not self.layer_stats:
            raise RuntimeError("construct the step with layer_stats=True to keep per-parameter norms")
        grad_sq = self.layer_sq.asnumpy()
        param_sq = param_square_norms(tuple(self.weights))
        return layer_rows(self.weight_names, grad_sq.tolist(), param_sq.tolist(), current_lr(self.optimizer),
                          top_k=top_k, groups=groups)

    def gradmon_forensics(self, steps_back: int = 0, top_k: int = TOP_LAYERS) -> dict | None:
        """Per-layer norms (top ``top_k``), each rank's norm and the sample ids of the step ``steps_back``
        before the last one run, from the forensics rings (``forensics=K``; a few device reads).

        None when the cell keeps no forensics (``forensics=0``); ``{"missing": why}`` when that step
        has left the ring (``steps_back >= K``). See :func:`gradmon.cells.forensics.forensics_fields`.
        """
        if not getattr(self, "forensics_on", False):
            return None
        return read_forensics(self, int(steps_back), top_k)
