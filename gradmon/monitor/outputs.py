"""Parsing a training step's outputs (``cb_params.net_outputs``) into loss, norm and flags.

Pure host logic, no MindSpore import: a MindSpore ``Tensor`` is read through its ``asnumpy()``.
Each tensor is read once, so calling :func:`parse_step_outputs` is the one device sync of a log
step for a plain train cell.

Recognised shapes (``loss`` always first):

- a scalar: a Tensor, numpy array or Python number (a multi-element loss is averaged);
- a tuple or list ``(loss, ...)``. After the loss, a number before any **boolean** element is the
  gradient norm (``(loss, grad_norm)``: gradmon's ``MonitoredTrainStep``). The first boolean is the
  loss-scale overflow flag, and the elements after it are, by position, the loss scale, the learning
  rate and the global gradient norm when no norm came before the flag (gradmon's loss-scale cell
  returns ``(loss, grad_norm, overflow, scale, *network extras)``: after the flag only the scale is
  read). MindSpore's ``nn.TrainOneStepWithLossScaleCell`` returns
  ``(loss, overflow, scale)``; mindformers' ``MFTrainOneStepCell`` and ``MFPipelineWithLossScaleCell``
  (1.3 to 2.1 on PyPI) return ``(loss, overflow, scale, lr, global_norm)``, or that plus
  ``(local_norm, size)`` with ``local_norm=True`` (ignored), with ``global_norm`` None unless
  ``use_clip_grad``; gradmon's cells with ``output_layout="mindformers"`` return the same five.
  A 4-tuple ``(loss, overflow, scale, lr)`` is read as mindformers' ``MFLossMonitor`` reads it.
  An element that is None or not a number (e.g. per-group learning rates) is not reported;
- a mapping with ``loss``, ``grad_norm``, ``overflow``, ``loss_scale``, ``lr``; other scalar
  entries become user metrics.

:meth:`StepOutputs.record_fields` turns what was parsed into step-record fields (docs/format.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gradmon.logformat.values import number

__all__ = ["StepOutputs", "parse_step_outputs", "to_float", "to_host"]


@dataclass
class StepOutputs:
    """What a step's outputs said. ``None`` = not reported."""

    loss: float | None = None
    grad_norm: float | None = None
    overflow: bool | None = None
    loss_scale: float | None = None
    lr: float | None = None
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def nonfinite(self) -> bool:
        """Loss or norm is NaN/inf."""
        return any(v is not None and not math.isfinite(v) for v in (self.loss, self.grad_norm))

    def record_fields(self) -> dict[str, Any]:
        """The step-record fields these outputs give: the values reported, ``skipped`` when the
        loss-scale cell dropped the update (overflow), ``nonfinite``, then the user metrics."""
        fields: dict[str, Any] = {}
        for name in ("loss", "grad_norm", "loss_scale", "lr"):
            value = getattr(self, name)
            if value is not None:
                fields[name] = value
        if self.overflow:
            fields["skipped"] = True
        if self.nonfinite:
            fields["nonfinite"] = True
        fields.update(self.extra)
        return fields


def to_host(value: Any) -> Any:
    """A device tensor as a numpy array (one device→host copy); anything else unchanged."""
    asnumpy = getattr(value, "asnumpy", None)
    if callable(asnumpy):
        return asnumpy()
    return value


def _is_bool(value: Any) -> bool:
    """Whether ``value`` is a boolean flag: Python bool, numpy bool, or a bool-typed tensor/array."""
    if isinstance(value, bool):
        return True
    dtype = getattr(value, "dtype", None)
    if dtype is None:
        return False
    # numpy dtype has .kind; MindSpore dtype prints as "Bool".
    kind = getattr(dtype, "kind", None)
    if kind is not None:
        return kind == "b"
    return str(dtype).lower() in ("bool", "bool_")


def to_float(value: Any) -> float | None:
    """A host value (number, numpy scalar/array) as one float; multi-element arrays are averaged,
    booleans become 0.0/1.0, an integer too big for a float is ``inf`` or ``-inf``; ``None`` for
    what is not numeric or is empty (never an exception: this runs in the training loop)."""
    value = to_host(value)
    if value is None or isinstance(value, str):
        return None
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return number(value)  # (an integer too big for a float: inf, as every log reader reads it)
    size = getattr(value, "size", None)
    if size is not None:
        if size == 0:
            return None
        try:
            if size == 1:
                return float(value.reshape(-1)[0])
            return float(value.astype("float64").mean())
        except (TypeError, ValueError, AttributeError, OverflowError):
            return None
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return None


def _to_bool(value: Any) -> bool | None:
    value = to_host(value)
    try:
        any_ = getattr(value, "any", None)
        return bool(any_()) if callable(any_) else bool(value)
    except (TypeError, ValueError):
        return None


def parse_step_outputs(outputs: Any) -> StepOutputs:
    """Parse ``cb_params.net_outputs`` of any shape listed in the module docstring."""
    if outputs is None:
        return StepOutputs()
    if isinstance(outputs, Mapping):
        return _parse_mapping(outputs)
    if isinstance(outputs, (tuple, list)):
        return _parse_sequence(outputs)
    return StepOutputs(loss=to_float(outputs))


def _parse_sequence(outputs: tuple[Any, ...] | list[Any]) -> StepOutputs:
    if not outputs:
        return StepOutputs()
    first = outputs[0]
    # A network with several outputs nested as the first element: its first one is the loss.
    result = _parse_sequence(first) if isinstance(first, (tuple, list)) else StepOutputs(loss=to_float(first))
    rest = outputs[1:]
    flag = next((i for i, item in enumerate(rest) if _is_bool(item)), len(rest))
    if result.grad_norm is None:
        result.grad_norm = next((n for n in map(to_float, rest[:flag]) if n is not None), None)
    if flag == len(rest):
        return result
    result.overflow = _to_bool(rest[flag])
    scale, lr, norm = (*rest[flag + 1 : flag + 4], None, None, None)[:3]
    result.loss_scale = to_float(scale)
    if result.grad_norm is None:
        # mindformers' layout: the rate and the norm follow the scale. With a norm before the flag
        # (gradmon's (loss, grad_norm, overflow, scale, *network extras)) what follows is the network's.
        result.lr = to_float(lr)
        result.grad_norm = to_float(norm)
    return result


def _parse_mapping(outputs: Mapping[str, Any]) -> StepOutputs:
    result = StepOutputs()
    for key, value in outputs.items():
        if key == "loss":
            result.loss = to_float(value)
        elif key == "grad_norm":
            result.grad_norm = to_float(value)
        elif key == "overflow":
            result.overflow = _to_bool(value)
        elif key == "loss_scale":
            result.loss_scale = to_float(value)
        elif key == "lr":
            result.lr = to_float(value)
        else:
            number = to_float(value)
            if number is not None:
                result.extra[str(key)] = number
    return result
