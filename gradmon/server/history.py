"""History answers: from a request's options to the encoded response body, in one call.

:func:`build_job` runs on the event loop and only takes what the answer needs, cheaply and
consistently with the run's cursor: the plan (``RunIndex.plan_history``: the pyramid's points, or
the byte range to read back) and a snapshot of the rest of the index. :func:`answer` does
everything proportional to the data — reading byte ranges back and decoding them
(``readback.py``), merging, the marks, eval, system and events of the range, JSON encoding and
gzip — and is a pure function of the job (file reads aside), which the server runs in a worker
process (``worker.py``) so that live pushes never wait for it.

:class:`HistoryOptions` is everything a request asks for, in one object: a new query option
(e.g. smoothing) is a field there, parsed in ``from_query`` and applied in ``answer``.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass
from typing import Any

from gradmon.logformat.jsonl import nonfinite_name
from gradmon.server.columns import MISSING, series_from_columns
from gradmon.server.index import IndexSnapshot
from gradmon.server.jsontext import finite_json, json_body
from gradmon.server.query import HistoryPlan
from gradmon.server.readback import Series, merge_series, series_from_lines
from gradmon.server.sidecar import ColumnsRef, read_rows
from gradmon.server.steps import Mark
from gradmon.server.tail import read_lines
from gradmon.server.targets import HttpError, int_param

__all__ = [
    "DEFAULT_POINTS", "MAX_POINTS", "HistoryJob", "HistoryOptions", "add_marks", "answer", "answer_series",
    "build_job",
]

DEFAULT_POINTS = 2000
MAX_POINTS = 100_000
_STEP_BOUND = 2**62


@dataclass(frozen=True)
class HistoryOptions:
    """What a history request asks for (docs/protocol.md): about ``points`` points per series of
    the steps in ``[start, end]`` (``None``: the run's first / last step)."""

    points: int = DEFAULT_POINTS
    start: int | None = None
    end: int | None = None

    @classmethod
    def from_query(cls, query: dict[str, list[str]]) -> HistoryOptions:
        """The options of a request's query parameters; ``HttpError(400)`` for bad ones."""
        points = int_param(query, "points", 4, MAX_POINTS) or DEFAULT_POINTS
        start = int_param(query, "start", -_STEP_BOUND, _STEP_BOUND)
        end = int_param(query, "end", -_STEP_BOUND, _STEP_BOUND)
        if start is not None and end is not None and start > end:
            raise HttpError(400, f"start ({start}) is after end ({end})")
        return cls(points, start, end)

    @property
    def lo(self) -> float:
        return -math.inf if self.start is None else self.start

    @property
    def hi(self) -> float:
        return math.inf if self.end is None else self.end


@dataclass
class HistoryJob:
    """Everything :func:`answer` needs, picklable: no reference to the live index."""

    run: str
    path: str
    cursor: dict[str, Any]  # {"gen", "offset"}: the file is complete up to here; nothing after it is read
    options: HistoryOptions
    plan: HistoryPlan
    index: IndexSnapshot
    gzip_ok: bool = False
    columns: ColumnsRef | None = None  # the sidecar's step-record columns, read instead of lines


def build_job(run: Any, options: HistoryOptions, gzip_ok: bool = False) -> HistoryJob:
    """Take what a history answer needs from a run (``runs.Run``) and its index, on the loop."""
    idx = run.index
    cursor = run.cursor()
    plan = idx.plan_history(options.lo, options.hi, options.points, cursor["offset"])
    columns = run.columns() if hasattr(run, "columns") else None
    return HistoryJob(run.name, run.path, cursor, options, plan, idx.snapshot(), gzip_ok, columns)


def add_marks(series: Series, marks: list[Mark]) -> None:
    """Put every mark's point into its series (so no spike or NaN is ever sampled away)."""
    extra: dict[str, list[tuple[int, float]]] = {}
    for step, _kind, name, value, _reason in marks:
        if value is not None and name in series:
            extra.setdefault(name, []).append((step, value))
    merge_series(series, {n: ([p[0] for p in pts], [p[1] for p in pts]) for n, pts in extra.items()})


def answer_series(job: HistoryJob) -> tuple[Series, bool]:
    """The series of the answer and whether they are exact: the plan's pyramid points merged with
    the edge buckets read back, or the planned byte range read back (and downsampled); with every
    mark of the range in its series unless exact."""
    plan, opts, end = job.plan, job.options, job.cursor["offset"]
    cols = job.columns
    if plan.kind == "pyramid":
        series = dict(plan.series)
        for lo_b, hi_b, s_lo, s_hi, keep_out in plan.edges:  # each: first/last/min/max of the steps kept
            if cols is not None:
                got = series_from_columns(*read_rows(cols, lo_b, min(hi_b, end)), s_lo, s_hi, 4,
                                          keep_out=keep_out)
            else:
                got = series_from_lines([(lo_b, read_lines(job.path, lo_b, min(hi_b, end)))], s_lo, s_hi, 4,
                                        keep_out=keep_out)
            merge_series(series, got[0])
        exact = False
    elif cols is not None:
        rows = _concat([read_rows(cols, lo, min(hi, end)) for lo, hi in plan.ranges if lo < end])
        series, exact = series_from_columns(*rows, opts.lo, opts.hi, opts.points, plan.replaced)
    else:
        parts = [(lo, read_lines(job.path, lo, min(hi, end))) for lo, hi in plan.ranges if lo < end]
        series, exact = series_from_lines(parts, opts.lo, opts.hi, opts.points, plan.replaced)
    if not exact:
        add_marks(series, job.index.visible_marks(opts.lo, opts.hi))
    return series, exact


def _concat(parts: list[tuple[array, array, bytes, dict[str, tuple[int, array]]]],
            ) -> tuple[array, array, bytes, dict[str, tuple[int, array]]]:
    """The rows of several byte ranges as one run of rows (``sidecar.read_rows`` of each)."""
    if len(parts) == 1:
        return parts[0]
    steps, offsets, flags = array("q"), array("q"), bytearray()
    cols: dict[str, tuple[int, array]] = {}
    for p_steps, p_offsets, p_flags, p_cols in parts:
        base = len(steps)
        for name, (first, values) in p_cols.items():
            have = cols.get(name)
            if have is None:
                cols[name] = have = (base + first, array("d"))
            pad = base + first - (have[0] + len(have[1]))
            have[1].extend(array("d", [MISSING]) * pad)
            have[1].extend(values)
        steps.extend(p_steps)
        offsets.extend(p_offsets)
        flags.extend(p_flags)
    return steps, offsets, bytes(flags), cols


def _plain_values(marks: list[dict]) -> list[dict]:
    """The marks with a non-finite ``value`` as its name, as the encoder would write it (so that
    the list is encoded in one call: a long run has hundreds of NaN and overflow marks)."""
    for m in marks:
        v = m["value"]
        if isinstance(v, float) and not math.isfinite(v):
            m["value"] = nonfinite_name(v)
    return marks


def _finite_numbers(values: list[float]) -> list | None:
    """``values`` with each non-finite one as its name, as the encoder would write it (so that the
    body is encoded in one call; a series holds a NaN where a mark's point was added, or the log's);
    ``None`` when they are not all numbers (or an integer is too big for a float): then the
    encoder's general path decides."""
    try:
        if math.isfinite(sum(values)):  # (one C pass: no NaN or infinity among them)
            return values
    except (OverflowError, TypeError):
        return None
    if not set(map(type, values)) <= {int, float}:
        return None
    return [x if x - x == 0 else nonfinite_name(x) for x in values]


def _points_json(points: dict[str, dict[str, list]]) -> tuple[dict[str, dict[str, list]], bytes | None]:
    """Named points (``{name: {"step": [...], "value": [...]}}``: the series, the system and eval
    fields) as plain data (non-finite numbers named) and, when every value is a number and orjson
    is installed, that data encoded by it (a 1 % zoom of a 2M-step run's series: ~1 ms, the
    stdlib ~6 ms; the system fields of an LLM run, a sample every step or two: ~1 ms, ~4 ms);
    ``None`` there: the stdlib encodes the plain data."""
    plain = {}
    proven = True
    for name, pts in points.items():
        values = pts["value"]
        got = _finite_numbers(values)
        proven = proven and got is not None and type(name) is str
        plain[name] = {"step": pts["step"], "value": values if got is None else got}
    return plain, finite_json(plain) if proven else None


def _series_json(series: Series) -> tuple[dict[str, dict[str, list]], bytes | None]:
    """:func:`_points_json` of the answer's ``series``."""
    return _points_json({name: {"step": steps, "value": values} for name, (steps, values) in series.items()})


def answer(job: HistoryJob) -> tuple[bytes, bool]:
    """The encoded response body of a history request, and whether it is gzip-compressed."""
    series, exact = answer_series(job)
    opts, idx = job.options, job.index
    lo, hi = opts.lo, opts.hi
    body = {
        "run": job.run,
        "cursor": job.cursor,
        "exact": exact,
        "start": opts.start if opts.start is not None else idx.min_step,
        "end": opts.end if opts.end is not None else idx.max_step,
        "points": opts.points,
        "eval": None,  # these three: encoded below
        "system": None,
        "layers": idx.layers,
        "marks": None,  # encoded below
        "events": None,  # encoded already: json_body places them
        "headers": idx.headers,
        "latest_segment": idx.latest_segment(),
        "malformed": idx.malformed,
        "marks_dropped": idx.marks_dropped,
        "events_dropped": idx.events_dropped,
        "series": None,
    }
    encoded: dict[str, list[bytes] | bytes] = {"events": idx.encoded_events_in(lo, hi)}
    marks = _plain_values(idx.marks_in(lo, hi))  # (no NaN left in them: by orjson when installed)
    for key, (plain, fast) in (("marks", (marks, finite_json(marks))),
                               ("eval", _points_json(idx.eval_in(lo, hi))),
                               ("system", _points_json(idx.system_in(lo, hi, opts.points))),
                               ("series", _series_json(series))):
        if fast is not None:
            encoded[key] = fast
        else:
            body[key] = plain
    return json_body(body, job.gzip_ok, encoded)
