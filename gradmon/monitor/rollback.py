"""Executing automatic recovery: the snapshots themselves and the data-parallel agreement.

:class:`RecoveryDriver` carries out :class:`gradmon.monitor.recovery.RecoveryPolicy`'s decisions for
one step cell after each training step: it makes the monitor read the device before a snapshot is due
(so every step up to it is judged), takes the snapshot (the cell's ``gradmon_snapshot``, else
:func:`gradmon.cells.snapshot.take_snapshot`), and returns the rollback or the give-up to
:class:`gradmon.monitor.callback.LiveMonitor`, which restores and opens the rollback segment.

Data parallel: every rank must keep the same snapshots and roll back together, or the replicas part.
The gradient norm and the skip flags agree across ranks (the norm is global), but the loss (and a
user rule on it) is each rank's own. So at each decision point — the same steps on every rank: the
monitor's reads — the ranks all-reduce a small vector: "not clean", a count per trigger kind, and a
one-hot of the snapshot each rank's trigger would restore (CPU AllReduce sums float32 only, so the
decision is built from sums). Any rank's trigger rolls every rank back, to the oldest snapshot any of
them chose; a snapshot is kept only where every rank is clean. One tiny collective per read, only
with recovery on and more than one rank.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any, Callable

import numpy as np

from gradmon.logformat.alarms import AlarmConfig
from gradmon.monitor.header import distributed
from gradmon.monitor.recovery import GiveUp, Recovery, RecoveryPolicy, RollbackPlan, Trigger, rollback_event
from gradmon.monitor.training_state import accumulation_steps

__all__ = ["RecoveryDriver", "agree_from_sums", "agreement", "local_vote"]

_log = logging.getLogger("gradmon.monitor.callback")

# The order in which one rank's trigger kind wins over another's in the agreement (later wins).
_KINDS = ("rule", "skipped", "alarm")

Agreement = Callable[[RecoveryPolicy, Trigger | None, bool, int], tuple[Trigger | None, bool]]


Decision = tuple[Trigger | None, bool]


def _alone(policy: RecoveryPolicy, trigger: Trigger | None, unclean: bool, now: int) -> Decision:
    return trigger, unclean


def agree_from_sums(policy: RecoveryPolicy, trigger: Trigger | None, sums: Any, now: int) -> Decision:
    """The decision from the summed vector (see :func:`local_vote`): pure, so tested without ranks."""
    ring = policy.snapshot_steps()
    unclean = sums[0] > 0.5
    kinds = [k for k, n in zip(_KINDS, sums[1:4]) if n > 0.5]
    if not kinds:
        return None, unclean
    chosen = [i for i, n in enumerate(sums[4:]) if n > 0.5]  # 0: none old enough, 1 + i: ring[i]
    incident = (ring[chosen[0] - 1] + 1) if chosen and chosen[0] > 0 else (ring[0] if ring else 0)
    if trigger is not None and _choice(policy, trigger) == (chosen[0] if chosen else 0):
        return trigger, True
    if trigger is not None:  # another rank's incident needs an older snapshot
        return replace(trigger, incident_step=min(incident, trigger.incident_step)), True
    return Trigger("rank", f"another rank's {kinds[-1]} trigger", incident, now), True


def _choice(policy: RecoveryPolicy, trigger: Trigger) -> int:
    """0 when no snapshot is from before ``trigger``'s incident, else 1 + its index in the ring."""
    ring = policy.snapshot_steps()
    before = [i for i, s in enumerate(ring) if s < trigger.incident_step]
    return before[-1] + 1 if before else 0


def local_vote(policy: RecoveryPolicy, trigger: Trigger | None, unclean: bool) -> np.ndarray:
    """This rank's part of the sum: [not clean, one count per trigger kind, one-hot of its choice]."""
    vote = np.zeros(4 + 1 + policy.config.keep, np.float32)
    vote[0] = float(unclean)
    if trigger is not None:
        kind = trigger.reason if trigger.reason in _KINDS else "rule"
        vote[1 + _KINDS.index(kind)] = 1.0
        vote[4 + _choice(policy, trigger)] = 1.0
    return vote


def agreement() -> Agreement:
    """The decision every rank takes: this rank's own when it is alone, else all-reduced."""
    _, world = distributed()
    if world <= 1:
        return _alone
    from mindspore import Tensor, nn, ops

    class _SumAllReduce(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.reduce = ops.AllReduce(ops.ReduceOp.SUM)

        def construct(self, x):
            return self.reduce(x)

    reduce = _SumAllReduce()

    def agree(policy: RecoveryPolicy, trigger: Trigger | None, unclean: bool, now: int) -> Decision:
        sums = reduce(Tensor(local_vote(policy, trigger, unclean))).asnumpy()
        return agree_from_sums(policy, trigger, [float(v) for v in sums], now)

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
        # Calls of the cell per optimizer step (grad_accum_steps): the policy counts optimizer steps.
        self._calls_per_step = accumulation_steps(cell)
        self.holding = 0  # calls still to skip after the last rollback (each run, then undone)
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
        trigger, unclean = self._agree(self.policy, self.policy.trigger, not self.policy.may_snapshot(), step)
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
        # plan.hold optimizer steps; under accumulation each is N calls (micro-batches).
        self.holding, self._held = plan.hold * self._calls_per_step, plan.snapshot

    def undo_held_step(self) -> None:
        """A call of the hold ran: undo it (restore the rollback's snapshot again); every N-th
        completes a held optimizer step."""
        self._restore_cell(self._held)
        self.holding -= 1
        if self.holding % self._calls_per_step == 0:
            self.policy.count_batches(1)

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


class RecoveryHooks:
    """:class:`~gradmon.monitor.callback.LiveMonitor`'s side of automatic recovery: after each step,
    the snapshot, rollback or give-up its :class:`RecoveryDriver` decides, and the batches held after
    a rollback. A mixin of LiveMonitor only: it uses the monitor's ``recovery`` (the driver, or None),
    its logger and segment, ``close`` and ``_open_segment`` with the segment's arguments, and its step
    and epoch offsets.
    """

    recovery: RecoveryDriver | None

    @property
    def rollbacks(self) -> int:
        """Rollbacks done so far (automatic recovery)."""
        return self.recovery.rollbacks if self.recovery is not None else 0

    def _holding(self) -> bool:
        return self.recovery is not None and self.recovery.holding > 0

    def _undo_held_step(self) -> None:
        """A batch skipped after a rollback ran: undo it; it is neither logged nor counted."""
        assert self.recovery is not None
        self.recovery.undo_held_step()
        if not self.recovery.holding:
            self._logger.pause()  # the hold's time is not the next steps' step time

    def _recover(self, boundary: bool = True) -> None:
        """After each step: the recovery's snapshot, rollback or give-up (every rank alike).

        Only at an optimizer-step boundary (``boundary``: the call that ran the optimizer, always
        without accumulation): a snapshot then holds an empty accumulator, and a rollback restores
        one, so the loop's count of micro-batches stays in phase with the cell's."""
        if self.recovery is None or self._segment is None or self._logger.aborted or not boundary:
            return
        action = self.recovery.after_step(self._logger)
        if isinstance(action, GiveUp):
            self._logger.abort(action.trigger.step, action.message, recovery=True)
        elif isinstance(action, RollbackPlan):
            self._roll_back(action)

    def _roll_back(self, plan: RollbackPlan) -> None:
        """Restore ``plan``'s snapshot, end this segment (``rolled_back``) and open the rollback
        segment after the restored step, starting with the ``rollback`` event."""
        assert self.recovery is not None and self._segment is not None
        from_step = self._logger.step
        self.recovery.restore(plan)
        epoch_offset = self._epoch_offset
        self.close("rolled_back")
        self._open_segment(plan.step, *self._segment_args, initial_step_from="rollback")
        self._epoch_offset = epoch_offset
        self._step_offset += plan.step - from_step  # Model counts on; the steps continue after the snapshot
        event = rollback_event(plan, from_step, time.time())
        self._logger.emit(event)
        _log.warning("gradmon: %s", event["message"])
