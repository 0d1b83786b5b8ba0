"""Automatic recovery: when to keep a snapshot, when to roll back, to which one, when to give up.

Pure policy, no MindSpore and no I/O (tests/test_recovery_policy.py); :mod:`gradmon.monitor.rollback`
executes its decisions (takes and restores the snapshots, agrees across data-parallel ranks) and
:class:`gradmon.monitor.callback.LiveMonitor` opens the rollback segment (docs/format.md, "Segments").

The PaLM remedy, in process: keep a small ring of snapshots of the whole training state, one every
``every`` steps; when a *trigger* fires, restore the newest snapshot from before the incident and go on
with the next batches (the batches since that snapshot are skipped: their effect is thrown away and
they are not trained again). Triggers, judged on every step record the monitor reads:

- an **alarm**: the alarm rule (:class:`gradmon.logformat.alarms.AlarmRule`, the monitor's settings)
  opens an incident for one of ``on_alarm``'s reasons. The policy runs its own copy of the rule and
  keeps its state in each snapshot, so after a rollback the rule goes on from the snapshot's state (a
  fresh rule would be blind for its first ``min_history`` steps, when a fault still under way comes
  back);
- **skipped steps**: ``skipped_steps`` consecutive skipped or non-finite steps (the abort policy's
  count, :func:`gradmon.monitor.records.abort_vote`: a dynamic loss scale settling does not count);
- a **user rule**: ``rule(step_record)`` returns a reason (a non-empty str, or True, or
  ``(reason, first_step)`` to name where the incident began). :class:`LossRise` is one: a loss that
  stays well above its recent level, the slow divergence neither the alarm rule nor the detector
  sees (a learning rate too high for a while, a shard of wrong labels). A rule object's state is
  kept with each snapshot too (``copy.deepcopy``).

The incident's first step names the snapshot: the newest one taken *after* a step strictly before it.
A snapshot is only taken when the state is clean: every step up to it judged (the monitor reads the
device first), no trigger pending, no incident open, no bad step in a row. More than ``max_rollbacks``
rollbacks within ``window`` batches (steps run, the abandoned ones included), or no snapshot from
before the incident, ends in an abort with a message saying which.
"""

from __future__ import annotations

import copy
import statistics
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gradmon.logformat.alarms import AlarmConfig, AlarmRule, is_zero_norm
from gradmon.logformat.values import finite, number
from gradmon.monitor.records import BadStepCounter, abort_vote

__all__ = ["ALARM_TRIGGERS", "GiveUp", "LossRise", "Recovery", "RecoveryPolicy", "RollbackPlan", "Trigger",
           "recovery_of"]

# The alarm reasons that may trigger a rollback ("abort" is the end, not a fault to undo).
ALARM_TRIGGERS = ("nonfinite", "grad_norm_spike", "loss_spike")

UserRule = Callable[[Mapping[str, Any]], Any]


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"Recovery.{name} must be an int >= 1, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class Recovery:
    """Settings of automatic recovery (``LiveMonitor(recovery=Recovery(...))``; off by default).

    - ``every``: keep a snapshot every this many steps (M).
    - ``keep``: snapshots in the ring (host memory: ``keep`` x (weights + optimizer state), see
      docs/cells.md "Snapshots").
    - ``on_alarm``: the alarm reasons that roll back: True (all of :data:`ALARM_TRIGGERS`), False
      (none) or some of them.
    - ``skipped_steps``: roll back after this many consecutive skipped or non-finite steps (N;
      None: never). Must be below the monitor's ``abort_after``.
    - ``rule``: ``rule(step_record) -> reason or None``, called on every step record read.
    - ``skip_batches``: after a rollback, also skip this many of the next batches (each is run, then
      undone by restoring the snapshot again), doubled for each further rollback within ``window``:
      a fault that lasts (a bad shard, a bad stretch of the schedule) is outwaited in a few rollbacks.
    - ``max_rollbacks``, ``window``: more than ``max_rollbacks`` rollbacks within ``window`` batches
      aborts the run.
    - ``alarm_config``: the alarm rule's thresholds for the trigger (default: the monitor's).
    """

    every: int = 100
    keep: int = 2
    on_alarm: bool | tuple[str, ...] = True
    skipped_steps: int | None = 5
    rule: UserRule | None = field(default=None, compare=False)
    skip_batches: int = 10
    max_rollbacks: int = 5
    window: int = 1000
    alarm_config: AlarmConfig | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        for name in ("every", "keep", "max_rollbacks", "window"):
            set_(self, name, _positive_int(name, getattr(self, name)))
        hold = self.skip_batches
        if isinstance(hold, bool) or not isinstance(hold, int) or hold < 0:
            raise ValueError(f"Recovery.skip_batches must be an int >= 0, got {self.skip_batches!r}")
        if self.skipped_steps is not None:
            set_(self, "skipped_steps", _positive_int("skipped_steps", self.skipped_steps))
        reasons = self.on_alarm
        if isinstance(reasons, bool):
            reasons = ALARM_TRIGGERS if reasons else ()
        elif isinstance(reasons, str):
            reasons = (reasons,)
        reasons = tuple(reasons)
        unknown = [r for r in reasons if r not in ALARM_TRIGGERS]
        if unknown:
            raise ValueError(f"Recovery.on_alarm: unknown alarm reason(s) {unknown}; "
                             f"known: {list(ALARM_TRIGGERS)}")
        set_(self, "on_alarm", reasons)
        if self.rule is not None and not callable(self.rule):
            raise TypeError(f"Recovery.rule must be callable, got {type(self.rule).__name__}")
        if self.alarm_config is not None and not isinstance(self.alarm_config, AlarmConfig):
            raise TypeError("Recovery.alarm_config must be an AlarmConfig or None")
        if not reasons and self.skipped_steps is None and self.rule is None:
            raise ValueError("Recovery has no trigger: give on_alarm, skipped_steps or rule")

    def as_dict(self) -> dict[str, Any]:
        """The settings for the log header (``recovery``)."""
        return {"every": self.every, "keep": self.keep, "on_alarm": list(self.on_alarm),
                "skipped_steps": self.skipped_steps, "rule": self.rule is not None,
                "skip_batches": self.skip_batches,
                "max_rollbacks": self.max_rollbacks, "window": self.window}


def recovery_of(value: Recovery | Mapping[str, Any] | bool | None) -> Recovery | None:
    """``LiveMonitor``'s ``recovery`` argument: a :class:`Recovery`, a dict of its fields, True
    (the defaults) or None/False (off)."""
    if value is None or value is False:
        return None
    if value is True:
        return Recovery()
    if isinstance(value, Recovery):
        return value
    if isinstance(value, Mapping):
        return Recovery(**dict(value))
    raise TypeError("recovery must be a Recovery, a dict of its fields, True or None, "
                    f"got {type(value).__name__}")


@dataclass(frozen=True)
class Trigger:
    """Why the run should roll back. ``reason``: ``alarm`` / ``skipped`` / ``rule`` (``rank``: only
    another data-parallel rank saw it); ``incident_step``: the incident's first step; ``step``: the
    step whose record fired it; ``detail``: for the message (the alarm's reason, the rule's text)."""

    reason: str
    detail: str
    incident_step: int
    step: int


@dataclass(frozen=True)
class RollbackPlan:
    """Restore ``snapshot`` (taken after step ``step``) because of ``trigger``."""

    step: int
    snapshot: Any
    trigger: Trigger
    rollbacks: int  # rollbacks within the window, this one included
    hold: int = 0  # batches after the rollback to skip as well


@dataclass(frozen=True)
class GiveUp:
    """Recovery cannot go on: abort with ``message``."""

    message: str
    trigger: Trigger


@dataclass
class _Entry:
    step: int
    snapshot: Any  # what the executor took (a cells.snapshot.ParameterSnapshot)
    host_state: Any  # the policy's trigger state at that step


class RecoveryPolicy:
    """The decisions of automatic recovery (see the module docstring). The caller feeds it every
    step record (:meth:`observe`), asks :meth:`snapshot_due` / :meth:`may_snapshot` after each step
    and adds the snapshots it takes (:meth:`add_snapshot`), asks :meth:`plan` when :attr:`trigger`
    is set, and reports a rollback done (:meth:`rolled_back`)."""

    def __init__(self, config: Recovery, alarm_config: AlarmConfig | None = None) -> None:
        self.config = config
        self._alarm_config = config.alarm_config or alarm_config or AlarmConfig()
        self.ring: deque[_Entry] = deque()
        self.trigger: Trigger | None = None
        self.batches = 0  # steps run in this process, abandoned ones included
        self._rollback_batches: deque[int] = deque()  # self.batches at each rollback
        self._rule = AlarmRule(self._alarm_config) if config.on_alarm else None
        self._user_rule = _state_copy(config.rule)  # a rule object's state goes back with a rollback
        self._bad = BadStepCounter(config.skipped_steps)
        self._bad_first: int | None = None  # first step of the current run of bad steps
        self._last_snapshot: int | None = None

    # -- judging -----------------------------------------------------------------------------------

    def count_batches(self, n: int) -> None:
        """``n`` more steps (batches) ran."""
        self.batches += max(int(n), 0)

    def observe(self, record: Mapping[str, Any]) -> None:
        """A step record as the monitor wrote it (classified, in step order)."""
        if record.get("type") != "step" or not isinstance(record.get("step"), int):
            return
        step = record["step"]
        found: Trigger | None = None
        if self._rule is not None:
            for event in self._rule.update(record):
                if event.get("kind") == "alarm" and event.get("reason") in self.config.on_alarm:
                    at = int(event.get("step", step))
                    found = found or Trigger("alarm", str(event.get("reason")), at, step)
        vote = abort_vote(record)
        if vote is True and self._bad.consecutive == 0:
            self._bad_first = step
        if self.config.skipped_steps is not None and self._bad.update(vote):
            first = self._bad_first if self._bad_first is not None else step
            found = found or Trigger("skipped", f"{self._bad.consecutive} consecutive skipped or non-finite "
                                     "steps", first, step)
        if self._user_rule is not None:
            verdict = self._user_rule(record)
            first = step
            if isinstance(verdict, tuple):
                verdict, first = verdict[0], min(int(verdict[1]), step)
            if verdict:
                text = verdict if isinstance(verdict, str) else "user rule"
                found = found or Trigger("rule", text, first, step)
        if found is not None and self.trigger is None:
            self.trigger = found

    # -- snapshots -----------------------------------------------------------------------------------

    def snapshot_due(self, step: int) -> bool:
        """Whether a snapshot is due after ``step`` (the first step seen, then every ``every``)."""
        last = self._last_snapshot
        return last is None or step // self.config.every > last // self.config.every

    def may_snapshot(self) -> bool:
        """Whether the state is clean enough to keep (no trigger, no open incident, no bad step)."""
        incident = self._rule.incident if self._rule is not None else None
        return self.trigger is None and incident is None and self._bad.consecutive == 0

    def add_snapshot(self, step: int, snapshot: Any) -> None:
        """Keep ``snapshot`` (taken after ``step``), with the trigger state at that step; the oldest
        goes when the ring is full."""
        state = (copy.deepcopy(self._rule), copy.deepcopy(self._bad), self._bad_first,
                 _state_copy(self._user_rule))
        self.ring = deque((e for e in self.ring if e.step < step), maxlen=None)
        self.ring.append(_Entry(int(step), snapshot, state))
        while len(self.ring) > self.config.keep:
            self.ring.popleft()
        self._last_snapshot = int(step)

    def snapshot_steps(self) -> list[int]:
        return [e.step for e in self.ring]

    # -- rolling back ---------------------------------------------------------------------------------

    def plan(self, trigger: Trigger) -> RollbackPlan | GiveUp:
        """What to do about ``trigger``: restore the newest snapshot from before the incident, or
        give up (the cap, or no snapshot old enough)."""
        cfg = self.config
        recent = [b for b in self._rollback_batches if b > self.batches - cfg.window]
        what = _describe(trigger)
        if len(recent) >= cfg.max_rollbacks:
            return GiveUp(f"recovery gave up at step {trigger.step}: {what}, and {len(recent)} rollbacks "
                          f"already within the last {cfg.window} batches (max_rollbacks={cfg.max_rollbacks})",
                          trigger)
        before = [e for e in self.ring if e.step < trigger.incident_step]
        if not before:
            kept = ", ".join(str(s) for s in self.snapshot_steps()) or "none"
            return GiveUp(f"recovery gave up at step {trigger.step}: {what}, and no snapshot from before "
                          f"step {trigger.incident_step} is kept (snapshots after steps: {kept})", trigger)
        entry = before[-1]
        hold = cfg.skip_batches * 2 ** len(recent)
        return RollbackPlan(entry.step, entry.snapshot, trigger, len(recent) + 1, hold)

    def rolled_back(self, plan: RollbackPlan) -> None:
        """The cell now holds ``plan``'s snapshot: go on from its step and its trigger state; the
        snapshots after it belong to the abandoned stretch."""
        self.ring = deque(e for e in self.ring if e.step <= plan.step)
        entry = self.ring[-1]
        rule, bad, bad_first, user_rule = entry.host_state
        self._rule, self._bad, self._bad_first = copy.deepcopy(rule), copy.deepcopy(bad), bad_first
        self._user_rule = _state_copy(user_rule)
        self._rollback_batches.append(self.batches)
        while self._rollback_batches and self._rollback_batches[0] <= self.batches - self.config.window:
            self._rollback_batches.popleft()
        self.trigger = None
        self._last_snapshot = plan.step


def _state_copy(rule: Any) -> Any:
    """A copy of a user rule's state (``copy.deepcopy``), or the rule itself when it cannot be
    copied (it holds a lock, a file...): then its state simply goes on through a rollback."""
    try:
        return copy.deepcopy(rule)
    except Exception:
        return rule


class LossRise:
    """A user rule for :class:`Recovery`: the mean loss of the last ``recent`` steps is above
    ``factor`` times the median loss of the ``window`` steps before them (after ``min_history`` of
    those). Names the first of the ``recent`` steps above that level as the incident's start (so a
    rise right after a rollback does not reach back past the restored snapshot). Non-finite losses
    are left to the alarm rule; steps with a zero gradient norm (``alarms.is_zero_norm``: a batch
    whose every label is masked, its loss a placeholder 0) are left out, as the alarm rule leaves
    them: fifty such losses at a run's start put the median between 0 and the real level later,
    and the real losses read as a rise."""

    def __init__(self, factor: float = 1.5, recent: int = 10, window: int = 100,
                 min_history: int = 50) -> None:
        if not (factor > 1 and recent >= 1 and window >= min_history >= 1):
            raise ValueError("LossRise needs factor > 1, recent >= 1 and window >= min_history >= 1")
        self.factor, self.recent, self.window, self.min_history = float(factor), recent, window, min_history
        self._recent: deque[tuple[int, float]] = deque()
        self._base: deque[float] = deque()

    def __call__(self, record: Mapping[str, Any]) -> tuple[str, int] | None:
        loss, step = finite(record.get("loss")), record.get("step")
        if loss is None or not isinstance(step, int) or isinstance(step, bool) \
                or is_zero_norm(number(record.get("grad_norm"))):
            return None
        self._recent.append((step, loss))
        if len(self._recent) > self.recent:
            self._base.append(self._recent.popleft()[1])
            if len(self._base) > self.window:
                self._base.popleft()
        if len(self._recent) < self.recent or len(self._base) < self.min_history:
            return None
        median = statistics.median(self._base)
        mean = sum(v for _, v in self._recent) / len(self._recent)
        level = self.factor * median
        if median > 0 and mean > level:
            first = next((s for s, v in self._recent if v > level), self._recent[0][0])
            return (f"loss {mean:.4g} over the last {self.recent} steps is {mean / median:.1f}x "
                    f"its median {median:.4g}", first)
        return None


def _describe(trigger: Trigger) -> str:
    if trigger.reason == "alarm":
        return f"alarm ({trigger.detail}) from step {trigger.incident_step}"
    if trigger.reason == "rule":
        return f"user rule ({trigger.detail}) at step {trigger.incident_step}"
    return f"{trigger.detail} from step {trigger.incident_step}"


def rollback_event(plan: RollbackPlan, from_step: int, ts: float) -> dict[str, Any]:
    """The ``rollback`` event (docs/format.md), written first in the rollback segment."""
    t = plan.trigger
    abandoned = max(from_step - plan.step, 0)
    return {
        "type": "event", "kind": "rollback", "step": plan.step, "ts": ts, "restored_step": plan.step,
        "from_step": from_step, "incident_step": t.incident_step, "reason": t.reason, "detail": t.detail,
        "batches_skipped": abandoned + plan.hold, "hold": plan.hold, "rollbacks": plan.rollbacks,
        "message": f"rolled back to the snapshot after step {plan.step}: {_describe(t)}; "
                   f"{abandoned + plan.hold} batches skipped (steps {plan.step + 1}-{from_step} abandoned"
                   + (f", the next {plan.hold} batches undone" if plan.hold else "") + ")",
    }
