"""What a monitored step returns: the network's outputs in, the step's output tuple out.

Graph-safe helpers used by ``MonitoredTrainStep.construct`` (GRAPH and PYNATIVE mode). Every branch
here is on a compile-time constant (the layout, ``return_grad``, the structure of the network's
outputs), so GRAPH mode compiles only the layout the cell was built with.

Layouts (``output_layout``):

- ``"gradmon"`` (default): the loss, then the gradient norm, then what the stock MindSpore cell
  returns after its loss, then the network's extra outputs:
  ``MonitoredTrainStep`` → ``(loss, grad_norm[, grads][, *extra])`` (``grads``: with
  ``return_grad=True``, the dict ``{parameter name: gradient}`` of ``nn.TrainOneStepCell``);
  ``MonitoredTrainStepWithLossScale`` → ``(loss, grad_norm, overflow, scale[, *extra])``.
- ``"mindformers"``: ``(loss, overflow, scale, lr, grad_norm)``, the tuple of mindformers'
  ``MFTrainOneStepCell``, so its ``MFLossMonitor`` / ``TrainingStateMonitor`` read the norm.
"""

from __future__ import annotations

import math
from typing import Any

import mindspore as ms
from mindspore import Tensor, ops

OUTPUT_LAYOUTS = ("gradmon", "mindformers")


def split_network_outputs(outputs: Any) -> tuple:
    """``(loss, extra)`` of a network's outputs: the loss is the first output, ``extra`` the rest (a tuple).

    A first output that is not a Tensor is refused with a message that says what to change (GRAPH
    mode raises it at compile time, before any kernel runs).
    """
    if isinstance(outputs, (tuple, list)):
        if not outputs:
            raise TypeError("The network given to the monitored step returned an empty tuple; it must return "
                            "its loss Tensor, or a tuple (loss, *extra) with the loss first.")
        loss = outputs[0]
        extra = tuple(outputs[1:])
    else:
        loss = outputs
        extra = ()
    if not isinstance(loss, Tensor):
        raise TypeError("The network given to the monitored step must return its loss as a Tensor, or a "
                        "tuple (loss, *extra) whose first element is the loss Tensor; its first output is "
                        "not a Tensor. Return the loss first, and pass other results after it.")
    return loss, extra


def backward_seed(outputs: Any, value: Any) -> Any:
    """The backward seed for ``outputs``: ``value`` (a number or float32 scalar Tensor) in every element
    of every output, in that output's dtype and shape.

    For one output this is ``nn.TrainOneStepCell``'s ``fill(loss.dtype, loss.shape, sens)``; for a tuple it
    seeds each output the same way, as ``GradOperation`` seeds a tuple without ``sens`` (ones for each).
    """
    if isinstance(outputs, (tuple, list)):
        seeds = ()
        for output in outputs:
            seeds = seeds + (_fill_like(output, value),)  # noqa: RUF005 - GRAPH mode has no starred tuples
        return seeds
    return _fill_like(outputs, value)


def _fill_like(output: Any, value: Any) -> Any:
    if not isinstance(output, Tensor):
        raise TypeError("With sens or a loss scale, every output of the network is seeded with that value, "
                        "so every output must be a Tensor; one is not (a nested tuple, a dict, a number). "
                        "Return a flat tuple (loss, *extra) of Tensors, or train without sens.")
    if isinstance(value, Tensor):
        # The loss-scale cell's seed, as nn.TrainOneStepWithLossScaleCell writes it.
        return ops.ones_like(output) * ops.cast(value, output.dtype)
    return ops.fill(output.dtype, output.shape, value)


def overflow_of(norm: Tensor) -> Tensor:
    """The overflow flag the stock cells return: the (unscaled) gradients are not all finite."""
    return ops.logical_not(ops.isfinite(norm))


def grads_by_name(names: tuple, grads: tuple) -> dict:
    """``{parameter name: gradient}``, the ``return_grad=True`` output of ``nn.TrainOneStepCell``."""
    named = {}
    for index, grad in enumerate(grads):
        named[names[index]] = grad
    return named


def has_learning_rate(optimizer: Any) -> bool:
    """Whether :func:`step_learning_rate` can read ``optimizer`` (an ``nn.Optimizer`` or a look-alike)."""
    names = ("learning_rate", "is_group_lr", "dynamic_lr", "global_step")
    return all(hasattr(optimizer, name) for name in names)


def step_learning_rate(optimizer: Any) -> Tensor:
    """The learning rate this step's update uses, as a float32 scalar; call it before the optimizer runs.

    The rule of ``nn.Optimizer.get_lr`` for the first parameter group (``gradmon.monitor.lr`` reads the same
    on the host): a fixed rate, or the schedule / per-step table at ``optimizer.global_step``, which the
    optimizer advances after reading it (a skipped step does not advance it: it reports the rate it
    would have used). Needs :func:`has_learning_rate`.
    """
    lr = optimizer.learning_rate
    if optimizer.is_group_lr:
        lr = lr[0]
    if optimizer.dynamic_lr:
        lr = lr(optimizer.global_step)
    return ops.cast(lr, ms.float32).reshape(())


class StepOutputs:
    """The output half of the monitored step cells (mixed into ``MonitoredTrainStep``): the rate a step
    used and the output tuple of the cell's ``output_layout``. Uses the cell's ``optimizer``,
    ``return_grad``, ``loss_scale``, ``weight_names``, ``spike_lr`` and ``_one``."""

    def _setup_outputs(self, options: Any) -> None:
        self.output_layout = options.output_layout
        self.mindformers_layout = options.output_layout == "mindformers"
        self.lr_readable = has_learning_rate(self.optimizer)
        self._nan = Tensor(math.nan, ms.float32)

    def _step_learning_rate(self):
        """The rate this step's update uses (the mindformers layout reports it, the detector's
        learning-rate test judges it); else a constant."""
        if (self.mindformers_layout or self.spike_lr) and self.lr_readable:
            return step_learning_rate(self.optimizer)
        return self._nan

    def _loss_scale_after(self):
        """The loss scale after this step (the loss-scale cell's update may have changed it)."""
        return self._one

    def _step_outputs(self, loss, norm, grads, extra, lr):
        """The output tuple of ``output_layout`` (see the module docstring)."""
        if self.mindformers_layout:
            return loss, overflow_of(norm), self._loss_scale_after(), lr, norm
        outputs = (loss, norm)
        if self.return_grad:
            outputs = outputs + (grads_by_name(self.weight_names, grads),)  # noqa: RUF005
        if self.loss_scale:
            outputs = outputs + (overflow_of(norm), self._loss_scale_after())  # noqa: RUF005
        return outputs + extra
