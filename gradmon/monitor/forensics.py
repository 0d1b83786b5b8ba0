"""The ``forensics`` of an ``alarm`` event: what the step cell kept of the alarm's step.

Called by :class:`gradmon.monitor.steplog.StepLogger` when the alarm rule opens an incident (once
per incident, never per step). The cell is duck-typed: ``gradmon_forensics(steps_back) -> dict |
None`` (:meth:`gradmon.cells.host_read.HostReadMixin.gradmon_forensics`: None when the cell keeps
none, ``{"missing": why}`` when the step has left its ring), so this is tested
without MindSpore. A failure is written into the event (``forensics.error``) and never stops training.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Callable

from gradmon.logformat.schema import FORENSICS_FIELD

_log = logging.getLogger("gradmon.monitor.callback")

__all__ = ["attach_forensics", "sample_id_lists"]


def sample_id_lists(ids: Any) -> list[list[int]]:
    """A hook's answer as lists of ids by rank: a flat sequence is one rank's (rank 0)."""
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    if not isinstance(ids, Sequence) or isinstance(ids, (str, bytes)):
        raise TypeError(f"sample_ids must return a sequence of ids, got {type(ids).__name__}")
    if ids and all(isinstance(i, Sequence) and not isinstance(i, (str, bytes)) for i in ids):
        return [[int(i) for i in rank] for rank in ids]
    return [[int(i) for i in ids]]


def attach_forensics(event: dict[str, Any], step: int, last_step: int,
                     read: Callable[[int], dict[str, Any] | None] | None,
                     sample_ids: Callable[[int], Any] | None, warn: bool = True) -> None:
    """Set ``event["forensics"]`` for the alarm at ``step`` when ``last_step`` is the last step run.

    ``read(steps_back)``: the cell's rings; ``sample_ids(step)``: the monitor's hook, used when the
    cell kept no ids. Nothing is set when neither has anything.
    """
    out: dict[str, Any] = {}
    steps_back = int(last_step) - int(step)
    try:
        if read is not None:
            kept = read(steps_back)
            if kept is not None:
                out.update(kept)
        if sample_ids is not None and "sample_ids" not in out:
            ids = sample_ids(step)
            if ids is not None:
                out["sample_ids"] = sample_id_lists(ids)
    except Exception as exc:  # monitoring must not stop training
        if warn:
            _log.warning("gradmon: reading the forensics of step %s failed: %s: %s", step,
                         type(exc).__name__, exc)
        out["error"] = f"{type(exc).__name__}: {exc}"
    if out:
        event[FORENSICS_FIELD] = {"step": int(step), **out}
