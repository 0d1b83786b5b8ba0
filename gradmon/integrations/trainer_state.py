"""What mindformers 2.x's PyNative ``Trainer`` tells its callbacks, turned into gradmon's header and
step rows. Pure Python: no MindSpore, no mindformers import (the config and state are duck-typed).

mindformers 2.x (``mindformers/pynative/trainer/trainer.py``) calls every ``TrainerCallback`` as
``hook(config, state, model=..., optimizer=..., lr_scheduler=..., train_dataset=..., eval_dataset=...,
**extra)``: ``config`` is its ``TrainConfig`` (``training``, ``parallelism`` sections, extra
top-level keys kept as attributes), ``state`` its ``TrainerState`` (``global_step``, ``max_steps``,
``epoch_step``, ``global_batch_size``, ``num_accumulation_steps``, ``skipped_steps``), and
``on_step_end`` adds ``loss`` (None on a pipeline stage that is not the last), ``grad_norm`` (the
all-reduced global norm before clipping, from ``_calculate_global_grad_norm``) and ``has_last``.

- :func:`trainer_settings`: the header's ``trainer`` object (clip / skip settings, batch sizes, the
  parallel layout, gradmon's spike defence when the trainer has it);
- :func:`runner_wrapper_warning`: the message for a ``runner_wrapper`` the PyNative trainer ignores;
- :class:`TrainerStepHistory`: a host-side stand-in for the step cell's device history ring, so the
  monitor's read interval, records, events, rates and abort policy work unchanged: one row per step,
  values kept as given (device tensors are read only when the monitor reads, on log steps).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gradmon.monitor.outputs import to_float

__all__ = [
    "CLIP_EPS",
    "TRAINER_NAME",
    "HistoryRows",
    "TrainerStepHistory",
    "clip_coefficient",
    "parallel_layout",
    "runner_wrapper_warning",
    "step_epoch",
    "trainer_settings",
]

TRAINER_NAME = "mindformers.pynative.Trainer"
# mindformers' _calculate_global_grad_norm clips with max_norm / (norm + eps), eps = 1e-6 (as gradmon does).
CLIP_EPS = 1e-6

# The gradmon defence's per-step outcome on the trainer state (see gradmon.integrations.trainer_defence).
DEFENCE_ATTRIBUTE = "gradmon_defence"
SPIKE_SETTINGS_ATTRIBUTE = "gradmon_spike"


def _get(obj: Any, name: str, default: Any = None) -> Any:
    """``obj.name`` or ``obj[name]`` (a TrainConfig section or a plain dict), else ``default``."""
    if obj is None:
        return default
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    try:
        return getattr(obj, name)
    except (AttributeError, KeyError):
        return default


def _int(value: Any, default: int | None = None) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def parallel_layout(config: Any, world_size: int) -> dict[str, int]:
    """The parallel degrees of a PyNative config's ``parallelism`` section. ``data_parallel`` is
    derived as the trainer does (``world_size // (tp * pp * cp)``) unless the trainer stored it."""
    section = _get(config, "parallelism")
    degrees = {name: _int(_get(section, name, 1), 1) or 1 for name in
               ("tensor_parallel", "pipeline_parallel", "context_parallel", "expert_parallel")}
    model = degrees["tensor_parallel"] * degrees["pipeline_parallel"] * degrees["context_parallel"]
    data_parallel = _int(_get(section, "data_parallel"))
    derived = max(int(world_size) // model, 1)
    layout = {"data_parallel": data_parallel if data_parallel else derived, **degrees}
    shard = _int(_get(section, "data_parallel_shard"))
    if shard is not None and shard > 0:
        layout["data_parallel_shard"] = shard
    return layout


def trainer_settings(config: Any, state: Any, world_size: int) -> dict[str, Any]:
    """The header's ``trainer`` object: what the trainer clips, skips and batches, and its layout."""
    training = _get(config, "training")
    settings: dict[str, Any] = {
        "name": TRAINER_NAME,
        "max_norm": to_float(_get(training, "max_norm")),
        "use_skip_step_on_nan": bool(_get(training, "use_skip_step_on_nan", False)),
        "max_consecutive_skipped_steps": _int(_get(training, "max_consecutive_skipped_steps", 0), 0),
        "global_batch_size": (_int(_get(state, "global_batch_size"))
                              or _int(_get(training, "global_batch_size"))),
        "local_batch_size": _int(_get(training, "local_batch_size")),
        "num_accumulation_steps": _int(_get(state, "num_accumulation_steps", 1), 1),
        "max_steps": _int(_get(state, "max_steps")),
        "parallel_layout": parallel_layout(config, world_size),
    }
    spike = _get(state, SPIKE_SETTINGS_ATTRIBUTE)
    if isinstance(spike, Mapping):
        settings["spike"] = dict(spike)
    if runner_wrapper_warning(config) is not None:
        settings["ignored"] = ["runner_wrapper"]
    return {k: v for k, v in settings.items() if v is not None}


def runner_wrapper_warning(config: Any) -> str | None:
    """The warning for a PyNative config that carries ``runner_wrapper`` (which only the legacy
    static-graph Trainer builds; the PyNative ``TrainConfig`` keeps unknown top-level keys and
    ignores them), or None."""
    wrapper = _get(config, "runner_wrapper")
    if wrapper is None:
        return None
    kind = _get(wrapper, "type")
    what = f"runner_wrapper ({kind})" if kind else "runner_wrapper"
    return (f"{what} is ignored by mindformers' PyNative Trainer (2.x): it builds no train-step cell, so "
            "gradmon's GradmonTrainStep does not run there. The trainer clips and skips itself "
            "(training.max_norm, training.use_skip_step_on_nan); keep callbacks: [{type: LiveMonitor}] "
            "for gradmon's log and use gradmon.integrations.mindformers.GradmonTrainer (spike_mode: "
            "detect/clip/skip) for gradmon's spike defence. See docs/mindformers.md.")


def step_epoch(step: int, epoch_step: Any) -> int | None:
    """The epoch (from 1) of global step ``step`` (from 1) with ``epoch_step`` steps per epoch."""
    length = _int(epoch_step)
    if not length or length <= 0:
        return None
    return (int(step) - 1) // length + 1


def clip_coefficient(norm: float, max_norm: float | None) -> float:
    """The factor mindformers' clip applied to the gradients: ``max_norm / (norm + eps)`` when that
    is below 1 (any non-finite norm: 1, the clip compares False)."""
    if max_norm is None or not math.isfinite(norm):
        return 1.0
    coef = max_norm / (norm + CLIP_EPS)
    return coef if coef < 1.0 else 1.0


@dataclass
class HistoryRows:
    """What :meth:`TrainerStepHistory.gradmon_read_history` returns (the device ring's snapshot shape)."""

    fields: tuple[str, ...]
    rows: list[tuple[float, ...]]
    total_steps: int


@dataclass
class _Pending:
    step: int
    loss: Any
    grad_norm: Any
    skipped: bool
    defence: Mapping[str, Any] | None


class TrainerStepHistory:
    """The steps of a PyNative trainer since the monitor's last read, as history rows.

    ``record`` keeps each step's values as given (tensors are not read); ``gradmon_read_history``
    reads them and returns the rows (``loss`` only when every step read has one: a pipeline stage
    that is not the last has none), then forgets them. ``max_norm``: the trainer's clip threshold;
    ``spike_mode``: gradmon's defence on the trainer (None: none). ``gradmon_config`` is what the
    header reports as the "cell's" settings.
    """

    def __init__(self, *, max_norm: float | None, skip_nonfinite: bool, spike_mode: str | None = None,
                 limit: int = 100_000) -> None:
        self.max_norm = max_norm
        self.skip_nonfinite = skip_nonfinite
        self.spike_mode = spike_mode
        self._limit = max(int(limit), 1)
        self._pending: list[_Pending] = []
        self.total_steps = 0

    def gradmon_config(self) -> dict[str, Any]:
        return {"max_norm": self.max_norm, "spike_mode": self.spike_mode or "off",
                "skip_nonfinite": self.skip_nonfinite, "norm_source": TRAINER_NAME}

    def record(self, step: int, *, loss: Any, grad_norm: Any, skipped: bool,
               defence: Mapping[str, Any] | None = None) -> None:
        """Step ``step`` ran: ``skipped`` by the trainer's NaN rule; ``defence``: the spike rule's
        outcome for this step (``spike``, ``zscore``, ``skipped``, ``clip_coef``) when it ran."""
        self.total_steps = int(step)
        self._pending.append(_Pending(int(step), loss, grad_norm, bool(skipped), defence))
        if len(self._pending) > self._limit:  # never read (no writer, no abort policy): keep a bounded tail
            del self._pending[: len(self._pending) - self._limit]

    def gradmon_read_history(self) -> HistoryRows:
        pending, self._pending = self._pending, []
        has_loss = bool(pending) and all(p.loss is not None for p in pending)
        spike = self.spike_mode not in (None, "off")
        names = ((("loss",) if has_loss else ()) + ("grad_norm", "clip_coef") + (("zscore",) if spike else ())
                 + ("clipped", "spike", "skipped", "nonfinite"))
        return HistoryRows(names, [self._row(p, has_loss, spike) for p in pending], self.total_steps)

    def _row(self, p: _Pending, has_loss: bool, with_zscore: bool) -> tuple[float, ...]:
        loss = to_float(p.loss) if has_loss else None
        norm = to_float(p.grad_norm)
        norm = math.nan if norm is None else norm
        defence = p.defence or {}
        spike = bool(defence.get("spike"))
        skipped = p.skipped or bool(defence.get("skipped"))
        coef = clip_coefficient(norm, self.max_norm)
        if defence.get("clip_coef") is not None:
            coef = min(coef, float(defence["clip_coef"]))
        zscore = to_float(defence.get("zscore")) or 0.0
        nonfinite = not math.isfinite(norm) or (loss is not None and not math.isfinite(loss))
        clipped = not skipped and coef < 1.0
        flags = (float(clipped), float(spike), float(skipped), float(nonfinite))
        return (((loss,) if has_loss else ()) + (norm, coef if not skipped else 1.0)
                + ((zscore,) if with_zscore else ()) + flags)
