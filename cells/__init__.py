"""MindSpore cells and graph-safe ops of gradmon, installed as ``gradmon.cells``.

``MonitoredTrainStep`` / ``MonitoredTrainStepWithLossScale`` are drop-in ``nn.TrainOneStepCell``
replacements returning ``(loss, grad_norm)`` and keeping a device-side step history;
``global_norm`` / ``clip_by_global_norm`` are the graph-safe functional twins (HyperParallel
DTensor parameters: ``layout=DTensorLayout.from_params(params)``). Supported:
MindSpore 2.7 or later, 2.7 to 2.10 tested (checked by feature, see ``UnsupportedMindSporeError``).
"""

from __future__ import annotations

from ._compat import SUPPORTED_RANGE, UnsupportedMindSporeError
from .dtensor_layout import DTensorLayout
from .history import HistorySnapshot
from .norm_ops import clip_by_global_norm, global_norm
from .spike import SPIKE_MODES, SpikeConfig
from .train_step import MonitoredTrainStep, MonitoredTrainStepWithLossScale

__all__ = [
    "SPIKE_MODES",
    "SUPPORTED_RANGE",
    "DTensorLayout",
    "HistorySnapshot",
    "MonitoredTrainStep",
    "MonitoredTrainStepWithLossScale",
    "SpikeConfig",
    "UnsupportedMindSporeError",
    "clip_by_global_norm",
    "global_norm",
]
