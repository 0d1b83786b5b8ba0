"""gradmon in mindformers' registry: the step cell as a ``runner_wrapper``, LiveMonitor as a callback.

Importing this module registers, in ``MindFormerRegister``:

- ``GradmonTrainStep`` (wrapper): gradmon's ``MonitoredTrainStep`` as mindformers' Trainer builds
  it (``network``, ``optimizer`` and the Trainer's arguments, sorted by
  :func:`~gradmon.integrations.mindformers_options.wrapper_options`);
- ``GradmonTrainStepWithLossScale`` (wrapper): ``MonitoredTrainStepWithLossScale``, ``scale_sense``
  a number or a loss-scale cell (``{type: DynamicLossScaleUpdateCell, ...}``);
- ``LiveMonitor`` (callback): :class:`MindFormersLiveMonitor`, :class:`gradmon.LiveMonitor` writing
  under mindformers' ``output_dir`` (``<output_dir>/gradmon/metrics.jsonl`` by default);

so a YAML config can say::

    runner_wrapper: {type: GradmonTrainStep, max_norm: 1.0, spike_mode: clip}
    callbacks: [{type: MFLossMonitor}, {type: LiveMonitor}]

Both wrappers return mindformers' tuple ``(loss, overflow, scale, lr, grad_norm)`` by default, so
``MFLossMonitor`` prints the norm and ``TrainingStateMonitor``'s global-norm checks work. mindformers
is optional for gradmon: only this module imports it. See docs/mindformers.md.
"""

from __future__ import annotations

from typing import Any

import mindspore as ms
from mindspore import Tensor, nn

try:
    from mindformers.core.context import is_legacy_model
    from mindformers.tools.register import MindFormerModuleType, MindFormerRegister
    from mindformers.tools.utils import get_output_root_path
except ImportError as exc:  # pragma: no cover - exercised only without mindformers
    raise ImportError("gradmon.integrations.mindformers needs mindformers (pip install mindformers --no-deps "
                      f"and its requirements, see docs/mindformers.md): {exc}") from exc

from gradmon.cells import MonitoredTrainStep, MonitoredTrainStepWithLossScale
from gradmon.monitor.callback import LiveMonitor

from .mindformers_options import DEFAULT_LOG_FILE, log_file_under, wrapper_options

__all__ = ["GradmonTrainStep", "GradmonTrainStepWithLossScale", "MindFormersLiveMonitor", "register"]


def _require_legacy_model(owner: str) -> None:
    # mindformers' new (mcore) models return (lm_loss, mtp_loss, aux_loss) and need their sum as the loss.
    if not is_legacy_model():
        raise ValueError(f"{owner} supports mindformers' legacy models (use_legacy: True); mcore models "
                         "return several losses, use mindformers' MFTrainOneStepCell for them")


class GradmonTrainStep(MonitoredTrainStep):
    """``MonitoredTrainStep`` as a mindformers ``runner_wrapper`` (built by ``Trainer`` from YAML).

    Takes gradmon's options (``max_norm``, ``spike_mode``, ``history_size``, ...) and mindformers'
    ``use_clip_grad`` / ``max_grad_norm``; the Trainer's own arguments are accepted and checked.
    Outputs ``(loss, overflow, scale, lr, grad_norm)`` unless ``output_layout: gradmon``.
    """

    def __init__(self, network: nn.Cell, optimizer: nn.Cell, sens: float | None = None,
                 **arguments: Any) -> None:
        owner = type(self).__name__
        options, _ = wrapper_options(owner, arguments, loss_scale=False)
        _require_legacy_model(owner)
        super().__init__(network, optimizer, sens=sens, **options)


class GradmonTrainStepWithLossScale(MonitoredTrainStepWithLossScale):
    """``MonitoredTrainStepWithLossScale`` as a mindformers ``runner_wrapper``.

    ``scale_sense``: a number (a fixed scale) or the loss-scale cell mindformers builds from YAML.
    """

    def __init__(self, network: nn.Cell, optimizer: nn.Cell, **arguments: Any) -> None:
        owner = type(self).__name__
        options, scale_sense = wrapper_options(owner, arguments, loss_scale=True)
        _require_legacy_model(owner)
        if not isinstance(scale_sense, (nn.Cell, Tensor)):
            scale_sense = Tensor(scale_sense, ms.float32)
        elif isinstance(scale_sense, Tensor) and scale_sense.dtype != ms.float32:
            scale_sense = scale_sense.astype(ms.float32)  # build_wrapper makes an int scale an int Tensor
        super().__init__(network, optimizer, scale_sense, **options)


class MindFormersLiveMonitor(LiveMonitor):
    """:class:`gradmon.LiveMonitor` as a mindformers callback (registered as ``LiveMonitor``).

    ``log_file`` (default ``gradmon/metrics.jsonl``) is relative to mindformers' output directory
    (``output_dir``, as ``set_output_path`` set it before the Trainer builds its callbacks); the other
    arguments are LiveMonitor's.
    """

    def __init__(self, log_file: str = DEFAULT_LOG_FILE, log_interval: int = 1, **options: Any) -> None:
        super().__init__(log_file_under(get_output_root_path(), log_file), log_interval, **options)


def register() -> None:
    """Register the wrappers and the callback in ``MindFormerRegister`` (again: same classes, no harm)."""
    for wrapper in (GradmonTrainStep, GradmonTrainStepWithLossScale):
        MindFormerRegister.register_cls(wrapper, module_type=MindFormerModuleType.WRAPPER)
    MindFormerRegister.register_cls(MindFormersLiveMonitor, module_type=MindFormerModuleType.CALLBACK,
                                    alias="LiveMonitor")


register()
