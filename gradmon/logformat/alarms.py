"""The alarm rule: when a run needs a person to look now (docs/format.md, "Alarms").

Two levels watch a run. The step cell's spike *detector* (ZClip, ``spike`` flags in step records)
fires often and mildly: it drives clipping and skipping. An *alarm* is rare and means "look now":
this module decides it, once per incident, from the step records in order, at full resolution.
Pure code, no I/O, no MindSpore: :class:`gradmon.LiveMonitor` and the server's ingest run the same
rule over the same records and get the same alarms.

A step is *flagged* for

- ``nonfinite``: its loss or gradient norm is NaN/inf. A loss-scale overflow (a loss-scaled step
  whose norm is non-finite while its loss is finite) is routine while the scale is still finding
  its ceiling; it is flagged only at a scale that ``overflow_proven_steps`` consecutive finite
  steps have used (the gradients themselves jumped, or went NaN), or at ``min_loss_scale``;
- ``grad_norm_spike``: its norm is above ``norm_ratio`` times the running median of the last
  ``window`` finite norms *and* above ``norm_over_max`` times the largest unflagged norm among
  them (the envelope) *and* above ``norm_floor`` times the run's scale (the largest running
  median the segment has had, sampled after its ``min_history``-th finite norm and after every
  ``window``-th). The envelope keeps a heavy-tailed run quiet — hard batches that come back
  every epoch, tens of times the median late in training — and a norm still rising early in
  training never stands far above its own recent past. The scale keeps a converged run quiet:
  at the noise floor (loss ~1e-7) float noise moves a norm of 1e-7 by 100x, which is still
  nothing against the norm the run trained at;
- ``loss_spike``: its loss is above the running median by more than ``loss_over_max`` times the
  envelope's height above the median (the largest unflagged recent loss minus the median), by
  more than ``loss_ratio`` times the median's magnitude, and by more than ``loss_floor`` times
  the run's loss scale (the largest magnitude of the sampled running medians, as for the norm):
  a loss of 1e-7 that triples is not an incident in a run that started at 2.3;
- ``abort``: an ``abort`` event arrives (the abort policy stopped the run).

A step whose gradient norm is zero (at most ``ZERO_NORM``: a frozen stretch, a batch whose every
label is masked) is judged by the ``nonfinite`` test only and learnt by neither series: it has no
gradient to defend, and its loss is often a placeholder 0 (twenty of them made the first real loss
a ``loss_spike``). The step cell's detector treats it alike (``cells/zclip_reference.py``).

Spike rules judge a series after ``min_history`` finite values. An *incident* opens at the first
flagged step (an ``alarm`` event) and closes once ``quiet_steps`` steps have passed without a flag,
or when the run ends (an ``alarm_end`` event: the incident's last flagged step and its count).
A ``header`` record (a new segment: restart, resume) ends any open incident and starts afresh,
as a new process would.

Usage, one rule per run::

    rule = AlarmRule()
    for record in records:          # every record, in file order
        for event in rule.update(record):
            write(event)
    for event in rule.finish():
        write(event)
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from gradmon.logformat.schema import ALARM_REASONS
from gradmon.logformat.values import number

__all__ = ["ALARM_REASONS", "ZERO_NORM", "AlarmConfig", "AlarmRule", "RunningBaseline", "Verdict",
           "is_overflow", "is_zero_norm"]

# A gradient norm at most this is zero (the step cell's ``TINY_NORM``): see the module's docstring.
ZERO_NORM = 1e-30


@dataclass(frozen=True)
class AlarmConfig:
    """Thresholds of the alarm rule; the defaults are measured (benchmarks/ALARMS.md, docs/format.md)."""

    window: int = 200
    min_history: int = 20
    norm_ratio: float = 8.0
    norm_over_max: float = 2.5
    norm_floor: float = 0.25
    loss_over_max: float = 5.0
    loss_ratio: float = 1.0
    loss_floor: float = 0.01
    quiet_steps: int = 50
    overflow_proven_steps: int = 50
    min_loss_scale: float = 1.0

    def __post_init__(self) -> None:
        for name in ("window", "min_history", "quiet_steps", "overflow_proven_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"AlarmConfig.{name} must be an int >= 1, got {value!r}")
        if self.min_history > self.window:
            raise ValueError(f"AlarmConfig.min_history ({self.min_history}) must not exceed "
                             f"window ({self.window})")
        for name in ("norm_ratio", "norm_over_max", "norm_floor", "loss_over_max", "loss_ratio",
                     "loss_floor", "min_loss_scale"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value < 0:
                raise ValueError(f"AlarmConfig.{name} must be a finite number >= 0, got {value!r}")

    def as_dict(self) -> dict[str, Any]:
        """The settings by name (a log header's ``alarm_rule``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> AlarmConfig:
        """Settings from :meth:`as_dict` output; unknown names (a newer writer's) are ignored."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})


class RunningBaseline:
    """The last ``window`` finite values of a series: their median, and the largest of those not
    flagged (the envelope). Per value: a bisect insert and delete in a sorted list of ``window``
    floats, and a monotonic deque for the envelope (amortised O(1))."""

    def __init__(self, window: int) -> None:
        self.window = window
        self._recent: deque[float] = deque()
        self._sorted: list[float] = []
        self._envelope: deque[tuple[int, float]] = deque()  # (arrival index, value), values decreasing
        self._count = 0

    def __len__(self) -> int:
        return len(self._recent)

    @property
    def seen(self) -> int:
        """Values added since the start (not only those still in the window)."""
        return self._count

    def median(self) -> float:
        s, n = self._sorted, len(self._sorted)
        if n == 0:
            return math.nan
        mid = n // 2
        return s[mid] if n % 2 else 0.5 * (s[mid - 1] + s[mid])

    def envelope(self) -> float:
        """The largest unflagged value among the last ``window`` (the median when all were flagged)."""
        return self._envelope[0][1] if self._envelope else self.median()

    def add(self, value: float, flagged: bool = False) -> None:
        """Take a finite ``value``; a ``flagged`` one counts for the median but not the envelope."""
        self._recent.append(value)
        bisect.insort(self._sorted, value)
        if len(self._recent) > self.window:
            old = self._recent.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, old)]
        index = self._count
        self._count += 1
        if not flagged:
            while self._envelope and self._envelope[-1][1] <= value:
                self._envelope.pop()
            self._envelope.append((index, value))
        while self._envelope and self._envelope[0][0] <= index - self.window:
            self._envelope.popleft()


@dataclass(frozen=True)
class Verdict:
    """Why a step is flagged: the reason, the field and value judged, what it was compared to."""

    reason: str
    message: str
    field: str | None = None
    value: float | None = None
    baseline: float | None = None


def _step_of(record: Mapping[str, Any]) -> int | None:
    step = record.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def _norm_bad(record: Mapping[str, Any], norm: float | None) -> bool:
    """A non-finite gradient norm, or none with the step's ``nonfinite`` flag."""
    if norm is None:
        return record.get("nonfinite") is True
    return not math.isfinite(norm)


def is_zero_norm(norm: float | None) -> bool:
    """Whether a step's gradient norm (a number, or ``None`` when absent) is zero: in
    ``[0, ZERO_NORM]``."""
    return norm is not None and 0.0 <= norm <= ZERO_NORM


def is_overflow(record: Mapping[str, Any]) -> bool:
    """A loss-scale overflow: a loss-scaled step (``loss_scale`` present, or an ``overflow``
    flag) whose gradient norm is non-finite (or absent with the ``nonfinite`` flag) while its loss
    is finite."""
    loss, norm = number(record.get("loss")), number(record.get("grad_norm"))
    if loss is not None and not math.isfinite(loss):
        return False
    scaled = record.get("overflow") is True or number(record.get("loss_scale")) is not None
    return scaled and _norm_bad(record, norm)


class AlarmRule:
    """The stateful alarm rule of one run: feed every record in order, get alarm events back.

    ``update(record)`` takes any record (step records are judged; a ``header`` starts a new
    segment; an ``abort`` event is flagged) and returns the events it causes: an ``alarm`` when an
    incident opens, an ``alarm_end`` when one closes. ``finish()`` closes the open incident at the
    end of the run. The judging steps are methods (``judge``, ``nonfinite_verdict``,
    ``norm_verdict``, ``loss_verdict``) so a subclass can change one rule and keep the rest.
    """

    def __init__(self, config: AlarmConfig | None = None) -> None:
        self.config = config or AlarmConfig()
        self.ignored = 0  # step records not after the last step of their segment (already judged)
        self._reset()

    def _reset(self) -> None:
        self.norms = RunningBaseline(self.config.window)
        self.losses = RunningBaseline(self.config.window)
        self._last_step: int | None = None
        self._incident: dict[str, Any] | None = None
        self.norm_scale = 0.0  # the largest sampled running median of the norms (is_scale_sample)
        self.loss_scale = 0.0  # the largest magnitude of the sampled running medians of the loss
        self._scale_run: tuple[float, int] | None = None  # (loss scale, consecutive finite steps at it)
        self._proven_scale: float | None = None

    @property
    def incident(self) -> dict[str, Any] | None:
        """The open incident (``start``, ``last``, ``flagged``, ``reasons``), or None."""
        return self._incident

    # ------------------------------------------------------------------------------ feeding
    def update(self, record: Mapping[str, Any]) -> list[dict[str, Any]]:
        kind = record.get("type")
        if kind == "header":
            out = self.finish()
            self._reset()
            return out
        if kind == "event" and record.get("kind") == "abort":
            step = _step_of(record)
            step = step if step is not None else (self._last_step or 0)
            text = record.get("message")
            verdict = Verdict("abort", "run aborted" + (f": {text}" if isinstance(text, str) else ""))
            return self._flag(step, record.get("ts"), verdict)
        step = _step_of(record)
        if kind != "step" or step is None:
            return []
        if self._last_step is not None and step <= self._last_step:
            self.ignored += 1
            return []
        self._last_step = step
        out = self._close_if_quiet(step)
        verdict = self.judge(record)
        self._learn(record, flagged=verdict is not None)
        if verdict is not None:
            out += self._flag(step, record.get("ts"), verdict)
        return out

    def finish(self) -> list[dict[str, Any]]:
        """The run (or segment) ended: close the open incident."""
        return [self._end_event()] if self._incident is not None else []

    # ------------------------------------------------------------------------------ judging
    def judge(self, record: Mapping[str, Any]) -> Verdict | None:
        """The verdict on one step record against the state *before* it (None: not flagged)."""
        return self.nonfinite_verdict(record) or self.norm_verdict(record) or self.loss_verdict(record)

    def nonfinite_verdict(self, record: Mapping[str, Any]) -> Verdict | None:
        loss, norm = number(record.get("loss")), number(record.get("grad_norm"))
        if loss is not None and not math.isfinite(loss):
            return Verdict("nonfinite", f"non-finite loss ({loss})", "loss", loss)
        if not _norm_bad(record, norm):
            return None
        value = norm if norm is not None else math.nan
        if not is_overflow(record):
            return Verdict("nonfinite", f"non-finite gradient norm ({value})", "grad_norm", value)
        scale = number(record.get("loss_scale"))
        if scale is None:
            return None
        if scale <= self.config.min_loss_scale:
            return Verdict("nonfinite", f"gradient overflow at the minimum loss scale {_fmt(scale)}",
                           "grad_norm", value, scale)
        if self._proven_scale is not None and scale <= self._proven_scale:
            return Verdict("nonfinite", f"gradient overflow at loss scale {_fmt(scale)}, which "
                           f"{self.config.overflow_proven_steps}+ finite steps in a row had used "
                           "(routine overflows come after the scale rises)", "grad_norm", value, scale)
        return None

    def norm_verdict(self, record: Mapping[str, Any]) -> Verdict | None:
        norm = number(record.get("grad_norm"))
        if norm is None or not math.isfinite(norm) or len(self.norms) < self.config.min_history:
            return None
        median, top = self.norms.median(), self.norms.envelope()
        config = self.config
        if median > 0 and norm > config.norm_ratio * median and norm > config.norm_over_max * top \
                and norm > config.norm_floor * self.norm_scale:
            return Verdict("grad_norm_spike",
                           f"gradient norm {_fmt(norm)} is {norm / median:.0f}x its running median "
                           f"{_fmt(median)} and {norm / top:.1f}x the largest recent norm {_fmt(top)}",
                           "grad_norm", norm, median)
        return None

    def loss_verdict(self, record: Mapping[str, Any]) -> Verdict | None:
        loss = number(record.get("loss"))
        if loss is None or not math.isfinite(loss) or len(self.losses) < self.config.min_history:
            return None
        median = self.losses.median()
        height = self.losses.envelope() - median
        jump = loss - median
        config = self.config
        # (a zero-norm step's loss is not judged: looked at last, on a step that would be flagged)
        if jump > 0 and jump > config.loss_over_max * height and jump > config.loss_ratio * abs(median) \
                and jump > config.loss_floor * self.loss_scale \
                and not is_zero_norm(number(record.get("grad_norm"))):
            text = f"loss {_fmt(loss)} is {_fmt(jump)} above its running median {_fmt(median)}"
            if height > 0:
                text += f", {jump / height:.1f}x the largest recent rise"
            return Verdict("loss_spike", text, "loss", loss, median)
        return None

    def _learn(self, record: Mapping[str, Any], flagged: bool) -> None:
        """Take the step into the baselines (after it was judged); a zero-norm step into neither
        (its loss scale still counts as used by a finite step)."""
        loss, norm = number(record.get("loss")), number(record.get("grad_norm"))
        zero = is_zero_norm(norm)
        if norm is not None and math.isfinite(norm):
            if not zero:
                self.norms.add(norm, flagged)
                if self.is_scale_sample(self.norms.seen):
                    self.norm_scale = max(self.norm_scale, self.norms.median())
            scale = number(record.get("loss_scale"))
            if scale is not None:
                same = self._scale_run is not None and self._scale_run[0] == scale
                count = self._scale_run[1] + 1 if same and self._scale_run is not None else 1
                self._scale_run = (scale, count)
                if count >= self.config.overflow_proven_steps:
                    self._proven_scale = scale
        if loss is not None and math.isfinite(loss) and not zero:
            self.losses.add(loss, flagged)
            if self.is_scale_sample(self.losses.seen):
                self.loss_scale = max(self.loss_scale, abs(self.losses.median()))

    def is_scale_sample(self, seen: int) -> bool:
        """Whether the run's scales take the running median after a series' ``seen``-th finite value."""
        return seen == self.config.min_history or seen % self.config.window == 0

    # ---------------------------------------------------------------------------- incidents
    def _close_if_quiet(self, step: int) -> list[dict[str, Any]]:
        if self._incident is not None and step - self._incident["last"] > self.config.quiet_steps:
            return [self._end_event()]
        return []

    def _flag(self, step: int, ts: Any, verdict: Verdict) -> list[dict[str, Any]]:
        ts = number(ts)
        incident = self._incident
        if incident is not None:
            incident["last"] = max(incident["last"], step)
            incident["flagged"] += 1
            incident["reasons"][verdict.reason] = incident["reasons"].get(verdict.reason, 0) + 1
            incident["last_ts"] = ts if ts is not None else incident["last_ts"]
            return []
        self._incident = {"start": step, "last": step, "flagged": 1, "reasons": {verdict.reason: 1},
                          "last_ts": ts}
        event = {"type": "event", "kind": "alarm", "step": step, "ts": ts, "reason": verdict.reason,
                 "field": verdict.field, "value": verdict.value, "baseline": verdict.baseline,
                 "message": verdict.message}
        return [{k: v for k, v in event.items() if v is not None}]

    def _end_event(self) -> dict[str, Any]:
        incident, self._incident = self._incident, None
        assert incident is not None
        reasons = ", ".join(f"{n} x{k}" if k > 1 else n for n, k in incident["reasons"].items())
        span = incident["last"] - incident["start"] + 1
        event = {
            "type": "event", "kind": "alarm_end", "step": incident["last"], "ts": incident["last_ts"],
            "start": incident["start"], "flagged": incident["flagged"], "reasons": dict(incident["reasons"]),
            "message": f"incident of steps {incident['start']}-{incident['last']} ended: "
                       f"{incident['flagged']} of {span} steps flagged ({reasons})",
        }
        return {k: v for k, v in event.items() if v is not None}
