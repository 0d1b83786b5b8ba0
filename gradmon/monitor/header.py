"""The run-log ``header`` of a MindSpore run (docs/format.md): what the monitor knows about the
run when a segment starts — versions, execution and parallel mode, world, the step cell's
settings, the epoch length and where the step numbering resumes.

:func:`gradmon.monitor.writer.header_record` adds the fields every header has (schema, run id, host...).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import Any

import mindspore as ms

__all__ = ["cell_config", "context_pipeline_stages", "distributed", "header_fields", "parallel_info"]

_log = logging.getLogger("gradmon.monitor.callback")


def distributed() -> tuple[int, int]:
    """``(rank, world_size)`` when MindSpore communication is initialised, else ``(0, 1)``."""
    try:
        from mindspore.communication._comm_helper import GlobalComm

        if not GlobalComm.INITED:
            return 0, 1
        from mindspore.communication import get_group_size, get_rank

        return int(get_rank()), int(get_group_size())
    except Exception:
        return 0, 1


def context_pipeline_stages() -> int:
    """The pipeline stages of MindSpore's auto-parallel context (1 when unreadable)."""
    try:
        return max(int(ms.get_auto_parallel_context("pipeline_stages")), 1)
    except Exception as exc:
        _log.debug("gradmon: pipeline_stages not readable: %s", exc)
        return 1


def parallel_info(world_size: int) -> dict[str, Any]:
    """``parallel_mode`` (MindSpore's auto-parallel context: ``stand_alone``, ``data_parallel``,
    ``semi_auto_parallel``, ...) and ``device_num`` (the context's when the user set it, else the
    world size)."""
    info: dict[str, Any] = {"device_num": int(world_size)}
    try:
        info["parallel_mode"] = str(ms.get_auto_parallel_context("parallel_mode"))
        from mindspore.parallel._auto_parallel_context import auto_parallel_context

        if auto_parallel_context().get_device_num_is_set():
            info["device_num"] = int(ms.get_auto_parallel_context("device_num"))
    except Exception as exc:  # a private API moved: the world size stands in
        _log.debug("gradmon: auto-parallel context not readable: %s", exc)
    return info


def cell_config(cell: Any) -> dict[str, Any]:
    """What the step cell's ``gradmon_config()`` returns (``{}`` when it has none or it fails)."""
    get_cfg = getattr(cell, "gradmon_config", None)
    if not callable(get_cfg):
        return {}
    try:
        return dict(get_cfg())
    except Exception as exc:
        _log.warning("gradmon: gradmon_config() failed: %s", exc)
        return {}


def header_fields(
    *,
    cell: Any,
    config: Mapping[str, Any],
    log_interval: int,
    rank: int,
    world_size: int,
    batch_size: int | None,
    steps_per_epoch: int | None,
    steps_per_epoch_unknown: str | None,
    initial_step: int,
    initial_step_from: str,
    alarm_rule: Mapping[str, Any] | None = None,
    recovery: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The fields of a segment's header (see docs/format.md for each). ``alarm_rule``: the
    settings of the alarm rule the writer runs (None: it runs none); ``recovery``: automatic
    recovery's settings (None: off)."""
    from gradmon import __version__

    cell_cfg = cell_config(cell)
    header: dict[str, Any] = {
        "versions": {"gradmon": __version__, "mindspore": ms.__version__, "python": sys.version.split()[0]},
        "mode": "GRAPH" if ms.get_context("mode") == ms.GRAPH_MODE else "PYNATIVE",
        "device": ms.get_context("device_target"),
        "world_size": int(world_size),
        "rank": int(rank),
        **parallel_info(world_size),
        "config": dict(config),
        "max_norm": cell_cfg.get("max_norm"),
        "spike_mode": cell_cfg.get("spike_mode"),
        "log_interval": int(log_interval),
        "initial_step": int(initial_step),
        "initial_step_from": initial_step_from,
    }
    if "norm_strategy" in cell_cfg:
        header["norm_strategy"] = cell_cfg["norm_strategy"]
    if cell_cfg:
        header["cell_config"] = cell_cfg
    if batch_size is not None:
        header["batch_size"] = int(batch_size)
    if steps_per_epoch:
        header["steps_per_epoch"] = int(steps_per_epoch)
    elif steps_per_epoch_unknown:
        header["steps_per_epoch_unknown"] = steps_per_epoch_unknown
    if alarm_rule is not None:
        header["alarm_rule"] = dict(alarm_rule)
    if recovery is not None:
        header["recovery"] = dict(recovery)
    return header
