"""``StepLogger``: the host side of ``LiveMonitor`` without MindSpore.

It owns the read interval (a non-log step costs a counter, a list append and a timestamp: no
device read), the one read per log step (the step cell's device history, else the last step's
outputs), the records built from it (:mod:`gradmon.monitor.records`), their events, the abort
policy, the alarm rule (:mod:`gradmon.logformat.alarms`, at full resolution: it sees every step
record written), the ``on_event`` hook and the layer statistics. The step cell, the learning-rate
reader and the step outputs are duck-typed (docs/design.md's cell contract), so all of this is
tested without MindSpore (tests/test_steplog.py); :class:`gradmon.monitor.callback.LiveMonitor`
adapts MindSpore's callback hooks to it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, Callable, Protocol

from gradmon.logformat.alarms import AlarmRule
from gradmon.logformat.schema import FORENSICS_FIELD
from gradmon.monitor.forensics import attach_forensics
from gradmon.monitor.outputs import parse_step_outputs
from gradmon.monitor.records import (
    DYNAMIC_MIN_LOSS_SCALE,
    BadStepCounter,
    EpochTrack,
    StepFields,
    abort_vote,
    classify_step,
    events_for_step,
    history_rows_to_steps,
    interval_timing,
    skipped_mask,
    step_records,
)
from gradmon.monitor.settings import MonitorSettings

__all__ = ["RecordSink", "StepLogger"]

_log = logging.getLogger("gradmon.monitor.callback")

EventHook = Callable[[dict[str, Any]], Any]


class RecordSink(Protocol):
    """Where records go: a :class:`gradmon.monitor.writer.RunLogWriter`."""

    @property
    def closed(self) -> bool: ...

    def write(self, record: Mapping[str, Any]) -> bool: ...


class StepLogger:
    """Turns training steps into run-log records written to ``sinks``.

    Args:
        sinks: the writers (none on a rank that writes nothing).
        settings: the monitor's options; read here: ``log_interval`` (read the device when the step
            count reaches a multiple of it), ``abort_after`` (stop after this many consecutive bad
            steps, :func:`gradmon.monitor.records.abort_vote`), ``on_event`` (called with a copy of
            every ``event`` record written; exceptions are logged once), ``layer_stats_every`` and
            ``layer_top_k`` (a ``layers`` record every N steps from ``cell.gradmon_layer_stats``),
            ``sample_ids`` (``sample_ids(step) -> ids`` of the samples a step trained on, asked when
            an alarm opens at it, for its ``forensics``, when the cell keeps no ids of its own).
        initial_step: the last step before this segment (the next step is ``initial_step + 1``).
        epoch: the epoch the segment starts in.
        cell: the step cell, for ``gradmon_read_history`` / ``gradmon_layer_stats`` when it has them.
        lr_reader: ``values(n, skipped) -> [rate, ...]`` of the last ``n`` steps
            (``gradmon.monitor.lr.LrReader``).
        samples_per_step: samples per step over all ranks, for ``throughput``.
        overflow_floor: the loss scale at or below which an overflow counts toward ``abort_after``.
        save_checkpoint: called on abort; returns ``(path or None, note for the message)``.
        on_stop: called when the abort policy fires (e.g. ``run_context.request_stop``).
        alarm_rule: judges every step record written and every ``abort``; its ``alarm`` /
            ``alarm_end`` events are written too (None: no alarms). :meth:`finish` ends it.
    """

    def __init__(
        self,
        sinks: Sequence[RecordSink],
        settings: MonitorSettings,
        *,
        initial_step: int = 0,
        epoch: int = 1,
        cell: Any = None,
        lr_reader: Any = None,
        samples_per_step: int | None = None,
        overflow_floor: float = DYNAMIC_MIN_LOSS_SCALE,
        save_checkpoint: Callable[[], tuple[str | None, str]] | None = None,
        on_stop: Callable[[], Any] | None = None,
        alarm_rule: AlarmRule | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.sinks = list(sinks)
        self.settings = settings
        self.log_interval = settings.log_interval
        self.step = self.logged_step = self._last_layers_step = int(initial_step)
        self.epochs = EpochTrack(epoch)
        self.cell = cell
        self.lr_reader = lr_reader
        self.samples_per_step = samples_per_step
        self.abort_after = settings.abort_after
        self.overflow_floor = overflow_floor
        self.on_event = settings.on_event
        self.save_checkpoint = save_checkpoint
        self.on_stop = on_stop
        self.layer_stats_every = settings.layer_stats_every
        self.layer_top_k = settings.layer_top_k
        self.alarm_rule = alarm_rule
        self.sample_ids = settings.sample_ids
        self._forensics_failed = False
        self._clock = clock
        self._bad = BadStepCounter(settings.abort_after)
        self.aborted = False
        self._outputs: Any = None  # the last step's outputs: a reference, read on log steps only
        self._t_interval = self._t_last_end = clock()
        self._data_times: list[float] = []
        self._step_continues = False  # the last step_end did not advance the step
        self._history_failed = False
        self._event_hook_failed = False
        # Sees every step record written (automatic recovery's triggers); with it every rank reads.
        self.watch: Callable[[Mapping[str, Any]], Any] | None = None

    # -- steps ----------------------------------------------------------------------------------

    def step_begin(self) -> None:
        """A step (or a micro-batch of one) is about to run: the time since the last one ended is
        its data time; a step's micro-batches add up."""
        wait = self._clock() - self._t_last_end
        if self._step_continues and self._data_times:
            self._data_times[-1] += wait
        else:
            self._data_times.append(wait)

    def step_end(self, step: int, outputs: Any = None, *, epoch: int | None = None) -> None:
        """Steps up to ``step`` have run (one callback may cover several: dataset sink mode);
        ``epoch``: the epoch the loop reports for them. Reads the device when ``step`` completes
        a log interval."""
        self._t_last_end = self._clock()
        if epoch is not None:
            self.epochs.note(epoch, self.step + 1)
        # Not advanced: a micro-batch of a step still under way (gradient accumulation).
        self._step_continues = int(step) == self.step
        self.step = int(step)
        self._outputs = outputs
        if self.step // self.log_interval > self.logged_step // self.log_interval:
            self.flush()

    def pause(self) -> None:
        """Time from now on (until the next step) is neither step time nor data time (evaluation)."""
        self._t_interval = self._t_last_end = self._clock()

    def flush(self) -> None:
        """Write the records of every step after the last written one (the one device read)."""
        last, first = self.step, self.logged_step + 1
        n = last - self.logged_step
        if n <= 0:
            return
        if not self.sinks and not self.abort_after and self.watch is None:
            # A rank that writes nothing reads nothing. With an abort policy (or recovery) every rank
            # reads, so that all data-parallel ranks take the same decision.
            self._advance(last)
            return
        now = self._clock()
        step_time = (now - self._t_interval) / n
        self._t_interval = now
        data_times, self._data_times = self._data_times, []
        ts = time.time()
        history = self._read_history(last)
        items, lost = history if history is not None else ([(last, self.fields_from_outputs())], 0)
        lrs = self.lr_reader.values(n, skipped_mask(items, first, n)) if self.lr_reader is not None else []
        timing = interval_timing(step_time, self.samples_per_step)
        records = step_records(items, first=first, last=last, ts=ts, epoch_at=self.epochs.epoch_at, lrs=lrs,
                               data_times=data_times, timing=timing)
        if lost:
            self.emit({
                "type": "event", "kind": "history_overflow", "step": first, "ts": ts, "count": lost,
                "message": f"{lost} steps were not recorded: the device history ring is smaller than the "
                           f"read interval (history_size < log_interval)",
            })
        self._advance(last)
        self.write_steps(records)
        self._maybe_layer_stats(last, ts)

    def log_step(self, step: int, fields: Mapping[str, Any], *, epoch: int | None = None) -> None:
        """Write one ``step`` record given by the caller (``monitor.log``)."""
        if epoch is not None:
            self.epochs.note(epoch, step)
        record = {"type": "step", "step": int(step), "epoch": self.epochs.epoch_at(step), "ts": time.time()}
        record.update(fields)
        self.step = max(self.step, int(step))
        self.logged_step = max(self.logged_step, int(step))
        self.write_steps([record])

    def _advance(self, step: int) -> None:
        self.logged_step = step
        self._data_times.clear()
        self.epochs.forget_through(step)

    # -- reading the device ---------------------------------------------------------------------

    def _read_history(self, step: int) -> tuple[list[StepFields], int] | None:
        """The steps since the last read from the cell's device history; None when the cell has
        none or reading it failed (then the step outputs are parsed instead)."""
        read_history = getattr(self.cell, "gradmon_read_history", None)
        if not callable(read_history) or self._history_failed:
            return None
        try:
            snap = read_history()
            return history_rows_to_steps(tuple(snap.fields), snap.rows, int(snap.total_steps),
                                         current_step=step, after_step=self.logged_step)
        except Exception as exc:  # monitoring must not stop training
            self._history_failed = True
            _log.warning("gradmon: reading the step cell's history failed (%s: %s); logging the step "
                         "outputs of log steps instead", type(exc).__name__, exc)
            return None

    def fields_from_outputs(self) -> dict[str, Any]:
        """Record fields from the last step's outputs (the plain-cell path: log steps only)."""
        return parse_step_outputs(self._outputs).record_fields()

    def _maybe_layer_stats(self, step: int, ts: float) -> None:
        every = self.layer_stats_every
        stats_fn = getattr(self.cell, "gradmon_layer_stats", None)
        if every <= 0 or not callable(stats_fn) or step // every <= self._last_layers_step // every:
            return
        self._last_layers_step = step
        try:
            stats = stats_fn(top_k=self.layer_top_k)
        except Exception as exc:
            _log.warning("gradmon: gradmon_layer_stats() failed: %s", exc)
            return
        record: dict[str, Any] = {"type": "layers", "step": step, "ts": ts}
        if isinstance(stats, Mapping):
            record.update({k: v for k, v in stats.items() if k not in ("type", "step", "ts")})
        else:
            record["top"] = list(stats)
        self.emit(record)

    # -- writing ---------------------------------------------------------------------------------

    def write_steps(self, records: Sequence[dict[str, Any]]) -> None:
        """Every step record passes here, in step order: classified, written, followed by its
        events and the alarm rule's, and counted by the abort policy."""
        for record in records:
            classify_step(record)
            self.emit(record)
            for event in events_for_step(record, record.get("ts")):
                self.emit(event)
            self._judge(record)
            if self.watch is not None:
                self.watch(record)
            # One history read can hold more bad steps than the limit: the abort belongs to the
            # step that reached it, with that step's count, right after that step's record.
            if self._bad.update(abort_vote(record, self.overflow_floor)) and not self.aborted:
                self._abort(record["step"], self._bad.consecutive)

    def _judge(self, record: Mapping[str, Any]) -> None:
        """Write the alarm rule's events for ``record`` (a step record or an ``abort``)."""
        if self.alarm_rule is not None and self.sinks:
            for event in self.alarm_rule.update(record):
                if event.get("kind") == "alarm":
                    self._attach_forensics(event)
                self.emit(event)

    def _attach_forensics(self, event: dict[str, Any]) -> None:
        """Add what the step cell's forensics rings (and the ``sample_ids`` hook) hold for the
        alarm's step to the event: ``forensics`` (docs/format.md). Read only here, once per incident."""
        step = event.get("step")
        read = getattr(self.cell, "gradmon_forensics", None)
        if not isinstance(step, int) or (not callable(read) and self.sample_ids is None):
            return
        attach_forensics(event, step, self.step, read if callable(read) else None, self.sample_ids,
                         warn=not self._forensics_failed)
        self._forensics_failed = self._forensics_failed or "error" in event.get(FORENSICS_FIELD, {})

    def finish(self) -> None:
        """The segment ends: write the ``alarm_end`` of the open incident, if any (before ``end``)."""
        if self.alarm_rule is not None and self.sinks:
            for event in self.alarm_rule.finish():
                self.emit(event)

    def emit(self, record: Mapping[str, Any]) -> None:
        """Write one record to every open sink; an ``event`` then goes to ``on_event`` too."""
        if not self.sinks:
            return
        for sink in self.sinks:
            if not sink.closed:
                sink.write(record)
        if self.on_event is not None and record.get("type") == "event":
            self._call_event_hook(dict(record))

    def _call_event_hook(self, event: dict[str, Any]) -> None:
        try:
            self.on_event(event)  # type: ignore[misc]
        except Exception:  # user code must never stop training
            if self._event_hook_failed:
                _log.debug("gradmon: on_event failed again", exc_info=True)
            else:
                self._event_hook_failed = True
                _log.exception("gradmon: the on_event callable raised (logged once; training goes on)")

    # -- abort policy --------------------------------------------------------------------------

    def _abort(self, step: int, consecutive: int) -> None:
        why = f"{consecutive} consecutive skipped or non-finite steps (abort_after={self.abort_after})"
        self.abort(step, why, consecutive=consecutive)

    def abort(self, step: int, why: str, **fields: Any) -> None:
        """Stop training at ``step`` because of ``why``: the abort checkpoint (when configured), an
        ``abort`` event (with ``fields``) through the alarm rule, then ``on_stop``."""
        checkpoint, note = self.save_checkpoint() if self.save_checkpoint is not None else (None, "")
        message = (f"training aborted at step {step}: {why}"
                   + (f"; checkpoint saved to {checkpoint}" if checkpoint else "") + note)
        _log.error("gradmon: %s", message)
        event: dict[str, Any] = {"type": "event", "kind": "abort", "step": step, "ts": time.time(), **fields,
                                 "message": message}
        if checkpoint:
            event["checkpoint"] = checkpoint
        self.emit(event)
        self._judge(event)
        self.aborted = True
        if self.on_stop is not None:
            self.on_stop()
