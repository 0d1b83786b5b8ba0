"""Snapshots of a train cell's whole state in host memory, and restoring them bit for bit.

A snapshot is a host numpy copy of every Parameter of the train cell: the network's weights, the
optimizer's state (moments, ``global_step``, its rate), the monitored step's device counters,
history ring and spike-detector state, and the loss scale with its update cell's counters. Restoring
copies each back into its Parameter's own buffer (``ops.assign``), which a compiled GRAPH-mode step
then uses: the restored cell replays the same steps to the bit. Not ``set_data`` (what
``load_param_into_net`` does): it gives the Parameter a new buffer, and a compiled step whose
optimizer runs inside a switch branch (``MonitoredTrainStep`` clipping with a skip possible) goes on
updating the old one — measured on MindSpore 2.10: the restored weights are read by the forward pass,
the update ignores them.

Why host copies: measured on CPU (docs/cells.md, "Automatic recovery"), ``asnumpy().copy()`` of the
22M model with Adam (253 MiB) takes ~0.25 s and a device-side ``Tensor.copy()`` per parameter ~0.85 s
(one kernel launch each); the host copy also leaves device memory alone, which is what a large
model lacks. On CPU ``asnumpy()`` aliases the Parameter's buffer, so the copy is required.

Used by :mod:`gradmon.monitor.recovery` (``LiveMonitor(recovery=...)``) through the step cells'
:meth:`SnapshotMixin.gradmon_snapshot` / :meth:`SnapshotMixin.gradmon_restore`; the functions work
on any ``nn.Cell`` (a stock ``TrainOneStepCell`` too).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["ParameterSnapshot", "SnapshotMixin", "restore_snapshot", "take_snapshot"]


@dataclass(frozen=True)
class ParameterSnapshot:
    """Host copies of a cell's Parameters, by name. ``step``: the training step it was taken after
    (a label; the cell's own counters are inside ``arrays``)."""

    step: int
    arrays: dict[str, np.ndarray] = field(repr=False)

    @property
    def nbytes(self) -> int:
        """Host memory the snapshot holds."""
        return sum(a.nbytes for a in self.arrays.values())


def _parameters(cell: Any) -> list[tuple[str, Any]]:
    # parameters_and_names yields each Parameter once (shared ones under their first name).
    return list(cell.parameters_and_names())


def take_snapshot(cell: Any, step: int) -> ParameterSnapshot:
    """Copy every Parameter of ``cell`` to host memory (one device read per Parameter)."""
    arrays: dict[str, np.ndarray] = {}
    for name, param in _parameters(cell):
        host = param.asnumpy()
        # asnumpy aliases the Parameter's buffer on CPU: without the copy the snapshot would train on.
        arrays[name] = np.array(host, copy=True)
    return ParameterSnapshot(int(step), arrays)


def restore_snapshot(cell: Any, snapshot: ParameterSnapshot) -> None:
    """Write ``snapshot`` back into ``cell``'s Parameters. The cell must have the same Parameters
    (names, shapes, dtypes) as when it was taken; otherwise ``ValueError`` and nothing is written."""
    from mindspore import Tensor, ops

    params = _parameters(cell)
    names = {name for name, _ in params}
    missing, extra = sorted(names - set(snapshot.arrays)), sorted(set(snapshot.arrays) - names)
    if missing or extra:
        raise ValueError(f"the snapshot does not fit this cell: missing {missing[:5]}, unknown {extra[:5]}")
    for name, param in params:
        saved = snapshot.arrays[name]
        if tuple(saved.shape) != tuple(param.shape):
            raise ValueError(f"the snapshot's {name} has shape {saved.shape}, "
                             f"the cell's {tuple(param.shape)}")
    for name, param in params:
        # Into the Parameter's buffer (see the module docstring); the snapshot's array is only read,
        # so it can be restored again.
        ops.assign(param, Tensor(snapshot.arrays[name]))


class SnapshotMixin:
    """``gradmon_snapshot`` / ``gradmon_restore`` of the monitored step cells."""

    def gradmon_snapshot(self, step: int | None = None) -> ParameterSnapshot:
        """A host copy of this cell's whole training state (weights, optimizer state, counters,
        detector state, loss scale). ``step``: its label, by default the cell's step counter."""
        if step is None:
            counts = getattr(self, "counts", None)
            step = int(counts.asnumpy()[0]) if counts is not None else 0
        return take_snapshot(self, step)

    def gradmon_restore(self, snapshot: ParameterSnapshot) -> None:
        """Put this cell back into the state ``snapshot`` holds, bit for bit."""
        restore_snapshot(self, snapshot)
