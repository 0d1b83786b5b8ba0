"""Checks of what a monitored step cell is given, with messages that say what to do.

:func:`check_step_arguments` runs in ``__init__`` before MindSpore's own code (which would fail
later with an ``AttributeError`` from inside ``nn.TrainOneStepCell``). :func:`check_step_inputs` and
:func:`check_loss_output` run in ``construct``: shapes, dtypes and the number of inputs are
compile-time constants in GRAPH mode, so there they raise while the graph compiles (the first
call) and add no kernel; in PYNATIVE they cost a few attribute reads per step. Their messages
are plain string concatenation, which GRAPH mode's parser takes.
"""

from __future__ import annotations

import inspect
from typing import Any

import mindspore as ms
from mindspore import Tensor, nn

__all__ = ["check_loss_output", "check_step_arguments", "check_step_inputs", "construct_inputs",
           "step_checks", "step_usage"]

_FLOAT_TYPES = (ms.float16, ms.float32, ms.float64, ms.bfloat16)


def check_step_arguments(owner: str, network: Any, optimizer: Any) -> None:
    """``TypeError`` naming the argument when ``network`` is not a Cell or ``optimizer`` is not
    something that updates the weights (a ``nn.Optimizer``, or a Cell with ``parameters``)."""
    if isinstance(network, type) or not isinstance(network, nn.Cell):
        raise TypeError(f"{owner}: network must be a mindspore.nn.Cell that returns the loss "
                        f"(e.g. nn.WithLossCell(net, loss_fn)), got {_described(network)}")
    if isinstance(optimizer, nn.Optimizer):
        return
    if isinstance(optimizer, type) and issubclass(optimizer, nn.Cell):
        hint = f"; pass an instance: {optimizer.__name__}(net.trainable_params(), learning_rate=...)"
    elif isinstance(optimizer, nn.LossBase):
        hint = (f"; that is a loss function: the step cell takes the network with its loss, "
                f"{step_usage(owner, 'LossScale' in owner)}")
    elif isinstance(optimizer, nn.Cell) and hasattr(optimizer, "parameters"):
        return  # a hand-written optimizer cell: nn.TrainOneStepCell only needs .parameters
    elif isinstance(optimizer, nn.Cell):
        hint = " without a .parameters attribute (the weights it updates)"
    else:
        hint = ""
    raise TypeError(f"{owner}: optimizer must be a mindspore.nn.Optimizer (or a Cell that updates the "
                    f"weights), got {_described(optimizer)}{hint}")


def _described(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, type):
        return f"the class {value.__module__}.{value.__qualname__}"
    return f"a {type(value).__module__}.{type(value).__qualname__}"


def construct_inputs(network: nn.Cell) -> tuple[int, int, str]:
    """``(fewest, most, names)`` of the inputs the network's ``construct`` takes (``most`` -1: any
    number), for :func:`check_step_inputs`; ``(0, -1, "")`` when its signature cannot be read."""
    try:
        params = list(inspect.signature(network.construct).parameters.values())
    except (TypeError, ValueError):
        return 0, -1, ""
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    fewest = sum(1 for p in positional if p.default is p.empty)
    most = -1 if any(p.kind == p.VAR_POSITIONAL for p in params) else len(positional)
    names = ", ".join(p.name if p.kind != p.VAR_POSITIONAL else "*" + p.name for p in params
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL))
    return fewest, most, names


def step_usage(owner: str, loss_scaled: bool) -> str:
    """How the step cell is built with a network that returns the loss, for the messages."""
    return f"{owner}(nn.WithLossCell(net, loss_fn), optimizer{', scale_sense' if loss_scaled else ''})"


def step_checks(owner: str, network: nn.Cell, loss_scaled: bool, options: Any) -> tuple:
    """What :func:`check_step_inputs` and :func:`check_loss_output` need, as one tuple of plain
    values (constants to GRAPH mode): ``(owner, usage, fewest, most, names, require_scalar_loss)``;
    ``options``: the cell's :class:`~gradmon.cells.options.StepOptions`."""
    usage = step_usage(owner, loss_scaled)
    return (owner, usage, *construct_inputs(network), bool(options.require_scalar_loss))


def check_step_inputs(count, checks):
    """``TypeError`` when the step got ``count`` inputs (under ``Model.train``: one per dataset
    column) that the network's ``construct`` does not take; ``checks``: :func:`step_checks`."""
    owner, usage, fewest, most, names = checks[0], checks[1], checks[2], checks[3], checks[4]
    if count > most >= 0:
        raise TypeError(owner + ": the network's construct(" + names + ") takes " + str(most)
                        + (" input" if most == 1 else " inputs") + ", but the step got " + str(count)
                        + " (under Model.train: one per dataset column). A network without its loss? "
                        "Give the step cell the network with its loss, whose construct takes (data, label): "
                        + usage + "; or make the dataset yield only the columns construct takes")
    if count < fewest:
        raise TypeError(owner + ": the network's construct(" + names + ") needs " + str(fewest)
                        + (" input" if fewest == 1 else " inputs") + ", but the step got " + str(count)
                        + " (under Model.train: one per dataset column). Give the step (or the dataset) "
                        "every input construct takes")


def check_loss_output(outputs, checks):
    """``outputs`` when its first element (or itself) is a float scalar loss Tensor; else a
    ``TypeError`` / ``ValueError`` naming ``nn.WithLossCell``. A first output that is no Tensor at
    all is left to :func:`gradmon.cells.layouts.split_network_outputs`, which refuses it. Shape
    ``(1,)`` counts as scalar; a dynamic shape is left to run. With ``require_scalar_loss=False``
    (in ``checks``, :func:`step_checks`) any float tensor passes (``nn.TrainOneStepCell``'s
    behaviour: the gradients are of ``sum(output * sens)``)."""
    owner, usage, require_scalar = checks[0], checks[1], checks[5]
    first = outputs
    if isinstance(outputs, (tuple, list)):
        if not outputs:
            return outputs  # layouts.split_network_outputs says what to return instead
        first = outputs[0]
    if not isinstance(first, Tensor):
        return outputs  # a nested tuple, a dict: layouts.split_network_outputs says what to return
    if first.dtype not in _FLOAT_TYPES:
        raise TypeError(owner + ": the network's first output must be the loss, a float scalar, but its "
                        "dtype is " + str(first.dtype) + " (labels? class ids?); return the loss: " + usage)
    shape = first.shape
    known = -1 not in shape and -2 not in shape
    if require_scalar and known and len(shape) > 0 and not all(d == 1 for d in shape):
        raise ValueError(owner + ": the network's first output must be the loss, a scalar, but it has shape "
                         + str(shape) + " (logits? a network without its loss function). Give the step cell "
                         "the network with its loss: " + usage + ". A network returning (loss, *extra) is "
                         "fine too; require_scalar_loss=False trains on sum(output), as "
                         "nn.TrainOneStepCell does")
    return outputs
