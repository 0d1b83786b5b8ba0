"""``TrainerLiveMonitor``: one ``LiveMonitor`` for both of mindformers' trainers.

mindformers keeps one callback registry for its two trainers, so the YAML entry
``callbacks: [{type: LiveMonitor}]`` builds the same class under both:

- the legacy static-graph ``Trainer`` runs MindSpore's ``Model.train``, which calls
  ``on_train_begin(run_context)`` and the other MindSpore ``Callback`` hooks: :class:`LiveMonitor`'s;
- the 2.x PyNative ``Trainer`` calls mindformers' ``TrainerCallback`` hooks with
  ``(config, state, model=..., optimizer=..., ...)`` (see :mod:`gradmon.integrations.trainer_state`).

Two hook names are shared (``on_train_begin``, ``on_train_end``): this class dispatches on how it is
called (one positional ``run_context``: MindSpore; ``config, state`` plus keywords: the PyNative
trainer). The others (``on_step_begin``, ``on_step_end``, ``on_epoch_*``, ``on_begin``, ``on_end``)
exist only in the PyNative protocol. No mindformers import here: the trainer's objects are duck-typed.

Under the PyNative trainer the log has, per step: ``loss`` (on the steps and ranks that have it),
the trainer's ``grad_norm``, the rate the step used (the optimizer's schedule at its ``global_step``;
a skipped step does not advance it), ``skipped`` (``state.skipped_steps`` grew: the trainer's
``use_skip_step_on_nan``), ``clipped`` (``training.max_norm``), ``step_time`` and ``throughput``
(``global_batch_size`` samples per step), plus ``spike`` / ``zscore`` when the trainer runs gradmon's
spike defence (:mod:`gradmon.integrations.trainer_defence`). The header's ``trainer`` object holds the
trainer's clip/skip settings, batch sizes and parallel layout. ``abort_after`` stops the loop by
setting ``state.max_steps`` to the current step (the loop runs ``while step < state.max_steps``).

A run that raises: mindformers 2.1 does not call ``on_train_end`` when its loop raises (its
``[SkipStepOnNaN]`` ``RuntimeError``, or any other), so the log would stay open. The monitor closes
it as ``failed`` (``interrupted`` for ``KeyboardInterrupt``) from, whichever comes first: gradmon's
``GradmonTrainer.train`` (deterministic), a ``with monitor:`` block around ``train()``, the process's
``sys.excepthook`` (an uncaught exception), or a finalizer on the trainer's state (when the trainer
is collected, or at interpreter exit).
"""

from __future__ import annotations

import logging
import sys
import warnings
import weakref
from typing import Any

from gradmon.monitor.callback import LiveMonitor
from gradmon.monitor.header import distributed

from .trainer_state import (
    DEFENCE_ATTRIBUTE,
    TrainerStepHistory,
    runner_wrapper_warning,
    step_epoch,
    trainer_settings,
)

__all__ = ["TrainerLiveMonitor", "close_trainer_monitors", "is_trainer_call", "status_for"]

_log = logging.getLogger("gradmon.integrations")

# Monitors with a PyNative segment open (for the excepthook).
_OPEN: weakref.WeakSet[TrainerLiveMonitor] = weakref.WeakSet()
_hook_installed = False


def is_trainer_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a hook was called by mindformers' PyNative trainer (``config, state, **kwargs``)
    rather than by MindSpore's ``Model`` (one ``run_context``)."""
    return len(args) >= 2 or bool(kwargs)


def status_for(exc: BaseException | type[BaseException] | None) -> str:
    """The ``end`` status of a run stopped by ``exc``."""
    kind = exc if isinstance(exc, type) else type(exc)
    if exc is None:
        return "finished"
    return "interrupted" if issubclass(kind, (KeyboardInterrupt, SystemExit)) else "failed"


def close_trainer_monitors(callbacks: Any, exc: BaseException | None) -> None:
    """Close the open PyNative segments of the monitors among ``callbacks`` (a list, or a
    ``CallbackHandler`` with ``.callbacks``) with the status ``exc`` calls for."""
    items = getattr(callbacks, "callbacks", callbacks) or []
    for cb in list(items):
        if isinstance(cb, TrainerLiveMonitor) and cb.trainer_segment_open:
            cb.close(status_for(exc))


def _excepthook(exc_type: Any, exc: Any, tb: Any) -> None:
    for monitor in list(_OPEN):
        try:
            monitor.close(status_for(exc_type))
        except Exception:  # the traceback below matters more
            _log.exception("gradmon: could not end the run log")
    _previous_excepthook(exc_type, exc, tb)


_previous_excepthook = sys.excepthook


def _install_excepthook() -> None:
    global _hook_installed, _previous_excepthook
    if not _hook_installed:
        _previous_excepthook, sys.excepthook = sys.excepthook, _excepthook
        _hook_installed = True


def _close_failed(monitor_ref: weakref.ref[TrainerLiveMonitor]) -> None:
    monitor = monitor_ref()
    if monitor is not None and monitor.trainer_segment_open:
        monitor.close("failed")


class TrainerLiveMonitor(LiveMonitor):
    """:class:`gradmon.LiveMonitor` that also speaks mindformers 2.x's ``TrainerCallback`` protocol
    (see the module docstring). Same arguments as ``LiveMonitor``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._trainer_state: weakref.ref[Any] | None = None
        self._trainer_history: TrainerStepHistory | None = None
        self._skipped_seen = 0
        self._finalizer: weakref.finalize | None = None

    @property
    def trainer_segment_open(self) -> bool:
        """A segment opened by the PyNative trainer is open."""
        return self._started and self._trainer_history is not None

    # -- the shared hooks: dispatch on the caller ----------------------------------------------

    def on_train_begin(self, *args: Any, **kwargs: Any) -> None:
        if is_trainer_call(args, kwargs):
            self._trainer_train_begin(*args, **kwargs)
        else:
            self._trainer_history = None
            super().on_train_begin(*args)

    def on_train_end(self, *args: Any, **kwargs: Any) -> None:
        self.close()

    # -- mindformers' TrainerCallback hooks ---------------------------------------------------

    def on_begin(self, config: Any, state: Any, **kwargs: Any) -> None:
        """Nothing to do (a task starts: training or inference)."""

    def on_end(self, config: Any, state: Any, **kwargs: Any) -> None:
        """Nothing to do."""

    def on_epoch_begin(self, config: Any, state: Any, **kwargs: Any) -> None:
        """Nothing to do: the epoch of a step comes from ``state.epoch_step``."""

    def on_epoch_end(self, config: Any, state: Any, **kwargs: Any) -> None:
        """Nothing to do."""

    def on_step_begin(self, config: Any, state: Any, **kwargs: Any) -> None:
        if self.trainer_segment_open:
            self._logger.step_begin()

    def on_step_end(self, config: Any, state: Any, *, loss: Any = None, grad_norm: Any = None,
                    has_last: bool = True, **kwargs: Any) -> None:
        history = self._trainer_history
        if not self.trainer_segment_open or history is None:
            return
        step = int(state.global_step)
        skipped_total = int(getattr(state, "skipped_steps", 0) or 0)
        skipped, self._skipped_seen = skipped_total > self._skipped_seen, skipped_total
        defence = getattr(state, DEFENCE_ATTRIBUTE, None)
        if not isinstance(defence, dict) or defence.get("step") != step:
            defence = None  # none this step (or a stale one)
        history.record(step, loss=loss if has_last else None, grad_norm=grad_norm, skipped=skipped,
                       defence=defence)
        self._logger.step_end(step, None, epoch=step_epoch(step, getattr(state, "epoch_step", 0)))

    # -- a segment of the PyNative trainer ----------------------------------------------------

    def _trainer_train_begin(self, config: Any, state: Any, *, optimizer: Any = None, **kwargs: Any) -> None:
        warning = runner_wrapper_warning(config)
        if warning is not None:
            warnings.warn(warning, UserWarning, stacklevel=3)
            _log.warning("gradmon: %s", warning)
        if self._started:
            self.close()  # a monitor reused for a second train(), or one started by hand: a new segment
        _, world_size = distributed()
        settings = trainer_settings(config, state, world_size)
        spike = settings.get("spike") or {}
        history = TrainerStepHistory(max_norm=settings.get("max_norm"),
                                     skip_nonfinite=settings["use_skip_step_on_nan"],
                                     spike_mode=spike.get("mode"),
                                     limit=max(2 * self.settings.log_interval, 1024))
        self.attach(history, optimizer)
        self._trainer_history = history
        epoch_step = int(getattr(state, "epoch_step", 0) or 0)
        # Where the numbering continues: the trainer's step (restored on resume), unless the user said.
        resumed_at = int(getattr(state, "global_step", 0) or 0)
        if self.settings.initial_step is not None:
            resumed_at = None
        self._open_segment(
            resumed_at, epoch_step or None,
            None if epoch_step else "the trainer's state has no epoch_step", None,
            initial_step_from="trainer_state",
            pipeline_stages=settings["parallel_layout"]["pipeline_parallel"],
            samples_per_step=settings.get("global_batch_size"),
            header_extra={"trainer": settings},
        )
        self._skipped_seen = int(getattr(state, "skipped_steps", 0) or 0)
        self._trainer_state = weakref.ref(state)
        self._finalizer = weakref.finalize(state, _close_failed, weakref.ref(self))
        _OPEN.add(self)
        _install_excepthook()
        if self.settings.abort_checkpoint is not None:
            _log.warning("gradmon: abort_checkpoint is not used under mindformers' PyNative Trainer; "
                         "its checkpoint section (checkpoint.enable_save) saves the run")

    def _request_stop(self) -> None:
        state = self._trainer_state() if self._trainer_state is not None else None
        if state is not None:
            state.max_steps = int(state.global_step)  # the loop runs while step < state.max_steps
        else:
            super()._request_stop()

    def close(self, status: str | None = None) -> None:
        super().close(status)
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        _OPEN.discard(self)
