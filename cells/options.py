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

from .norm_plan import NORM_STRATEGIES
from .spike import SpikeConfig

__all__ = ["StepOptions"]


def _is_number(value: Any) -> bool:
    # numpy registers its scalar types with the numbers ABCs; bool (and numpy's bool_) are not numbers here.
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and type(value).__name__ != "bool_"


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and _is_number(value)


def _flag(name: str, value: Any) -> bool:
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {value!r}")


@dataclass(frozen=True)
class StepOptions:
    """Keyword options of the monitored step cells (see :class:`MonitoredTrainStep` for each).

    Construction validates and normalises: numbers become Python ``float``/``int``, a bad value
    raises ``TypeError``/``ValueError`` naming the option and what it accepts.
    """

    max_norm: float | None = None
    skip_nonfinite: bool = True
    spike_mode: str = "off"
    spike_warmup: int = 25
    spike_alpha: float = 0.97
    spike_z: float = 2.5
    history_size: int = 1024
    local_norm: bool = False
    layer_stats: bool = False
    norm_strategy: str = "auto"
    shard_group: str | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise in place once, here
        if self.max_norm is not None:
            if not _is_number(self.max_norm):
                raise TypeError("max_norm must be a positive number or None, "
                                f"got {type(self.max_norm).__name__}")
            if not (math.isfinite(self.max_norm) and self.max_norm > 0):
                raise ValueError(f"max_norm must be a positive finite number or None, got {self.max_norm!r}")
            set_(self, "max_norm", float(self.max_norm))
        if not _is_int(self.history_size) or self.history_size < 0:
            raise ValueError("history_size must be an int >= 0 (0 disables the ring), "
                             f"got {self.history_size!r}")
        set_(self, "history_size", int(self.history_size))
        for name in ("skip_nonfinite", "local_norm", "layer_stats"):
            set_(self, name, _flag(name, getattr(self, name)))
        if self.norm_strategy not in NORM_STRATEGIES:
            raise ValueError(f"norm_strategy must be one of {NORM_STRATEGIES}, got {self.norm_strategy!r}")
        if self.shard_group is not None and not (isinstance(self.shard_group, str) and self.shard_group):
            raise TypeError("shard_group must be the name of a communication group (a non-empty str) "
                            f"or None, got {self.shard_group!r}")
        if _is_int(self.spike_warmup):
            set_(self, "spike_warmup", int(self.spike_warmup))
        for name in ("spike_alpha", "spike_z"):
            value = getattr(self, name)
            if not _is_number(value):
                raise TypeError(f"{name} must be a number, got {type(value).__name__}")
            set_(self, name, float(value))
        self.spike  # noqa: B018 - SpikeConfig validates the detector settings

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
                           z_threshold=self.spike_z)

    def as_dict(self) -> dict[str, Any]:
        """Every option by name (for ``gradmon_config()``)."""
        return asdict(self)
