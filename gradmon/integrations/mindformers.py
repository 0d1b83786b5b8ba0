"""gradmon in mindformers' registry: the step cell as a ``runner_wrapper``, LiveMonitor as a callback.

Importing this module registers, in ``MindFormerRegister``:

- ``GradmonTrainStep`` (wrapper): gradmon's ``MonitoredTrainStep`` as mindformers' Trainer builds
  it (``network``, ``optimizer`` and the Trainer's arguments, sorted by
  :func:`~gradmon.integrations.mindformers_options.wrapper_options`);
- ``GradmonTrainStepWithLossScale`` (wrapper): ``MonitoredTrainStepWithLossScale``, ``scale_sense``
  a number or a loss-scale cell (``{type: DynamicLossScaleUpdateCell, ...}``);
- ``LiveMonitor`` (callback): :class:`MindFormersLiveMonitor`, :class:`gradmon.LiveMonitor` writing
  under mindformers' ``output_dir`` (``<output_dir>/gradmon/metrics.jsonl`` by default). mindformers
  has one callback registry for both its trainers, and this class works under both: the legacy
  static-graph ``Trainer`` (MindSpore ``Callback`` hooks) and the 2.x PyNative ``Trainer``
  (``TrainerCallback`` hooks; see :mod:`gradmon.integrations.trainer_callback`);

so a YAML config can say::

    runner_wrapper: {type: GradmonTrainStep, max_norm: 1.0, spike_mode: clip}
    callbacks: [{type: MFLossMonitor}, {type: LiveMonitor}]

Under the PyNative trainer (mindformers 2.x) ``runner_wrapper`` is ignored (a warning says so); its
own ``training.max_norm`` / ``use_skip_step_on_nan`` clip and skip, and :data:`GradmonTrainer` (the
PyNative ``Trainer`` with :class:`~gradmon.integrations.trainer_defence.SpikeDefence`, built when
first imported: it needs the PyNative Trainer to import) adds gradmon's spike rule.

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

try:  # mindformers 2.x: the PyNative trainer's callback protocol (absent from 1.x)
    from mindformers.pynative.callback import TrainerCallback
except ImportError:  # pragma: no cover - mindformers 1.x
    TrainerCallback = object  # type: ignore[assignment,misc]

from gradmon.cells import MonitoredTrainStep, MonitoredTrainStepWithLossScale

from .mindformers_options import DEFAULT_LOG_FILE, log_file_under, wrapper_options
from .trainer_callback import TrainerLiveMonitor

# GradmonTrainer (module __getattr__) is left out: star-importing it would import the PyNative Trainer.
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


class MindFormersLiveMonitor(TrainerLiveMonitor, TrainerCallback):  # type: ignore[misc,valid-type]
    """:class:`gradmon.LiveMonitor` as a mindformers callback (registered as ``LiveMonitor``), for the
    legacy static-graph Trainer and the 2.x PyNative Trainer alike (``Trainer(callbacks=[...])`` too).

    ``log_file`` (default ``gradmon/metrics.jsonl``) is relative to mindformers' output directory
    (``output_dir``, as ``set_output_path`` set it before the Trainer builds its callbacks); the other
    arguments are LiveMonitor's.
    """

    def __init__(self, log_file: str = DEFAULT_LOG_FILE, log_interval: int = 1, **options: Any) -> None:
        super().__init__(log_file_under(get_output_root_path(), log_file), log_interval, **options)


def _gradmon_trainer() -> type:
    """``GradmonTrainer``: mindformers' PyNative ``Trainer`` with gradmon's spike defence."""
    try:
        from mindformers.pynative.trainer.trainer import Trainer
    except ImportError as exc:
        raise ImportError(
            f"GradmonTrainer needs mindformers' PyNative Trainer (mindformers 2.x with hyper_parallel and "
            f"MindSpore 2.11), which does not import here: {exc}. The mixin "
            "gradmon.integrations.trainer_defence.SpikeDefence works with any subclass of it") from exc
    from .trainer_defence import SpikeDefence

    return type("GradmonTrainer", (SpikeDefence, Trainer), {
        "__module__": __name__,
        "__doc__": "mindformers' PyNative Trainer with gradmon's spike rule on its global norm "
                   "(gradmon.integrations.trainer_defence.SpikeDefence: spike_mode, spike_warmup, "
                   "spike_alpha, spike_z).",
    })


def __getattr__(name: str) -> Any:
    # GradmonTrainer is built on first use: importing the PyNative Trainer needs hyper_parallel.
    if name == "GradmonTrainer":
        cls = globals()["GradmonTrainer"] = _gradmon_trainer()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register() -> None:
    """Register the wrappers and the callback in ``MindFormerRegister`` (again: same classes, no harm)."""
    for wrapper in (GradmonTrainStep, GradmonTrainStepWithLossScale):
        MindFormerRegister.register_cls(wrapper, module_type=MindFormerModuleType.WRAPPER)
    MindFormerRegister.register_cls(MindFormersLiveMonitor, module_type=MindFormerModuleType.CALLBACK,
                                    alias="LiveMonitor")


register()
