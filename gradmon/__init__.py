"""gradmon: gradient-norm instrumented training steps and a live training monitor for MindSpore.

Importing :mod:`gradmon` does not import MindSpore. The training-side names are resolved on
first use, so the server (``gradmon serve``) starts fast and runs where MindSpore is absent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "LiveMonitor",
    "LossRise",
    "MonitoredTrainStep",
    "MonitoredTrainStepWithLossScale",
    "Recovery",
    "__version__",
    "clip_by_global_norm",
    "global_norm",
]

# name -> module that defines it; imported on first attribute access (PEP 562).
_LAZY = {
    "MonitoredTrainStep": "gradmon.cells",
    "MonitoredTrainStepWithLossScale": "gradmon.cells",
    "global_norm": "gradmon.cells",
    "clip_by_global_norm": "gradmon.cells",
    "LiveMonitor": "gradmon.monitor.callback",
    "Recovery": "gradmon.monitor.recovery",
    "LossRise": "gradmon.monitor.recovery",
}

if TYPE_CHECKING:  # pragma: no cover
    from gradmon.cells import (
        MonitoredTrainStep,
        MonitoredTrainStepWithLossScale,
        clip_by_global_norm,
        global_norm,
    )
    from gradmon.monitor.callback import LiveMonitor
    from gradmon.monitor.recovery import LossRise, Recovery


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'gradmon' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
