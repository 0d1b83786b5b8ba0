"""Executing automatic recovery: the snapshots themselves and the data-parallel agreement.

:class:`RecoveryDriver` carries out :class:`gradmon.monitor.recovery.RecoveryPolicy`'s decisions for
one step cell after each training step: it makes the monitor read the device before a snapshot is due
(so every step up to it is judged), takes the snapshot (the cell's ``gradmon_snapshot``, else
:func:`gradmon.cells.snapshot.take_snapshot`), and returns the rollback or the give-up to
:class:`gradmon.monitor.callback.LiveMonitor`, which restores and opens the rollback segment.

Data parallel: every rank must keep the same snapshots and roll back together, or the replicas part.
The gradient norm and the skip flags agree across ranks (the norm is global), but the loss (and a
user rule on it) is each rank's own. So at each decision point — the same steps on every rank: the
monitor's reads — the ranks all-reduce (MAX) three integers: the trigger's kind, minus its incident
step, and "not clean". Any rank's trigger rolls every rank back, to the snapshot before the earliest
incident; a snapshot is kept only where every rank is clean. One tiny collective per read, only with
recovery on and more than one rank.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import numpy as np

from gradmon.logformat.alarms import AlarmConfig
from gradmon.monitor.header import distributed
from gradmon.monitor.recovery import GiveUp, Recovery, RecoveryPolicy, RollbackPlan, Trigger

__all__ = ["RecoveryDriver", "agreement"]

_log = logging.getLogger("gradmon.monitor.callback")

# The order in which one rank's trigger kind wins over another's in the all-reduce (larger wins).
_CODES = {"rule": 1, "skipped": 2, "alarm": 3}
_NO_INCIDENT = -(2**31 - 1)

Agreement = Callable[[Trigger | None, bool], tuple[Trigger | None, bool]]


def _alone(trigger: Trigger | None, unclean: bool) -> tuple[Trigger | None, bool]:
    return trigger, unclean


def agreement() -> Agreement:
    """The decision every rank takes: this rank's own when it is alone, else all-reduced (MAX)."""
    _, world = distributed()
    if world <= 1:
        return _alone
    from mindspore import Tensor, nn, ops

    class _MaxAllReduce(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.reduce = ops.AllReduce(ops.ReduceOp.MAX)

        def construct(self, x):
            return self.reduce(x)

    reduce = _MaxAllReduce()

    def agree(trigger: Trigger | None, unclean: bool) -> tuple[Trigger | None, bool]:
        mine = [_CODES.get(trigger.reason, 1) if trigger else 0,
                -trigger.incident_step if trigger else _NO_INCIDENT, int(unclean)]
        code, neg_incident, any_unclean = (int(v) for v in reduce(Tensor(np.array(mine, np.int32))).asnumpy())
        if code == 0:
            return None, bool(any_unclean)
        incident = -neg_incident
        if trigger is not None and (trigger.incident_step, _CODES.get(trigger.reason, 1)) == (incident, code):
            return trigger, True
        step = trigger.step if trigger is not None else incident
        name = {v: k for k, v in _CODES.items()}.get(code, "rule")
        return Trigger("rank", f"another rank's {name} trigger", incident, step), True

    return agree


class RecoveryDriver:
    """Automatic recovery for one step cell (see the module docstring).

    ``config``: the settings; ``alarm_config``: the monitor's alarm thresholds (the trigger's
    default); ``agree``: the cross-rank agreement (default: :func:`agreement`)."""

    def __init__(self, config: Recovery, cell: Any, *, alarm_config: AlarmConfig | None = None,
                 agree: Agreement | None = None) -> None:
        if cell is None:
            raise ValueError("recovery needs the step cell: train with Model.train, or attach(cell) "
                             "and call after_step() in a hand-written loop")
        self.config = config
        self.cell = cell
        self.policy = RecoveryPolicy(config, alarm_config)
        self._agree = agree if agree is not None else agreement()
        self._last_step = 0
        self._decided_through = 0
        self.rollbacks = 0
        self.holding = 0  # batches still to skip after the last rollback (each run, then undone)
        self._held: Any = None  # the snapshot they are undone to
        self.snapshot_seconds: list[float] = []  # time of each snapshot taken (for the docs' figures)

    def begin_segment(self, initial_step: int) -> None:
        """A segment starts after ``initial_step`` (the run's start, or a rollback's restored step)."""
        self._last_step = self._decided_through = int(initial_step)

    def observe(self, record: Any) -> None:
        """Every step record the monitor writes (StepLogger's ``watch``)."""
        self.policy.observe(record)

    def after_step(self, logger: Any) -> RollbackPlan | GiveUp | None:
        """After each step callback: snapshot when due and clean; a decision when the monitor has
        read new steps (None: go on)."""
        import time

        step = int(logger.step)
        self.policy.count_batches(step - self._last_step)
        self._last_step = step
        due = self.policy.snapshot_due(step)
        if due and logger.logged_step < step:
            logger.flush()  # judge every step up to this one before keeping its state
        if logger.logged_step <= self._decided_through:
            return None
        self._decided_through = logger.logged_step
        trigger, unclean = self._agree(self.policy.trigger, not self.policy.may_snapshot())
        if trigger is not None:
            return self.policy.plan(trigger)
        if due and not unclean:
            t0 = time.perf_counter()
            snapshot = self._take(step)
            self.snapshot_seconds.append(time.perf_counter() - t0)
            self.policy.add_snapshot(step, snapshot)
        return None

    def restore(self, plan: RollbackPlan) -> None:
        """Put the cell back into ``plan``'s snapshot and the policy into its state."""
        self._restore_cell(plan.snapshot)
        self.policy.rolled_back(plan)
        self.rollbacks += 1
        self._last_step = self._decided_through = plan.step
        self.holding, self._held = plan.hold, plan.snapshot

    def undo_held_step(self) -> None:
        """A batch of the hold ran: undo it (restore the rollback's snapshot again)."""
        self._restore_cell(self._held)
        self.policy.count_batches(1)
        self.holding -= 1

    def _restore_cell(self, snapshot: Any) -> None:
        restore = getattr(self.cell, "gradmon_restore", None)
        if callable(restore):
            restore(snapshot)
        else:
            from gradmon.cells.snapshot import restore_snapshot

            restore_snapshot(self.cell, snapshot)

    def _take(self, step: int) -> Any:
        take = getattr(self.cell, "gradmon_snapshot", None)
        if callable(take):
            return take(step)
        from gradmon.cells.snapshot import take_snapshot

        return take_snapshot(self.cell, step)
