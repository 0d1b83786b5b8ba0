"""A per-run index in bounded memory: fast history of a 10M-line run without holding it.

:class:`RunIndex` takes a run's lines a batch at a time (``parse.parse_lines`` decodes them) and
keeps what history and ``/api/runs`` need:

- step records: their numeric fields in the min/max pyramid, and their marks (``steps.py``,
  ``pyramid.py``);
- segments (a header starts one; ``segments.py``): a run resumed from an older checkpoint repeats
  steps, and for those the latest segment wins, step by step: an older segment's records at steps a
  later segment covers are replaced, with their marks, eval points, system points and events;
- eval records, events and headers whole, each capped; ``system`` records per field, capped
  min/max-preserving (``sampled.py``); of ``layers`` records only the latest;
- the alarms of segments whose writer does not run the alarm rule: the rule runs here, over every
  record in file order, and its events join the run's events (``derived.py``).

Queries are not answered here: :meth:`RunIndex.plan_history` passes the pyramid to
``query.plan_history``, and :meth:`RunIndex.snapshot` takes a picklable copy of the rest for
``history.answer`` (run in a worker process). Pure data structure: no I/O.
"""

from __future__ import annotations

import json
import math
from array import array
from bisect import bisect_left
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from operator import eq, itemgetter, ne
from typing import Any

from gradmon.logformat.schema import INT_MAX, INT_MIN, NOT_SERIES
from gradmon.logformat.values import finite, number, plain_floats
from gradmon.server.derived import DerivedAlarms
from gradmon.server.jsontext import dumps
from gradmon.server.parse import KeyColumns, ParsedLines, parse_lines
from gradmon.server.query import HistoryPlan, plan_history
from gradmon.server.sampled import SampledSeries
from gradmon.server.segments import Replaced, Segments
from gradmon.server.steprecords import StepRecords, records_at
from gradmon.server.steps import TS, Mark, StepSeries

__all__ = ["IndexSnapshot", "RunIndex"]

MAX_EVENTS = 5_000
MAX_HEADERS = 1_000
MAX_EVAL_POINTS = 200_000
MAX_SYSTEM_POINTS = 20_000  # per system field; past that a field is downsampled (min/max kept)
MAX_SYSTEM_FIELDS = 64
# Records whose place among a batch's step records does not change what the index holds (see
# RunIndex._add_mixed); the other kinds (header, event, end) order the step records around them.
_UNORDERED = frozenset({"system", "eval", "layers"})
_FLOAT = {float}
_INT = {int}


class _Stamps(Sequence):
    """Each record's ``ts`` (``None``: none), read from the record when asked for."""

    __slots__ = ("_recs",)

    def __init__(self, recs: Sequence[dict]) -> None:
        self._recs = recs

    def __len__(self) -> int:
        return len(self._recs)

    def __getitem__(self, i: Any) -> Any:
        return self._recs[i].get(TS)


class RunIndex:
    """Everything the server keeps about one run (one generation of its file)."""

    def __init__(self) -> None:
        self.records = 0
        self.malformed = 0
        self.first_ts: float | None = None
        self.last_ts: float | None = None
        self.header: dict | None = None
        self.ended: str | None = None  # status of the `end` record of the latest segment
        self.status_records = 0  # header and end records seen
        self.steps = StepSeries()
        self.segments = Segments()
        self.events: deque[dict] = deque(maxlen=MAX_EVENTS)
        self.event_segments: deque[int] = deque(maxlen=MAX_EVENTS)  # segment of each event
        # Each event as the history sends it (strict JSON, encoded once: a full-range answer of a
        # long run carries thousands of them) and its step (``None``: it has none).
        self.event_json: deque[bytes] = deque(maxlen=MAX_EVENTS)
        self.event_steps: deque[int | None] = deque(maxlen=MAX_EVENTS)
        self.events_dropped = 0
        self.headers: list[dict] = []
        self.eval: dict[str, tuple[list[int], list[float]]] = {}
        self.eval_segments: dict[str, array] = {}  # segment of each eval point
        self._eval_points = 0
        self.eval_dropped = 0
        self.system = SampledSeries(MAX_SYSTEM_POINTS, MAX_SYSTEM_FIELDS)
        self.layers: dict | None = None  # the latest `layers` record
        self.derived = DerivedAlarms()  # the alarm rule of segments whose writer does not run it

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if "event_json" not in state:  # a checkpoint written before events were kept encoded
            self.event_json = deque(map(_encoded, self.events), maxlen=MAX_EVENTS)
            self.event_steps = deque(map(_event_step, self.events), maxlen=MAX_EVENTS)

    # ---- building -------------------------------------------------------------------------

    def add_lines(self, lines: Sequence[tuple[int, bytes | None]], start: int) -> ParsedLines:
        """Decode and index a batch of lines (``(end_offset, line)`` pairs, the first line
        starting at byte ``start``); return what was decoded (invalid lines are counted in
        ``malformed``)."""
        parsed = parse_lines(lines, start)
        self.malformed += parsed.malformed
        recs, offsets, check = parsed.records, parsed.offsets, parsed.check
        if not recs:
            return parsed
        self.records += len(recs)
        cols = parsed.columns
        kinds = cols.values("type") if cols is not None else list(map(itemgetter("type"), recs))
        if kinds.count("step") == len(recs):  # the common batch: step records only
            self._add_steps(recs, offsets, check, cols)
        else:
            self._add_mixed(recs, offsets, check, kinds, parsed.step_columns)
        if isinstance(recs, StepRecords) and cols is not None and cols.records is recs:
            # (the compiled scanner's records are made when read: their ts as its float64 column
            # has them, values.number's reading, NaN where none; no object made per record)
            raw = cols.floats(TS)
            stamps: Sequence[Any] = memoryview(raw).cast("d") if raw is not None else []
        else:
            stamps = _Stamps(recs)
        self.last_ts = next((ts for v in reversed(stamps) if (ts := finite(v)) is not None), self.last_ts)
        if self.first_ts is None:
            self.first_ts = next((ts for v in stamps if (ts := finite(v)) is not None), None)
        return parsed

    def _add_mixed(self, recs: Sequence[dict], offsets: list[int], check: list[int], kinds: list[Any],
                   step_cols: KeyColumns | None) -> None:
        """A batch of step records and others, in file order: the step records between two records
        that order them (headers, events, ends: the kinds not in ``_UNORDERED``) go in together,
        then the others between those two (``system``, ``eval``, ``layers``: what they hold does
        not depend on the steps around them), then the ordering record. A ``system`` record that
        could make a field compact (``SampledSeries.room_left``: which points a compaction drops
        depends on the segments as they are then) orders the records around it too, as fed line
        by line; the room is counted again after each."""
        if step_cols is None and not isinstance(recs, list):
            recs = list(recs)  # (the compiled scanner's records, read one by one below: made at once)
        others = list(compress(range(len(recs)), map(ne, kinds, repeat("step"))))  # (no loop per record)
        ordering = [j for j in others if kinds[j] not in _UNORDERED]
        system_at = [j for j in others if kinds[j] == "system"]
        at = list(compress(range(len(recs)), map(eq, kinds, repeat("step"))))  # the step records' positions
        a = 0  # how many step records the stretches before this one held
        k = 0  # how many other records the stretches before this one held
        o = 0  # how many ordering records they held
        n_sys = 0  # how many system records they held
        i = 0
        while i <= len(recs):
            j = ordering[o] if o < len(ordering) else len(recs)
            room = self.system.room_left()
            if n_sys + room < len(system_at) and system_at[n_sys + room] < j:
                j = system_at[n_sys + room]  # (the first that could compact a field: in its place)
            elif j < len(recs):
                o += 1
            b = bisect_left(at, j, a)  # the step records [a, b) lie before j
            if b > a:
                run_cols = step_cols.sliced(a, b) if step_cols is not None else None
                pos = at[a:b]
                c0, c1 = bisect_left(check, i), bisect_left(check, j)
                self._add_steps(run_cols.records if run_cols is not None else records_at(recs, pos),
                                list(map(offsets.__getitem__, pos)) if b - a != j - i else offsets[i:j],
                                [bisect_left(pos, c) for c in check[c0:c1] if kinds[c] == "step"],
                                run_cols)
            stop = bisect_left(others, j, k)  # the others of this stretch: others[k:stop], in order
            if stop > k:
                stretch = others[k:stop]
                stretch_kinds = list(map(kinds.__getitem__, stretch))
                if stretch_kinds.count("system") == len(stretch):  # (a real run's usual stretch: at once)
                    self._add_systems(records_at(recs, stretch))
                    n_sys += len(stretch)
                else:
                    system_recs = []  # (this stretch's system records, together)
                    for x, kind in zip(stretch, stretch_kinds):
                        if kind == "system":
                            system_recs.append(recs[x])
                            n_sys += 1
                        else:
                            self._add_other(recs[x], offsets[x])
                    if system_recs:
                        self._add_systems(system_recs)
                k = stop
            if j < len(recs):
                self._add_other(recs[j], offsets[j])
                n_sys += kinds[j] == "system"
                k += 1
            a, i = b, j + 1

    def _add_steps(self, recs: Sequence[dict], offsets: list[int], check: list[int],
                   columns: KeyColumns | None = None) -> None:
        if columns is None or columns.records is not recs:
            columns = KeyColumns(recs)  # (taken once here, shared by the pyramid and the alarm rule)
        self.segments.note_steps(*self.steps.add(recs, offsets, check, self.segments.current, columns))
        self._add_events(self.derived.steps(recs, offsets, columns))

    def _add_other(self, rec: dict, offset: int) -> None:
        kind = rec["type"]
        if kind == "header":
            self._add_events(self.derived.header(rec, offset))  # the previous segment's, before it ends
            self.steps.close_bucket()  # no base bucket holds two segments
            self.segments.start(offset, self.steps.pyramid.base.size)
            self.status_records += 1
            self.header = rec
            self.ended = None
            if len(self.headers) < MAX_HEADERS:
                self.headers.append(rec)
        elif kind == "eval":
            self._add_eval(rec)
        elif kind == "system":
            self._add_system(rec)
        elif kind == "layers":
            self.layers = rec
        elif kind == "event":
            self._add_events([rec])
            self._add_events(self.derived.record(rec, offset))
        elif kind == "end":
            self._add_events(self.derived.record(rec, offset))
            self.status_records += 1
            self.ended = rec.get("status") if isinstance(rec.get("status"), str) else "finished"

    def _add_events(self, events: list[dict]) -> None:
        for ev in events:
            if len(self.events) == self.events.maxlen:
                self.events_dropped += 1
            self.events.append(ev)
            self.event_segments.append(self.segments.current)
            self.event_json.append(_encoded(ev))
            self.event_steps.append(_event_step(ev))

    def _add_eval(self, rec: dict) -> None:
        step = rec.get("step")
        if not isinstance(step, int):
            return
        for name, raw in rec.items():
            if name in NOT_SERIES:
                continue
            v = number(raw)
            if v is None:
                continue
            if self._eval_points >= MAX_EVAL_POINTS:
                self.eval_dropped += 1
                continue
            steps, values = self.eval.setdefault(name, ([], []))
            steps.append(step)
            values.append(v)
            self.eval_segments.setdefault(name, array("I")).append(self.segments.current)
            self._eval_points += 1

    def _add_systems(self, recs: list[dict]) -> None:
        """``_add_system`` of each of ``recs`` (system records of the current segment), a field at
        a time (``SampledSeries.add_columns``); only where none of the fields can be compacted
        meanwhile (``SampledSeries.room_left``)."""
        cols = KeyColumns(recs)
        steps = cols.values("step")
        if not (cols.types("step") == _INT and _system_step(min(steps)) and _system_step(max(steps))):
            recs = [r for r in recs if _system_step(r.get("step"))]  # (else every step is kept)
            if not recs:
                return
            cols = KeyColumns(recs)
        columns = {}
        for name in cols.key_set():  # (any order: add_columns makes new fields in the records' order)
            if name not in NOT_SERIES:
                values = cols.values(name)
                if cols.types(name) != _FLOAT:  # (ints read in C when every value is a plain number)
                    got = plain_floats(values, finite_only=False)
                    values = got if got is not None else list(map(number, values))
                columns[name] = values
        self.system.add_columns(cols.values("step"), columns, recs, self.segments.current)

    def _add_system(self, rec: dict) -> None:
        step = rec.get("step")
        if not _system_step(step):
            return
        values = [(name, v) for name, raw in rec.items()
                  if name not in NOT_SERIES and (v := number(raw)) is not None]
        self.system.add(step, values, self.segments.current, self.segments.replaced)

    # ---- what queries take ----------------------------------------------------------------

    def plan_history(self, start: float, end: float, points: int, cursor: int) -> HistoryPlan:
        """``query.plan_history`` on this index (see there)."""
        steps = self.steps
        try:
            return plan_history(steps.pyramid, steps.open_summary(), self.segments, steps.series_names(),
                                start, end, points, cursor)
        finally:
            steps.pyramid.release()

    def snapshot(self) -> IndexSnapshot:
        """A copy of what a history answer takes from the index besides the series (cheap: no
        filtering here, that is the worker's)."""
        return IndexSnapshot(
            replaced=self.segments.replaced(), latest_span=self.segments.latest_span(),
            marks=list(self.steps.marks),
            mark_segments=array("I", self.steps.mark_segments),
            eval={n: (list(s), list(v)) for n, (s, v) in self.eval.items()},
            eval_segments={n: array("I", a) for n, a in self.eval_segments.items()},
            system=self.system.copy(), events=list(self.event_json), event_steps=list(self.event_steps),
            event_segments=list(self.event_segments),
            headers=list(self.headers),
            layers=self.layers, malformed=self.malformed, marks_dropped=self.steps.marks_dropped,
            events_dropped=self.events_dropped, min_step=self.steps.min_step, max_step=self.steps.max_step,
        )

    def stats(self) -> dict[str, Any]:
        """Sizes of what the index holds (for ``GradmonServer.stats`` and benchmarks)."""
        return {"records": self.records, "step_records": self.steps.count, "malformed": self.malformed,
                "levels": [lvl.size for lvl in self.steps.pyramid.levels], "fields": len(self.steps.fields),
                "marks": len(self.steps.marks), "events": len(self.events),
                "derived_events": self.derived.count}

    def summary(self) -> dict[str, Any]:
        """The index's part of a run's ``/api/runs`` entry."""
        return {
            "records": self.records,
            "malformed": self.malformed,
            "last_step": self.steps.last_step,
            "first_ts": self.first_ts,
            "last_ts": self.last_ts,
            "header": self.header,
            "fields": list(self.steps.fields),
            "eval_fields": list(self.eval),
            "system_fields": self.system.names(),
        }


@dataclass
class IndexSnapshot:
    """What a history answer takes from a :class:`RunIndex` besides the series, at one moment:
    picklable, answered anywhere (``replaced``: ``Segments.replaced()``, what later segments
    replaced; ``latest_span``: the latest segment's first and last step)."""

    replaced: Replaced
    latest_span: tuple[int, int] | None
    marks: list[Mark]
    mark_segments: array
    eval: dict[str, tuple[list[int], list[float]]]
    eval_segments: dict[str, array]
    system: SampledSeries
    events: list[bytes]  # each event encoded (RunIndex.event_json)
    event_steps: list[int | None]
    event_segments: list[int]
    headers: list[dict]
    layers: dict | None
    malformed: int
    marks_dropped: int
    events_dropped: int
    min_step: int | None
    max_step: int | None

    def visible_marks(self, start: float, end: float) -> list[Mark]:
        """The marks with steps in ``[start, end]`` that no later segment replaced."""
        rep = self.replaced
        if not rep.any:  # (one segment, or none replaced anything: the common run)
            return [m for m in self.marks if start <= m[0] <= end]
        return [m for m, k in zip(self.marks, self.mark_segments)
                if start <= m[0] <= end and not rep.hides(k, m[0])]

    def marks_in(self, start: float, end: float) -> list[dict]:
        """The visible marks as the history sends them, in step order."""
        out = []
        for s, k, f, v, reason in sorted(self.visible_marks(start, end), key=itemgetter(0)):
            mark = {"step": s, "kind": k, "field": f, "value": v}
            if reason is not None:
                mark["reason"] = reason
            out.append(mark)
        return out

    def eval_in(self, start: float, end: float) -> dict[str, dict[str, list]]:
        out = {}
        rep = self.replaced
        for name, (steps, values) in self.eval.items():
            segs = self.eval_segments[name]
            idx = [i for i, s in enumerate(steps) if start <= s <= end and not rep.hides(segs[i], s)]
            idx.sort(key=steps.__getitem__)  # file order is step order unless a segment went back
            out[name] = {"step": [steps[i] for i in idx], "value": [values[i] for i in idx]}
        return out

    def system_in(self, start: float, end: float, points: int) -> dict[str, dict[str, list]]:
        """The system fields' points with steps in ``[start, end]`` (latest segment wins), each
        downsampled min/max-preserving to about ``points`` when it has more."""
        return self.system.query(start, end, points, self.replaced)

    def events_in(self, start: float, end: float) -> list[dict]:
        """The events with steps in ``[start, end]`` (and those without a step), less those of a
        segment at a step a later segment replaced: they go with their steps."""
        return [json.loads(ev) for ev in self.encoded_events_in(start, end)]

    def encoded_events_in(self, start: float, end: float) -> list[bytes]:
        """:meth:`events_in`, each event as the strict JSON the history sends."""
        rep = self.replaced
        if not rep.any:  # (one segment, or none replaced anything: the common run)
            if start == -math.inf and end == math.inf:
                return list(self.events)
            return [ev for ev, s in zip(self.events, self.event_steps) if s is None or start <= s <= end]
        return [ev for ev, s, k in zip(self.events, self.event_steps, self.event_segments)
                if s is None or (start <= s <= end and not rep.hides(k, s))]

    def latest_segment(self) -> dict[str, int | None]:
        """The latest segment's first and last step (``None`` before its first step)."""
        first, last = self.latest_span if self.latest_span is not None else (None, None)
        return {"first_step": first, "last_step": last}



def _system_step(step: Any) -> bool:
    """Whether a system record's ``step`` is one its series keeps: an int an array can hold (else
    it was sampled before the first step, with no ``step``, or holds a step no array can)."""
    return type(step) is int and INT_MIN <= step <= INT_MAX


def _encoded(event: dict) -> bytes:
    return dumps(event).encode("utf-8")


def _event_step(event: dict) -> int | None:
    s = event.get("step")
    return s if isinstance(s, int) else None
