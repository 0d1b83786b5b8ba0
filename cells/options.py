"""The options of the monitored step cells, validated and defaulted in one place.

``MonitoredTrainStep`` and ``MonitoredTrainStepWithLossScale`` take these as keyword arguments
and hold them as ``cell.options``; ``gradmon_config()`` reports them. Numbers may be Python or
numpy scalars (``np.float32(1.0)`` is a fine ``max_norm``). Pure Python: no MindSpore import.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, fields
from typing import Any

from .layouts import OUTPUT_LAYOUTS
from .norm_plan import NORM_STRATEGIES
from .spike import SpikeConfig

__all__ = ["StepOptions", "check_stock_arguments"]


def _is_number(value: Any) -> bool:
    # numpy registers its scalar types with the numbers ABCs; bool (and numpy's bool_) are not numbers here.
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and type(value).__name__ != "bool_"


def _finite(value: Any) -> bool:
    """Whether a number is finite as a float (an integer too big for one is not: float() raises)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and _is_number(value)


def _flag(name: str, value: Any) -> bool:
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {value!r}")


@dataclass(frozen=True)
class StepOptions:
    """Keyword options of the monitored step cells.

    Construction validates and normalises: numbers become Python ``float``/``int``, a bad value
    raises ``TypeError``/``ValueError`` naming the option and what it accepts.

    - ``max_norm``: clip the global norm to this value (``grads * min(1, max_norm / (norm + 1e-6))``).
    - ``skip_nonfinite``: when the norm is NaN/Inf, do not run the optimizer this step.
    - ``spike_mode``: ``"off"``, ``"detect"``, ``"clip"`` or ``"skip"`` (see :class:`SpikeConfig`);
      ``spike_warmup``, ``spike_alpha``, ``spike_z``, ``spike_early_window``, ``spike_early_min_ratio``,
      ``spike_early_max_ratio``, ``spike_floor``, ``spike_loss_window``, ``spike_loss_ratio``,
      ``spike_loss_floor``, ``spike_lr_ratio``: detector settings (defaults in :class:`SpikeConfig`;
      ``spike_loss_window=0`` turns the detector's loss test off, ``spike_lr_ratio=0`` its
      learning-rate test).
    - ``history_size``: rows of the device history ring (0 disables it and its counters).
    - ``local_norm``: also record each rank's own norm (before the data-parallel reduction, without
      the other ranks' slices of sharded parameters).
    - ``layer_stats``: keep the last step's per-parameter squared gradient norms on device for
      ``gradmon_layer_stats``.
    - ``forensics``: keep the last this many steps' per-layer gradient norms (and, under data
      parallel, each rank's own norm) on device, for the alarm events' forensics (0: off, no cost;
      see :mod:`gradmon.cells.forensics`).
    - ``forensics_ids``: the step's last input is a vector of this many sample ids (the dataset's
      index column, per rank; with ``grad_accum_steps=N`` each micro-batch's), kept with the forensics
      and not passed to the network (0: none).
    - ``output_layout``: what the cells return, ``"gradmon"`` or ``"mindformers"`` (see
      :mod:`gradmon.cells.layouts`).
    - ``norm_strategy``: how the norm is computed: ``"auto"`` (default), ``"flat"``, ``"bucketed"``,
      ``"per_tensor"`` or ``"fused"`` (see :mod:`gradmon.cells.norm_plan`).
    - ``shard_group``: the communication group that parameters marked ``layerwise_parallel=True``
      (hand-sharded) are split across; required when there are such parameters.
    - ``grad_accum_steps``: micro-batches per optimizer step (1: no accumulation). The gradients of
      ``N`` calls are summed on device and their mean is reduced, measured, clipped and applied on
      the ``N``-th call (see "Gradient accumulation" in docs/cells.md).
    - ``require_scalar_loss``: the network's first output must be a scalar loss (shape ``()`` or
      ``(1,)``), checked at the first call: a network without its loss (logits) raises, naming
      ``nn.WithLossCell``. False: accept any float output as ``nn.TrainOneStepCell`` does (the
      gradients are then of ``sum(output * sens)`` and the history's ``loss`` is its mean).
    """

    max_norm: float | None = None
    skip_nonfinite: bool = True
    spike_mode: str = "off"
    spike_warmup: int = SpikeConfig.warmup  # the detector's defaults live in SpikeConfig
    spike_alpha: float = SpikeConfig.alpha
    spike_z: float = SpikeConfig.z_threshold
    spike_early_window: int = SpikeConfig.early_window
    spike_early_min_ratio: float = SpikeConfig.early_min_ratio
    spike_early_max_ratio: float = SpikeConfig.early_max_ratio
    spike_floor: float = SpikeConfig.floor
    spike_loss_window: int = SpikeConfig.loss_window
    spike_loss_ratio: float = SpikeConfig.loss_ratio
    spike_loss_floor: float = SpikeConfig.loss_floor
    spike_lr_ratio: float = SpikeConfig.lr_ratio
    history_size: int = 1024
    local_norm: bool = False
    layer_stats: bool = False
    forensics: int = 0
    forensics_ids: int = 0
    output_layout: str = "gradmon"
    norm_strategy: str = "auto"
    shard_group: str | None = None
    grad_accum_steps: int = 1
    require_scalar_loss: bool = True

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise in place once, here
        if self.max_norm is not None:
            if not _is_number(self.max_norm):
                raise TypeError("max_norm must be a positive number or None, "
                                f"got {type(self.max_norm).__name__}")
            if not (_finite(self.max_norm) and self.max_norm > 0):
                raise ValueError(f"max_norm must be a positive finite number or None, got {self.max_norm!r}")
            set_(self, "max_norm", float(self.max_norm))
        if not _is_int(self.history_size) or self.history_size < 0:
            raise ValueError("history_size must be an int >= 0 (0 disables the ring), "
                             f"got {self.history_size!r}")
        set_(self, "history_size", int(self.history_size))
        if not _is_int(self.grad_accum_steps) or self.grad_accum_steps < 1:
            raise ValueError("grad_accum_steps must be an int >= 1 (micro-batches per optimizer step; "
                             f"1 accumulates nothing), got {self.grad_accum_steps!r}")
        set_(self, "grad_accum_steps", int(self.grad_accum_steps))
        for name in ("forensics", "forensics_ids"):
            value = getattr(self, name)
            if not _is_int(value) or value < 0:
                raise ValueError(f"{name} must be an int >= 0 (0: off), got {value!r}")
            set_(self, name, int(value))
        if self.forensics_ids and not self.forensics:
            raise ValueError("forensics_ids needs forensics=K > 0 (the steps whose sample ids are kept)")
        for name in ("skip_nonfinite", "local_norm", "layer_stats", "require_scalar_loss"):
            set_(self, name, _flag(name, getattr(self, name)))
        if self.norm_strategy not in NORM_STRATEGIES:
            raise ValueError(f"norm_strategy must be one of {NORM_STRATEGIES}, got {self.norm_strategy!r}")
        if self.shard_group is not None and not (isinstance(self.shard_group, str) and self.shard_group):
            raise TypeError("shard_group must be the name of a communication group (a non-empty str) "
                            f"or None, got {self.shard_group!r}")
        for name in ("spike_warmup", "spike_early_window", "spike_loss_window"):
            if _is_int(getattr(self, name)):
                set_(self, name, int(getattr(self, name)))
        for name in ("spike_alpha", "spike_z", "spike_early_min_ratio", "spike_early_max_ratio",
                     "spike_floor", "spike_loss_ratio", "spike_loss_floor", "spike_lr_ratio"):
            value = getattr(self, name)
            if not _is_number(value):
                raise TypeError(f"{name} must be a number, got {type(value).__name__}")
            if isinstance(value, numbers.Integral) and not _finite(value):
                raise ValueError(f"{name} must be a number, got an integer too big for a float")
            set_(self, name, float(value))
        self.spike  # noqa: B018 - SpikeConfig validates the detector settings
        if self.output_layout not in OUTPUT_LAYOUTS:
            raise ValueError(f"output_layout must be one of {OUTPUT_LAYOUTS}, got {self.output_layout!r}")

    @classmethod
    def from_kwargs(cls, owner: str, **options: Any) -> StepOptions:
        """Options from keyword arguments; an unknown name raises ``TypeError`` listing the known ones."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"{owner} got unexpected option(s) {', '.join(map(repr, unknown))}; "
                            f"known options: {', '.join(sorted(known))}")
        return cls(**options)

    @property
    def spike(self) -> SpikeConfig:
        """The spike-detector settings."""
        return SpikeConfig(mode=self.spike_mode, warmup=self.spike_warmup, alpha=self.spike_alpha,
                           z_threshold=self.spike_z, early_window=self.spike_early_window,
                           early_min_ratio=self.spike_early_min_ratio,
                           early_max_ratio=self.spike_early_max_ratio, floor=self.spike_floor,
                           loss_window=self.spike_loss_window, loss_ratio=self.spike_loss_ratio,
                           loss_floor=self.spike_loss_floor, lr_ratio=self.spike_lr_ratio)

    def as_dict(self) -> dict[str, Any]:
        """Every option by name (for ``gradmon_config()``)."""
        return asdict(self)


def check_stock_arguments(sens: Any, return_grad: Any, output_layout: str,
                          grad_accum_steps: int = 1) -> tuple[float | None, bool]:
    """``nn.TrainOneStepCell``'s own arguments, checked as its documentation states and normalised
    (numpy scalars become Python ones); ``(sens, return_grad)``."""
    if sens is not None:
        if not _is_number(sens):
            raise TypeError(f"sens must be a number (the backward seed) or None, got {type(sens).__name__}")
        if sens == 0:
            raise ValueError("sens can not be 0: it multiplies every gradient")
        sens = float(sens)
    return_grad = _flag("return_grad", return_grad)
    if return_grad and output_layout == "mindformers":
        raise ValueError("return_grad=True does not fit output_layout='mindformers' (mindformers' step cells "
                         "return no gradients); use the default layout to get (loss, grad_norm, grads)")
    if return_grad and grad_accum_steps > 1:
        raise ValueError("return_grad=True does not fit grad_accum_steps > 1: a micro-step has no reduced "
                         "gradients to return")
    return sens, return_grad
