"""gradmon's spike defence for mindformers 2.x's PyNative ``Trainer``: a mixin, not a fork.

The trainer's optimizer step (``Trainer._optimizer_update`` in mindformers 2.1) is::

    global_norm, grads = _calculate_global_grad_norm(params, max_norm=training.max_norm)  # clips in place
    if not self._should_skip_optimizer_step(global_norm):   # training.use_skip_step_on_nan
        self.optimizer(grads)

:class:`SpikeDefence` overrides the one seam there, ``_should_skip_optimizer_step(global_norm)``:
after the trainer's own NaN rule it runs gradmon's adaptive spike rule (ZClip,
:class:`gradmon.cells.spike_kernel.SpikeDetector`, the same update ``MonitoredTrainStep`` runs, early
rule included, so the first steps are defended too; one fused kernel on CPU, on the norm tensor in
PyNative) on the trainer's norm, before the optimizer step, with the same semantics:

- ``detect``: flag the spike (``spike`` and ``zscore`` in the log);
- ``clip``: scale the step's gradients to the detector's target; combined with the trainer's
  ``max_norm`` clip (already applied in place) as the smaller target, as ``MonitoredTrainStep``
  combines it with its ``max_norm``;
- ``skip``: skip the optimizer update of a spike step (the optimizer's ``global_step``, hence the
  rate, does not advance; ``state.skipped_steps`` stays the trainer's NaN count).

The detector's loss test is off here: the seam sees the norm, not the step's loss.
Non-finite norms leave the detector's state unchanged (the trainer's NaN rule decides those steps).
The detector's state lives on the device; one scalar is read per step for the decision (the trainer
reads the norm for its clip anyway). Its state is not checkpointed: after a resume it warms up again.

Use it by mixing it in front of the trainer::

    from mindformers.pynative.trainer import Trainer
    class GradmonTrainer(SpikeDefence, Trainer): ...
    GradmonTrainer(config, spike_mode="clip").train()

(``gradmon.integrations.mindformers.GradmonTrainer`` is this class.) The outcome of each step goes
to the trainer's state (``state.gradmon_defence``), where :class:`TrainerLiveMonitor` reads it.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import mindspore as ms
from mindspore import Tensor, ops

from gradmon.cells.spike import SpikeConfig, initial_state
from gradmon.cells.spike_kernel import SpikeDetector

from .trainer_callback import close_trainer_monitors
from .trainer_state import (
    CLIP_EPS,
    DEFENCE_ATTRIBUTE,
    SPIKE_SETTINGS_ATTRIBUTE,
    clip_coefficient,
    runner_wrapper_warning,
)

__all__ = ["SpikeDefence", "step_gradients"]

_log = logging.getLogger("gradmon.integrations")


def step_gradients(parameters: Any) -> list[Any]:
    """The gradients the trainer's optimizer step uses, as mindformers' ``get_grad`` finds them:
    ``param.main_grad`` (HSDP's fp32 buffer) when set, else ``param.grad``; parameters without one
    are left out."""
    grads = []
    for param in parameters:
        grad = getattr(param, "main_grad", None)
        if grad is None:
            grad = getattr(param, "grad", None)
        if grad is not None:
            grads.append(grad)
    return grads


def _scale_in_place(grad: Any, factor: float) -> None:
    # A DTensor gradient is scaled through its local shard, as mindformers' clip does. copy_ rather
    # than mul_: MindSpore 2.10's Tensor.mul_ returns a new tensor on CPU instead of writing in place.
    local = grad.to_local() if hasattr(grad, "to_local") else grad
    local.copy_(local * factor)


class SpikeDefence:
    """Mixin for mindformers' PyNative ``Trainer`` (put it first): gradmon's spike rule on the
    trainer's global norm (module docstring). Keyword arguments, besides the trainer's own:
    ``spike_mode`` (``"detect"``, ``"clip"``, ``"skip"``; default ``"clip"``), ``spike_warmup``,
    ``spike_alpha``, ``spike_z``, ``spike_early_window`` (:class:`gradmon.cells.SpikeConfig`'s
    settings; the early rule judges from the 5th finite step on, as in ``MonitoredTrainStep``)."""

    def __init__(self, *args: Any, spike_mode: str = "clip", spike_warmup: int = SpikeConfig.warmup,
                 spike_alpha: float = SpikeConfig.alpha, spike_z: float = SpikeConfig.z_threshold,
                 spike_early_window: int = SpikeConfig.early_window, **kwargs: Any) -> None:
        # No loss or learning-rate test: the trainer's seam (_should_skip_optimizer_step) sees the norm only.
        self.gradmon_spike = SpikeConfig(spike_mode, spike_warmup, spike_alpha, spike_z,
                                         early_window=spike_early_window, loss_window=0, lr_ratio=0.0)
        if not self.gradmon_spike.enabled:
            raise ValueError("SpikeDefence needs spike_mode 'detect', 'clip' or 'skip' (for no defence, "
                             "use the trainer itself)")
        self._gradmon_spike_detector = SpikeDetector(self.gradmon_spike)
        self._gradmon_spike_state = Tensor(initial_state(self.gradmon_spike))
        super().__init__(*args, **kwargs)
        warning = runner_wrapper_warning(getattr(self, "config", None))
        if warning is not None:
            warnings.warn(warning, UserWarning, stacklevel=2)

    def gradmon_spike_settings(self) -> dict[str, Any]:
        spike = self.gradmon_spike
        return {"mode": spike.mode, "warmup": spike.warmup, "alpha": spike.alpha,
                "z_threshold": spike.z_threshold, "early_window": spike.early_window}

    def _init_train_state(self) -> Any:
        state = super()._init_train_state()  # type: ignore[misc]
        setattr(state, SPIKE_SETTINGS_ATTRIBUTE, self.gradmon_spike_settings())
        return state

    def train(self, *args: Any, **kwargs: Any) -> Any:
        """The trainer's ``train``; when it raises, gradmon's monitors end their logs as ``failed``
        (mindformers 2.1 calls no ``on_train_end`` then)."""
        try:
            return super().train(*args, **kwargs)  # type: ignore[misc]
        except BaseException as exc:
            close_trainer_monitors(getattr(self, "callback_handler", None), exc)
            raise

    def _should_skip_optimizer_step(self, global_norm: Any) -> bool:
        skip = bool(super()._should_skip_optimizer_step(global_norm))  # type: ignore[misc]
        outcome = self._gradmon_spike_step(global_norm, skip)
        setattr(self.state, DEFENCE_ATTRIBUTE, outcome)  # type: ignore[attr-defined]
        return skip or outcome["skipped"]

    def _gradmon_gradients(self) -> list[Any]:
        """This step's gradients (after the trainer's clip, before its optimizer step)."""
        return step_gradients(self.optimizer.parameters)  # type: ignore[attr-defined]

    def _gradmon_spike_step(self, global_norm: Any, skipped: bool) -> dict[str, Any]:
        spike_cfg = self.gradmon_spike
        norm = ops.cast(global_norm if isinstance(global_norm, Tensor) else Tensor(float(global_norm)),
                        ms.float32).reshape(())
        # The loss argument is unread: this detector has no loss test.
        zscore, spike, target, state, _, _ = self._gradmon_spike_detector(norm, ops.isfinite(norm),
                                                                         self._gradmon_spike_state, norm)
        self._gradmon_spike_state = state
        is_spike = bool(spike.asnumpy())
        outcome: dict[str, Any] = {"step": int(self.state.global_step) + 1,  # type: ignore[attr-defined]
                                   "spike": is_spike, "zscore": zscore, "skipped": False}
        if not is_spike or skipped:
            return outcome
        if spike_cfg.mode == "skip":
            outcome["skipped"] = True
        elif spike_cfg.mode == "clip":
            value, goal = float(norm.asnumpy()), float(target.asnumpy())
            applied = clip_coefficient(value, _max_norm(self))  # what the trainer's clip did already
            wanted = min(goal / (value + CLIP_EPS), applied, 1.0)
            if applied > 0.0 and wanted < applied:
                for grad in self._gradmon_gradients():
                    _scale_in_place(grad, wanted / applied)
            outcome["clip_coef"] = wanted
        return outcome


def _max_norm(trainer: Any) -> float | None:
    try:
        return float(trainer.config.training.max_norm)
    except (AttributeError, TypeError, ValueError):
        return None
