"""The options of a ``LiveMonitor``, validated and defaulted in one place.

:class:`MonitorSettings` is to :class:`gradmon.monitor.callback.LiveMonitor` what
:class:`gradmon.cells.options.StepOptions` is to the step cells: ``LiveMonitor(log_file,
log_interval, **options)`` builds one with :meth:`MonitorSettings.from_kwargs`, and the
:class:`~gradmon.monitor.segment.Segment` and :class:`~gradmon.monitor.steplog.StepLogger` it opens
receive it whole. Adding an option is a field here (with its line in the docstring) and the code
that reads it. Pure Python: no MindSpore import.
"""

from __future__ import annotations

import numbers
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Callable

from gradmon.logformat.alarms import AlarmConfig
from gradmon.logformat.schema import INT_MAX
from gradmon.monitor.recovery import Recovery, recovery_of
from gradmon.monitor.writer_rank import check_writer_rank

__all__ = ["MonitorSettings", "alarm_config_of"]


def alarm_config_of(value: AlarmConfig | Mapping[str, Any] | None) -> AlarmConfig:
    """The alarm rule's settings from an :class:`AlarmConfig`, a dict of some of its fields (numpy
    scalars welcome; the rest default) or None (all defaults). An unknown name is an error."""
    if value is None:
        return AlarmConfig()
    if isinstance(value, AlarmConfig):
        return value
    if not isinstance(value, Mapping):
        raise TypeError(f"alarm_config must be an AlarmConfig, a dict of its fields or None, "
                        f"got {type(value).__name__}")
    known = [f.name for f in fields(AlarmConfig)]
    unknown = sorted(str(k) for k in value if k not in known)
    if unknown:
        raise ValueError(f"alarm_config: unknown setting(s) {', '.join(unknown)}; known: {', '.join(known)}")
    # numpy scalars -> Python numbers (AlarmConfig checks int/float; np.float32 is neither)
    plain = {k: v.item() if type(v).__module__ == "numpy" and hasattr(v, "item") else v
             for k, v in value.items()}
    return AlarmConfig(**plain)


# The integer options: (name, least value, None allowed). Checked as Recovery's and AlarmConfig's
# are: an int (a numpy integer too), not a bool, a float or text that int() would have taken.
_COUNTS = (("log_interval", 1, False), ("batch_size", 1, True), ("abort_after", 1, True),
           ("layer_stats_every", 0, False), ("layer_top_k", 0, False), ("initial_step", 0, True))


def _count(name: str, value: Any, low: int, optional: bool) -> int | None:
    """An integer option from ``low`` to ``INT_MAX`` (what a log's integer fields hold)."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not low <= value <= INT_MAX:
        raise ValueError(f"{name} must be an int from {low} to 2**63 - 1{' or None' if optional else ''}, "
                         f"got {value!r}")
    return int(value)


def _seconds(name: str, value: Any) -> float:
    """A duration option: seconds from 0 to ``threading.TIMEOUT_MAX`` (the sampler thread waits
    that long; a longer wait raises in the thread)."""
    # (numpy's numbers too; an int compares with a float exactly, however big; NaN is in no range)
    limit = threading.TIMEOUT_MAX
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value <= limit:
        raise ValueError(f"{name} must be a number of seconds from 0 to {threading.TIMEOUT_MAX:g}, "
                         f"got {value!r}")
    return float(value)


@dataclass(frozen=True)
class MonitorSettings:
    """The options of :class:`gradmon.monitor.callback.LiveMonitor`, validated.

    - ``log_file``: the run log's path (``LiveMonitor`` resolves a directory to ``metrics.jsonl``
      inside it, see :func:`gradmon.monitor.callback.log_file_path`).
    - ``log_interval``: read the device on steps that are multiples of this (and before an
      evaluation and at the end). With a device history (``MonitoredTrainStep(history_size
      >= log_interval)``) every step still gets a record; else only the steps read do.
    - ``config``: the user's settings, written into the header.
    - ``batch_size``: samples per step on one rank, when the dataset cannot tell
      (``train_dataset.get_batch_size()`` is used otherwise). Throughput is global:
      ``batch_size * world_size / step_time``.
    - ``per_rank``: every rank also writes ``metrics.rank<N>.jsonl`` beside ``log_file`` (the
      writer rank still writes ``log_file``). By default only the writer rank writes.
    - ``writer_rank``: which rank writes ``log_file`` (:func:`gradmon.monitor.writer_rank.writer_rank`):
      None/``"auto"`` (default) rank 0, or under pipeline parallelism the last rank (the last stage
      holds the loss); ``"first"``, ``"last_stage"`` or a rank number.
    - ``system_metrics``, ``system_interval``: sample host CPU, RSS and device memory every
      ``system_interval`` seconds on a background thread (``system`` records).
    - ``abort_after``: stop training after this many consecutive bad steps (docs/format.md: a
      loss-scale overflow counts only at the minimum scale). Every rank evaluates it, so
      data-parallel ranks stop together (``MonitoredTrainStep``'s flags agree across ranks).
    - ``abort_checkpoint``: on abort, rank 0 first saves the train network's parameters
      (optimizer state included) here, unless they are non-finite.
    - ``layer_stats_every``, ``layer_top_k``: every N steps write a ``layers`` record from the step
      cell's ``gradmon_layer_stats(top_k=...)`` when it has one.
    - ``initial_step``: the last step done before this run segment. Default: from the restored
      training state (the step cell's device step counter, else the optimizer's ``global_step``),
      so a run resumed from a checkpoint continues its numbering.
    - ``on_event``: called with every ``event`` record the monitor writes (``nonfinite``, ``skip``,
      ``spike``, ``abort``, ``alarm``, ``alarm_end``, ...), on the training thread; an exception in
      it is logged once.
    - ``retry_initial``: first back-off (seconds) before reopening an unwritable log.
    - ``alarms``: run the alarm rule (:class:`gradmon.logformat.alarms.AlarmRule`, docs/format.md
      "Alarms") over every step record and write its ``alarm`` / ``alarm_end`` events, one rule per
      segment, named in the header (``alarm_rule``). False: readers judge the log.
    - ``alarm_config``: the rule's thresholds: an :class:`gradmon.logformat.alarms.AlarmConfig` or a
      dict of some of its fields, e.g. ``{"quiet_steps": 20}`` (default: ``AlarmConfig()``;
      normalised to None when ``alarms`` is False).
    - ``recovery``: automatic recovery (off by default): a :class:`gradmon.monitor.recovery.Recovery`,
      a dict of its fields, or True for its defaults (normalised to a ``Recovery`` or None). Keeps a
      ring of snapshots of the step cell's whole state and, on an alarm, consecutive skipped steps or
      a user rule, restores the last one from before the incident, opens a rollback segment and goes
      on with the next batches (docs/cells.md "Automatic recovery"). Its ``skipped_steps`` must be
      below ``abort_after``.
    - ``sample_ids``: ``sample_ids(step) -> ids`` names the samples of a training step (a list of
      ids, or one list per data-parallel rank) for the ``forensics`` of an ``alarm`` event at that
      step; asked only when an alarm opens. Not needed when the step cell keeps the ids itself
      (``MonitoredTrainStep(forensics=K, forensics_ids=B)`` with an index column).
    """

    log_file: str
    log_interval: int = 1
    config: Mapping[str, Any] = field(default_factory=dict)
    batch_size: int | None = None
    per_rank: bool = False
    writer_rank: int | str | None = None
    system_metrics: bool = False
    system_interval: float = 5.0
    abort_after: int | None = None
    abort_checkpoint: str | None = None
    layer_stats_every: int = 0
    layer_top_k: int = 10
    initial_step: int | None = None
    on_event: Callable[[dict[str, Any]], Any] | None = None
    retry_initial: float = 1.0
    alarms: bool = True
    alarm_config: AlarmConfig | Mapping[str, Any] | None = None  # normalised: None iff not alarms
    recovery: Recovery | Mapping[str, Any] | bool | None = None  # normalised: a Recovery or None
    sample_ids: Callable[[int], Any] | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise once, here
        set_(self, "log_file", os.fspath(self.log_file))
        set_(self, "writer_rank", check_writer_rank(self.writer_rank))
        for name, low, optional in _COUNTS:
            set_(self, name, _count(name, getattr(self, name), low, optional))
        for name in ("system_interval", "retry_initial"):
            set_(self, name, _seconds(name, getattr(self, name)))
        if self.on_event is not None and not callable(self.on_event):
            raise TypeError(f"on_event must be callable, got {type(self.on_event).__name__}")
        if self.sample_ids is not None and not callable(self.sample_ids):
            raise TypeError("sample_ids must be callable (step -> ids), "
                            f"got {type(self.sample_ids).__name__}")
        if self.abort_checkpoint is not None:
            set_(self, "abort_checkpoint", os.fspath(self.abort_checkpoint))
        set_(self, "config", dict(self.config or {}))
        if not (isinstance(self.alarms, bool) or type(self.alarms).__name__ == "bool_"):
            raise TypeError(f"alarms must be True or False, got {self.alarms!r}")
        set_(self, "alarms", bool(self.alarms))
        if not self.alarms and self.alarm_config is not None:
            raise ValueError("alarm_config was given with alarms=False: drop one of them")
        set_(self, "alarm_config", alarm_config_of(self.alarm_config) if self.alarms else None)
        recovery = recovery_of(self.recovery)
        set_(self, "recovery", recovery)
        if recovery is not None and self.abort_after is not None and \
                (recovery.skipped_steps or 0) >= self.abort_after:
            raise ValueError(f"recovery.skipped_steps ({recovery.skipped_steps}) must be below "
                             f"abort_after ({self.abort_after}): the abort would come first")

    @classmethod
    def from_kwargs(cls, owner: str, log_file: str | os.PathLike[str], **options: Any) -> MonitorSettings:
        """Settings from keyword arguments; an unknown name raises ``TypeError`` listing the known ones."""
        known = {f.name for f in fields(cls)} - {"log_file"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"{owner} got unexpected option(s) {', '.join(map(repr, unknown))}; "
                            f"known options: {', '.join(sorted(known))}")
        return cls(log_file=os.fspath(log_file), **options)
