"""From mindformers' ``runner_wrapper`` arguments to the keyword options of gradmon's step cells.

mindformers' ``Trainer`` builds the wrapper as ``type(**yaml_keys, **trainer_defaults)``: the YAML
section's keys plus arguments it passes to every wrapper (:data:`TRAINER_ARGUMENTS`). This module
sorts them, pure Python (no MindSpore, no mindformers import), so the rules are unit-tested without
either:

- gradmon's own options (``max_norm``, ``spike_mode``, ...; see ``gradmon.cells.StepOptions``) pass
  through, and unknown names are refused there with the list of known ones;
- mindformers' clipping switch ``use_clip_grad`` / ``max_grad_norm`` becomes ``max_norm``, so a
  ``MFTrainOneStepCell`` section works after changing only its ``type``;
- ``output_layout`` defaults to ``"mindformers"``: ``(loss, overflow, scale, lr, grad_norm)``, what
  ``MFLossMonitor`` and ``TrainingStateMonitor`` read;
- what gradmon's cells do not do is refused with what to use instead, never silently dropped.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Mapping
from typing import Any

__all__ = ["DEFAULT_LOG_FILE", "TRAINER_ARGUMENTS", "log_file_under", "wrapper_options"]

# LiveMonitor's log in a mindformers run, relative to mindformers' output_dir.
DEFAULT_LOG_FILE = os.path.join("gradmon", "metrics.jsonl")

# Passed by mindformers' Trainer (1.8's BaseTrainer.create_model_wrapper) to every runner_wrapper.
# ``parallel_config`` is removed by build_wrapper for wrappers that are not mindformers' own.
TRAINER_ARGUMENTS = frozenset({
    "parallel_config", "calculate_per_token_loss", "global_norm_spike_threshold", "print_separate_loss",
    "use_skip_data_by_global_norm", "lr_scheduler", "grouped_lr_scheduler",
})

# Accepted and ignored: the settings of features these arguments switch off, or that need no action.
_IGNORED = frozenset({
    "parallel_config",  # the parallel layout comes from MindSpore's context, as for any wrapper
    "global_norm_spike_threshold",  # read only with use_skip_data_by_global_norm (refused below)
    "print_separate_loss",  # separate losses exist only for mcore models (refused by the wrapper)
    "lr_scheduler",  # the cell reports the optimizer's own rate, which this scheduler drives
    "grouped_lr_scheduler",  # per-group rates: the cell reports the first group's
})


def _is_one(value: Any) -> bool:
    """Whether a ``scale_sense`` value is the number 1 (a Tensor is read through ``asnumpy``)."""
    asnumpy = getattr(value, "asnumpy", None)
    if callable(asnumpy):
        value = asnumpy()
    size = getattr(value, "size", None)
    if size is not None:
        if size != 1:
            return False
        value = value.reshape(-1)[0]
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and float(value) == 1.0


def wrapper_options(owner: str, arguments: Mapping[str, Any], loss_scale: bool) -> tuple[dict[str, Any], Any]:
    """``(options, scale_sense)`` for a gradmon step cell from a ``runner_wrapper``'s arguments.

    ``arguments`` are the keyword arguments mindformers passes besides ``network`` and ``optimizer``.
    ``options`` are the step cell's keyword options (``sens`` included when given); ``scale_sense``
    is the loss scale for the loss-scale cell (``loss_scale=True``; required there) and None for the
    plain cell, which accepts only a scale of 1. Raises ``ValueError`` for a feature of mindformers'
    wrappers that gradmon's cells do not have, naming what to use instead.
    """
    rest = dict(arguments)
    if rest.pop("calculate_per_token_loss", False):
        raise ValueError(f"{owner} does not support calculate_per_token_loss: True (a network returning "
                         "(numerator, denominator)); use mindformers' MFTrainOneStepCell for per-token loss")
    if rest.pop("use_skip_data_by_global_norm", False):
        raise ValueError(f"{owner} does not support use_skip_data_by_global_norm; gradmon skips spikes on "
                         "device: set spike_mode: skip (a z-score test) in runner_wrapper")
    if rest.pop("local_norm", False):
        raise ValueError(f"{owner} does not return mindformers' per-group local norms (local_norm: True); "
                         "use layer_stats: True with LiveMonitor's layer_stats_every for per-parameter norms")
    for name in _IGNORED:
        rest.pop(name, None)

    use_clip_grad = rest.pop("use_clip_grad", False)
    max_grad_norm = rest.pop("max_grad_norm", None)
    if use_clip_grad:
        if rest.get("max_norm") is not None:
            raise ValueError(f"{owner}: give either max_norm or use_clip_grad/max_grad_norm, not both")
        rest["max_norm"] = 1.0 if max_grad_norm is None else max_grad_norm

    scale_sense = rest.pop("scale_sense", None)
    if loss_scale:
        if scale_sense is None:
            raise ValueError(f"{owner} needs scale_sense: a number, or a loss-scale cell such as "
                             "{type: DynamicLossScaleUpdateCell, loss_scale_value: 65536, scale_factor: 2, "
                             "scale_window: 1000}")
    elif scale_sense is not None:
        if not _is_one(scale_sense):
            raise ValueError(f"{owner} does not scale the loss (scale_sense: {scale_sense!r}); use type: "
                             "GradmonTrainStepWithLossScale for loss scaling")
        scale_sense = None

    rest.setdefault("output_layout", "mindformers")
    return rest, scale_sense


def log_file_under(output_root: str, log_file: str | os.PathLike[str] = DEFAULT_LOG_FILE) -> str:
    """Where LiveMonitor writes in a mindformers run: a relative ``log_file`` is under mindformers'
    output directory (with its checkpoints and logs), whatever the working directory; an absolute
    one is kept."""
    path = os.path.expanduser(os.fspath(log_file))
    return path if os.path.isabs(path) else os.path.join(output_root, path)
