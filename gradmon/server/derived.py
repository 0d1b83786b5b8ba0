"""Alarms the server derives for logs whose writer does not run the alarm rule (docs/format.md,
"Alarms"; docs/protocol.md).

One rule per run, in the ingest: for every segment whose header lacks ``alarm_rule`` (other tools'
logs, older gradmon versions, a log with no header at all), :class:`DerivedAlarms` runs
:class:`gradmon.server.alarmrule.BatchAlarmRule` over the records as the index reads them — every
record, in file order, at full resolution; a header starts a fresh rule, the end of a segment (an
``end`` record or the next header) closes its open incident. A segment whose header has
``alarm_rule`` gets nothing derived: its writer's ``alarm`` events stand.

A derived event is marked ``"source": "server"`` and *anchored* to the line that caused it: after
the step record (or ``abort`` event) that raised it, before the ``header`` or ``end`` record that
closed its incident. The anchor is that line's start offset, so the derived events of a file range
are exactly those caused by its lines: a ``records`` message for ``[prev, cursor)`` carries them,
spliced among its records (:func:`splice`), and a history whose cursor is C holds those of the
lines before C — the no-gap/no-duplicate rules of the stream cover them as they cover the lines.

Pure: no I/O.
"""

from __future__ import annotations

import logging
from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence
from typing import Any, Callable, NamedTuple, TypeVar

from gradmon.logformat.alarms import AlarmConfig
from gradmon.logformat.jsonl import encode_record
from gradmon.logformat.schema import ALARM_RULE_FIELD, DERIVED_SOURCE
from gradmon.server.alarmrule import BatchAlarmRule
from gradmon.server.parse import KeyColumns

__all__ = ["MAX_DERIVED", "Derived", "DerivedAlarms", "splice"]

log = logging.getLogger("gradmon.server")

MAX_DERIVED = 5_000  # derived events kept per run for streams that catch up (the latest ones)

T = TypeVar("T")


class Derived(NamedTuple):
    """A derived event, its anchor (the start offset of the line that caused it, and whether it
    goes before that line) and its strict-JSON line."""

    offset: int
    before: bool
    event: dict[str, Any]
    line: bytes


class DerivedAlarms:
    """The server's alarm rule of one run (one generation of its file) and the events it derived."""

    def __init__(self, config: AlarmConfig | None = None, keep: int = MAX_DERIVED) -> None:
        self.config = config or AlarmConfig()
        self.keep = keep
        # The rule of the current segment; None while its writer runs the rule itself.
        self.rule: BatchAlarmRule | None = BatchAlarmRule(self.config)
        self._offsets: list[int] = []
        self._items: list[Derived] = []
        self.count = 0  # events derived so far
        self.errors = 0  # batches the rule failed on (logged once)

    # ---- feeding (the index calls these in file order) ------------------------------------

    def header(self, record: Mapping[str, Any], offset: int) -> list[dict[str, Any]]:
        """A header at ``offset`` ends the segment before it (its open incident closes, anchored
        before the header) and starts one with a fresh rule, unless its writer runs the rule."""
        out = self._run(lambda rule: [(0, e) for e in rule.finish()], [offset], before=True)
        self.rule = None if isinstance(record.get(ALARM_RULE_FIELD), Mapping) else BatchAlarmRule(self.config)
        return out

    def record(self, record: Mapping[str, Any], offset: int) -> list[dict[str, Any]]:
        """A record other than a step or a header: an ``end`` closes the open incident, an
        ``abort`` event is flagged (the rule's ``abort`` reason)."""
        kind = record.get("type")
        if kind == "end":
            return self._run(lambda rule: [(0, e) for e in rule.finish()], [offset], before=True)
        if kind == "event" and record.get("kind") == "abort":
            return self._run(lambda rule: [(0, e) for e in rule.update(record)], [offset], before=False)
        return []

    def steps(self, records: Sequence[dict[str, Any]], offsets: Sequence[int],
              columns: KeyColumns | None = None) -> list[dict[str, Any]]:
        """Consecutive step records starting at byte ``offsets[i]``: the events they raise
        (``columns``: their values by key, when taken already: ``parse.KeyColumns``)."""
        return self._run(lambda rule: rule.update_steps(records, columns), offsets, before=False)

    def _run(self, feed: Callable[[BatchAlarmRule], list[tuple[int, dict[str, Any]]]],
             offsets: Sequence[int], before: bool) -> list[dict[str, Any]]:
        rule = self.rule
        if rule is None:
            return []
        try:
            pairs = feed(rule)
        except Exception:  # a bug or an unforeseen value must not stop the index (nor the server)
            if not self.errors:
                log.exception("the alarm rule failed on a batch of records; its alarms are lost")
            self.errors += 1
            return []
        out = []
        for i, event in pairs:
            event = {**event, "source": DERIVED_SOURCE}
            self._keep(Derived(offsets[i], before, event, encode_record(event).rstrip("\n").encode("utf-8")))
            out.append(event)
        return out

    def _keep(self, item: Derived) -> None:
        self.count += 1
        self._offsets.append(item.offset)
        self._items.append(item)
        if len(self._items) > 2 * self.keep:  # drop the oldest in one go (amortised O(1))
            del self._offsets[:-self.keep]
            del self._items[:-self.keep]

    # ---- reading --------------------------------------------------------------------------

    def between(self, start: int, end: int) -> list[Derived]:
        """The derived events caused by the lines starting in ``[start, end)``, in file order
        (only the latest ``keep`` to ``2 * keep`` events are kept)."""
        return self._items[bisect_left(self._offsets, start):bisect_left(self._offsets, end)]


def splice(items: Sequence[T], offsets: Sequence[int], derived: list[Derived],
           pick: Callable[[Derived], T]) -> Sequence[T]:
    """``items`` (a batch's records or lines, the one at ``offsets[i]`` in file order) with
    ``pick(d)`` of each derived event put at its anchor: after the line it follows, before the
    one it precedes (``derived`` in file order, as ``between`` gives them). A derived event whose
    line is not among them (it cannot be, when both come from the same range) goes last."""
    if not derived:
        return items
    items = items if isinstance(items, list) else list(items)  # (a batch's records, made once)
    # Where each event goes, by bisection (a batch has ~20,000 items and a few events: no loop
    # per item), never before the one ahead of it.
    out: list[T] = []
    at = 0
    for d in derived:
        cut = (bisect_left if d.before else bisect_right)(offsets, d.offset)
        if cut > at:
            out.extend(items[at:cut])
            at = cut
        out.append(pick(d))
    out.extend(items[at:])
    return out
