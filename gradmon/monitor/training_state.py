"""What MindSpore's training state tells the monitor, read once when a segment starts, and the
abort checkpoint.

- :func:`restored_step`: where a resumed run's step numbering continues. A checkpoint of the train
  network holds the step cell's device counters (``MonitoredTrainStep``: ``gradmon_counts``) and
  the optimizer's ``global_step``; after ``load_checkpoint`` both say how far training got.
- :func:`overflow_floor`: the loss scale at or below which a loss-scale overflow is a failure
  rather than a dynamic scale settling (see :func:`gradmon.monitor.records.abort_vote`).
- :func:`epoch_length`: the number of steps MindSpore actually runs per epoch; :func:`batch_size`.
- :func:`accumulation_steps`: how many of the loop's steps make one optimizer step.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from gradmon.monitor.records import DYNAMIC_MIN_LOSS_SCALE

__all__ = ["accumulation_steps", "batch_size", "epoch_length", "overflow_floor", "restored_step",
           "save_abort_checkpoint"]

_log = logging.getLogger("gradmon.monitor.callback")


def accumulation_steps(cell: Any) -> int:
    """Calls of the step cell per optimizer step: a ``MonitoredTrainStep``'s ``grad_accum_steps``
    (each call is one micro-batch; the N-th runs the optimizer), 1 for any other cell."""
    steps = getattr(cell, "grad_accum_steps", 1)
    return steps if isinstance(steps, int) and not isinstance(steps, bool) and steps >= 1 else 1


def restored_step(cell: Any, optimizer: Any) -> tuple[int, str]:
    """``(step, source)``: the last step the training state has done, from the larger of the step
    cell's device step counter (``gradmon_read_history().total_steps``; source ``"step_cell"``)
    and the optimizer's ``global_step`` (``"optimizer"``; it does not count skipped updates, so it
    only wins when the cell's counter was not restored). ``(0, "none")`` when neither is there."""
    found: list[tuple[int, str]] = []
    read_history = getattr(cell, "gradmon_read_history", None)
    if callable(read_history):
        try:
            found.append((int(read_history().total_steps), "step_cell"))
        except Exception as exc:  # history_size=0: no counters
            _log.debug("gradmon: no step counter in the step cell: %s", exc)
    global_step = getattr(optimizer, "global_step", None)
    if global_step is not None:
        try:
            found.append((int(np.asarray(global_step.asnumpy()).reshape(-1)[0]), "optimizer"))
        except Exception as exc:
            _log.debug("gradmon: optimizer.global_step not readable: %s", exc)
    if not found:
        return 0, "none"
    return max(found, key=lambda item: item[0])  # the first of equals: the cell's


def overflow_floor(cell: Any) -> float:
    """The loss scale at or below which an overflow step counts toward ``abort_after``: the
    minimum of a dynamic scale (``DynamicLossScaleUpdateCell``: 1.0), ``inf`` for a fixed scale
    (it never goes down, so every overflow counts), 1.0 when the cell has no loss scale of its
    own (a hand-written loop logging ``loss_scale``: MindSpore's dynamic scalers stop at 1.0)."""
    from mindspore import nn

    manager = getattr(cell, "loss_scaling_manager", None)
    if isinstance(manager, nn.DynamicLossScaleUpdateCell):
        minimum = getattr(manager, "minimum_loss_scale", None)
        try:
            return float(np.asarray(minimum.asnumpy()).reshape(-1)[0])
        except Exception:
            return DYNAMIC_MIN_LOSS_SCALE
    if manager is not None or getattr(cell, "scale_sense", None) is not None:
        return math.inf
    return DYNAMIC_MIN_LOSS_SCALE


def epoch_length(cb: Mapping[str, Any]) -> tuple[int | None, str | None]:
    """``(steps per epoch, None)``, or ``(None, reason)`` when it cannot be known, from
    ``Model.train``'s callback parameters. In dataset sink mode an epoch is one sink of
    ``batch_num`` steps. Otherwise it is the dataset's size: ``batch_num`` is not, when sink mode
    was asked for where MindSpore cannot sink (CPU) — it then holds the sink size, while each
    epoch runs the whole dataset."""
    if cb.get("dataset_sink_mode"):
        sink = cb.get("batch_num")
        if isinstance(sink, int) and sink > 0:
            return sink, None
        return None, f"dataset sink mode with an unknown sink size ({sink!r})"
    dataset = cb.get("train_dataset")
    try:
        size = int(dataset.get_dataset_size())  # Model.train asked already: cached
    except Exception as exc:
        return None, f"the training dataset cannot tell its size ({type(exc).__name__}: {exc})"
    if size > 0:
        return size, None
    return None, f"the training dataset reports {size} batches"


def batch_size(cb: Mapping[str, Any]) -> int | None:
    """Samples per step on one rank, from ``Model.train``'s dataset (None when it cannot tell)."""
    try:
        return int(cb.get("train_dataset").get_batch_size())  # type: ignore[union-attr]
    except Exception:
        return None


def save_abort_checkpoint(network: Any, path: str | os.PathLike[str]) -> tuple[str | None, str]:
    """Save the train network's parameters (optimizer state included) to ``path`` when they are
    finite; returns ``(path or None, note for the abort message)``."""
    import mindspore as ms

    if network is None:
        return None, "; no network to save"
    try:
        if not all(np.isfinite(p.asnumpy()).all() for p in network.trainable_params()):
            return None, ("; checkpoint NOT saved: the weights are non-finite "
                          "(the step cell does not skip bad steps)")
        path = os.fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        ms.save_checkpoint(network, path)
        return path, ""
    except Exception as exc:  # saving is best effort; stopping is what matters
        _log.error("gradmon: could not save the abort checkpoint: %s", exc)
        return None, f"; checkpoint NOT saved: {exc}"
