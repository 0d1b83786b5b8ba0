"""The alarm rule over batches of step records, for the server's ingest: the same events as
:class:`gradmon.logformat.alarms.AlarmRule` fed record by record, at a fraction of the cost.

``AlarmRule.update`` costs ~3-5 µs per step record in pure Python (a sorted window insert per
series, and the judging of every step), more than the index itself spends per record. Nearly every
step of a run is plain (finite values) and cannot be flagged, and that can be proven for a whole
stretch of records at once, with C builtins, from two facts of the rule (docs/format.md, "Alarms"):

- a norm is flagged only when it is above ``norm_over_max`` times the envelope E (the largest
  unflagged norm among the last ``window``), and a loss only when it is above its E and its jump
  above the median m is more than ``loss_over_max`` times E - m;
- E at any step of a chunk of at most ``window // 2`` records is at least the largest unflagged
  value among the newest ``window - chunk`` values before the chunk, and at least every earlier
  value of the chunk itself (none of those leave the window within the chunk); m is at most an
  order statistic of the window and the chunk together (``WindowBaseline.median_ceiling``).

So a chunk is screened with ``accumulate(max)`` and a few ``map`` calls; the first record that is
not proven quiet (a *candidate*), and every record that is not plain (a non-finite or non-numeric
value, a zero norm, a ``nonfinite`` flag without a norm, steps that do not increase), goes through
``AlarmRule.update`` itself, which then judges it against the exact median and envelope. The
baselines are :class:`WindowBaseline`: a plain window that appends in O(1) (a C ``deque.extend`` for
a stretch) and computes its median and envelope only when asked. Equivalence with the plain rule
is tested on random series (tests/test_alarms_server.py). On ``benchmarks/runlogs.py``'s log the
rule costs ~0.5 µs per step record, a fifth of the index's own (``python -m
benchmarks.index_alarms``). Pure: no I/O.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque
from collections.abc import Iterable, Sequence
from itertools import accumulate, chain, compress, count, islice, repeat
from operator import gt, mul, sub
from typing import Any, Optional

from gradmon.logformat.alarms import ZERO_NORM, AlarmConfig, AlarmRule, is_zero_norm
from gradmon.logformat.values import number
from gradmon.server.native import scanner as _native_scanner
from gradmon.server.parse import KeyColumns

__all__ = ["BatchAlarmRule", "WindowBaseline"]

_NUMBER_TYPES = frozenset({float, int})
_NONE = type(None)
_NO_VALUE = frozenset({_NONE})
_FLOAT = {float}
_INF = math.inf


class WindowBaseline:
    """The last ``window`` finite values of a series, like :class:`gradmon.logformat.alarms.RunningBaseline`
    (same ``len``, ``median``, ``envelope``, ``add``), built for bulk appends: a value costs an
    append, the median and the envelope are computed when asked (and cached until the next value).
    Flagged values are rare: their arrival numbers are kept to leave them out of the envelope."""

    def __init__(self, window: int) -> None:
        self.window = window
        self._recent: deque[float] = deque(maxlen=window)
        self._count = 0  # values added so far (the next one's arrival number)
        self._flagged: deque[int] = deque()  # arrival numbers of the flagged values, ascending
        self._median: tuple[int, float] | None = None  # (count when computed, median)
        self._envelope: tuple[int, float] | None = None

    def __len__(self) -> int:
        return len(self._recent)

    @property
    def recent(self) -> deque[float]:
        """The window's values, oldest first (a deque nobody may change)."""
        return self._recent

    @property
    def seen(self) -> int:
        """Values added since the start (not only those still in the window)."""
        return self._count

    def add(self, value: float, flagged: bool = False) -> None:
        """Take a finite ``value``; a ``flagged`` one counts for the median but not the envelope."""
        if flagged:
            self._flagged.append(self._count)
        self._recent.append(value)
        self._count += 1

    def extend(self, values: list[float]) -> None:
        """Take finite unflagged ``values`` in order (one C call)."""
        self._recent.extend(values)
        self._count += len(values)

    def median(self) -> float:
        cached = self._median
        if cached is not None and cached[0] == self._count:
            return cached[1]
        native = _native_scanner()
        value = native.median(self._recent) if native is not None else None  # (a selection, not a sort)
        if value is None:
            s = sorted(self._recent)
            n = len(s)
            mid = n // 2
            value = math.nan if n == 0 else s[mid] if n % 2 else 0.5 * (s[mid - 1] + s[mid])
        self._median = (self._count, value)
        return value

    def envelope(self) -> float:
        """The largest unflagged value among the last ``window`` (the median when all were flagged)."""
        cached = self._envelope
        if cached is not None and cached[0] == self._count:
            return cached[1]
        top = self.lower_envelope(len(self._recent))
        value = top if top > -_INF else self.median()
        self._envelope = (self._count, value)
        return value

    def median_ceiling(self, new: list[float]) -> float:
        """An upper bound of the median while the values ``new`` are added, after any number of
        them (``inf`` when empty). The window then holds ``n >= len(self)`` values, all among the
        old and new ones (U), and its median is at most its ``n // 2``-th smallest, so at most U's
        ``(|U| - ceil(len(self) / 2))``-th smallest."""
        n0 = len(self._recent)
        if not n0:
            return _INF
        return _kth_of_both(n0 + len(new) - (n0 - n0 // 2), self._recent, new)

    def median_ceiling_after(self, learnt: list[float], new: list[float]) -> float:
        """:meth:`median_ceiling` of ``new`` once ``learnt`` (unflagged values) are added first."""
        if not learnt:
            return self.median_ceiling(new)
        keep = self.window - len(learnt)
        recent = self._recent
        held = learnt[-self.window:] if keep <= 0 else \
            [*islice(recent, max(0, len(recent) - keep), None), *learnt]
        n0 = len(held)
        return _kth_of_both(n0 + len(new) - (n0 - n0 // 2), held, new)

    def lower_envelope(self, newest: int) -> float:
        """The largest unflagged value among the newest ``newest`` values (``-inf`` when none)."""
        newest = min(newest, len(self._recent))
        if newest <= 0:
            return -_INF
        first = self._count - newest  # arrival number of the oldest value looked at
        flagged = self._flagged
        while flagged and flagged[0] < self._count - self.window:
            flagged.popleft()  # left the window
        values = islice(self._recent, len(self._recent) - newest, None)
        if not flagged or flagged[-1] < first:
            return max(values)
        marked = set(flagged)
        kept = [v for i, v in enumerate(values, first) if i not in marked]
        return max(kept) if kept else -_INF


class BatchAlarmRule(AlarmRule):
    """:class:`gradmon.logformat.alarms.AlarmRule` with :meth:`update_steps`, which takes a batch of step
    records and returns the same events, each with the position of the record that caused it.
    ``update`` and ``finish`` work as in the parent (headers, ``abort`` events, the end of a run)."""

    def __init__(self, config: AlarmConfig | None = None) -> None:
        super().__init__(config)
        config = self.config
        # Chunks of at most half a window: the newest half of the window before a chunk stays in
        # it throughout the chunk, a lower bound on the envelope. The loss screen needs
        # loss_over_max >= 1 (a flagged loss is then above its envelope), the norm screen a factor > 0.
        self.chunk = max(1, config.window // 2)
        self.bulk = config.window >= 2 and config.norm_over_max > 0 and config.loss_over_max >= 1

    def _reset(self) -> None:
        super()._reset()
        # The parent judges with these (len, median, envelope, add); the bulk path appends to them.
        self.norm_window = self.norms = WindowBaseline(self.config.window)  # type: ignore[assignment]
        self.loss_window = self.losses = WindowBaseline(self.config.window)  # type: ignore[assignment]

    def update_steps(self, records: Sequence[dict[str, Any]],
                     columns: KeyColumns | None = None) -> list[tuple[int, dict[str, Any]]]:
        """Feed consecutive ``step`` records (in file order); return ``(position, event)`` pairs:
        the events ``update`` would return for each record, with that record's position
        (``columns``: the records' values by key when taken already, ``parse.KeyColumns``)."""
        out: list[tuple[int, dict[str, Any]]] = []
        if columns is None or columns.records is not records:
            columns = KeyColumns(records)
        steps = columns.values("step")  # (an int in every step record: parse.py)
        last = self._last_step
        if not records or not self.bulk or not (last is None or steps[0] > last) or not columns.increasing():
            self._one_by_one(records, 0, len(records), out)
            return out
        loss_types, norm_types = columns.types("loss"), columns.types("grad_norm")
        losses, odd_losses = _column(columns.values("loss"), loss_types)
        norms, odd_norms = _column(columns.values("grad_norm"), norm_types)
        scales = columns.values("loss_scale") if "loss_scale" in columns.key_set() else None
        cols = (losses, norms, None if scales is None or scales.count(None) == len(scales) else scales)
        # (None in a column of floats is found by its types: ``in`` compares every float with None)
        sparse = (_NONE in loss_types, _NONE in norm_types)
        odd = {*odd_losses, *odd_norms, *(_flag_without_norm(columns, norms) if sparse[1] else ())}
        # Zero norms with a finite loss (or none): nothing judges or learns them but the loss scale.
        zeros = set(_zero_norms(columns, norms, norm_types)).difference(odd)
        # (the compiled scanner's float64 columns: the quiet-chunk screen's maxima in one C call)
        floats = (columns.floats("loss"), columns.floats("grad_norm")) if not any(sparse) else None
        for lo, hi, kind in _stretches(len(records), odd, zeros):
            if kind == _PLAIN:
                self._plain(records, steps, cols, lo, hi, out, sparse, floats)
            elif kind == _ODD:
                self._one_by_one(records, lo, hi, out)
            else:
                self._learn_zero_norms(steps, cols[2], lo, hi, out)
        return out

    def _one_by_one(self, records: Sequence[dict[str, Any]], lo: int, hi: int,
                    out: list[tuple[int, dict[str, Any]]]) -> None:
        if hi - lo == 1:  # (the common call, a flagged record: by its index, not a one-record slice)
            part: Sequence[dict[str, Any]] = [records[lo]]
        else:
            part = records[lo:hi]  # (a slice: the scanner's records made at once)
        for i, record in enumerate(part, lo):
            out.extend((i, e) for e in self.update(record))

    def _plain(self, records: Sequence[dict[str, Any]], steps: list[int], columns: _Columns, lo: int, hi: int,
               out: list[tuple[int, dict[str, Any]]], sparse: tuple[bool, bool] | None = None,
               floats: _Floats | None = None) -> None:
        """Records ``[lo, hi)``: increasing steps, every loss and norm a finite number or absent
        (``sparse``: whether some loss, some norm may be absent; ``None``: look; ``floats``: the
        loss and norm columns as float64s, when the compiled scanner took them).
        Chunk by chunk: learn up to the first candidate in bulk, judge that one by the parent."""
        losses, norms, scales = columns
        sparse_loss, sparse_norm = (None in losses, None in norms) if sparse is None else sparse
        config = self.config
        while lo < hi:
            if not (sparse_loss or sparse_norm):
                quiet = self._quiet_chunks(losses, norms, lo, hi, floats)
                if quiet > lo:  # whole chunks proven quiet: learnt in one go
                    self._learn_quiet(steps, (None, losses[lo:quiet]), (None, norms[lo:quiet]), scales,
                                      lo, quiet, out)
                    lo = quiet
                    if lo == hi:
                        break
            end = min(hi, lo + self.chunk)
            loss = _present(losses[lo:end], sparse_loss)
            norm = _present(norms[lo:end], sparse_norm)
            cut = end - lo  # the first candidate, relative to lo
            if norm[1]:
                cut = self._first_candidate(norm, self.norm_window, config.norm_over_max, 1.0, cut)
            if loss[1]:
                cut = self._first_candidate(loss, self.loss_window, 1.0, config.loss_over_max, cut)
            if cut:
                self._learn_quiet(steps, loss, norm, scales, lo, lo + cut, out)
            lo += cut
            if lo < end:
                self._one_by_one(records, lo, lo + 1, out)
                lo += 1

    def _quiet_chunks(self, losses: list[float], norms: list[float], lo: int, hi: int,
                      floats: _Floats | None = None) -> int:
        """The end of the chunks from ``lo`` (of ``self.chunk`` records, the last one up to ``hi``)
        that the screen of :meth:`_first_candidate` proves quiet one after the other, every record
        having a loss and a norm: for each, only the largest loss and norm are compared (one C call
        each, or one for all the chunks from ``floats``: the columns as float64s). The first
        chunk's floors are the baselines' (``lower_envelope``); a later one's are the chunk
        before's largest values: those are among the newest ``window - chunk`` values when it is
        judged (``chunk <= window - chunk``), none flagged."""
        config = self.config
        norm_window, loss_window = self.norm_window, self.loss_window
        if len(norm_window) < config.min_history or len(loss_window) < config.min_history:
            return lo  # (some records are not judged yet: the chunk by chunk path knows which)
        chunk = self.chunk
        factor, over = config.norm_over_max, config.loss_over_max
        norm_floor = norm_window.lower_envelope(config.window - chunk)
        loss_floor = loss_window.lower_envelope(config.window - chunk)
        native = _native_scanner() if floats is not None and None not in floats else None
        if native is not None:  # (each chunk's largest norm and loss, as max() of its values)
            norm_tops = iter(native.chunk_maxima(floats[1], lo, hi, chunk))  # type: ignore[index]
            loss_tops = iter(native.chunk_maxima(floats[0], lo, hi, chunk))  # type: ignore[index]
        end = lo
        while end < hi:
            stop = min(hi, end + chunk)
            top_norm = next(norm_tops) if native is not None else max(norms[end:stop])
            if top_norm > factor * norm_floor:
                break
            top_loss = next(loss_tops) if native is not None else max(losses[end:stop])
            if top_loss > loss_floor:
                # (a flagged loss is also above over * E - (over - 1) * m: the median's ceiling,
                # with the window as it is once the chunks before are learnt)
                new = losses[end:stop]
                ceiling = loss_window.median_ceiling_after(losses[lo:end], new) if over > 1 else _INF
                if ceiling == _INF or top_loss > over * loss_floor - (over - 1) * ceiling:
                    break
            norm_floor, loss_floor = top_norm, top_loss
            end = stop
        return end

    def _first_candidate(self, present: _Present, baseline: WindowBaseline, factor: float, over: float,
                         limit: int) -> int:
        """The position of the first value of the chunk that the rule could flag, if before
        ``limit`` (else ``limit``). With E the envelope and m the median when it is judged, a flagged norm is
        above ``factor`` (``norm_over_max``) times E; a flagged loss is above E (``factor`` 1) and
        above ``over * E - (over - 1) * m`` (its jump above m is more than ``over``
        (``loss_over_max``) times E - m). E is at least the largest earlier value of the chunk and
        the chunk's floor (``lower_envelope``); m at most the chunk's ``median_ceiling``."""
        positions, values = present
        judged_from = max(0, self.config.min_history - len(baseline))  # earlier ones are not judged
        if judged_from >= len(values):
            return limit
        floor = baseline.lower_envelope(self.config.window - self.chunk)
        if judged_from == 0 and max(values) <= factor * floor:  # the common chunk: one C call
            return limit
        highs = list(accumulate(values, max))  # the largest value up to each one ...
        highs.insert(0, -_INF)  # ... and before each one
        highs.pop()
        lows = list(map(max, repeat(floor), highs))  # lower bounds of E at each value
        bounds: Iterable[float] = map(mul, repeat(factor), lows)
        if over > 1:
            ceiling = baseline.median_ceiling(values)
            if ceiling < _INF:
                shift = (over - 1) * ceiling
                bounds = map(max, bounds, map(sub, map(mul, repeat(over), lows), repeat(shift)))
        hits = compress(count(), map(gt, values, bounds))
        k = next((k for k in hits if k >= judged_from), None)
        return limit if k is None else min(limit, k if positions is None else positions[k])

    def _learn_quiet(self, steps: list[int], loss: _Present, norm: _Present, scales: list[Any] | None,
                     lo: int, hi: int, out: list[tuple[int, dict[str, Any]]]) -> None:
        """Records ``[lo, hi)`` of a chunk, none of which the rule flags: what the parent's
        ``update`` does for each (close an incident that went quiet, ``_learn``), in bulk."""
        incident = self._incident
        if incident is not None:
            quiet_after = incident["last"] + self.config.quiet_steps
            k = next(compress(count(lo), map(gt, islice(steps, lo, hi), repeat(quiet_after))), None)
            if k is not None:
                out.append((k, self._end_event()))
        if norm[1]:
            self._extend_sampled(self.norm_window, _before(norm, hi - lo), loss=False)
            if scales is not None:
                positions = norm[0]
                self._learn_scales(scales[lo:hi] if positions is None else
                                   [scales[lo + p] for p in positions if p < hi - lo])
        if loss[1]:
            self._extend_sampled(self.loss_window, _before(loss, hi - lo), loss=True)
        self._last_step = steps[hi - 1]

    def _learn_zero_norms(self, steps: list[int], scales: list[Any] | None, lo: int, hi: int,
                          out: list[tuple[int, dict[str, Any]]]) -> None:
        """Records ``[lo, hi)``, each with a zero norm and a finite loss or none: what the parent's
        ``update`` does for each (close an incident that went quiet, count its loss scale), in bulk."""
        self._learn_quiet(steps, _NOTHING, _NOTHING, None, lo, hi, out)
        if scales is not None:
            self._learn_scales(scales[lo:hi])

    def _extend_sampled(self, window: WindowBaseline, values: list[float], loss: bool) -> None:
        """Append unflagged values of one series in bulk, stopping at each count where the
        parent's ``_learn`` samples the running median for the run's scale (``is_scale_sample``:
        the ``min_history``-th value and every ``window``-th)."""
        config = self.config
        seen = window.seen
        end = seen + len(values)
        first = (seen // config.window + 1) * config.window
        if first > end and not seen < config.min_history <= end:  # the common call: no sample in it
            window.extend(values)
            return
        points = sorted({*range(first, end + 1, config.window),
                         *([config.min_history] if seen < config.min_history <= end else [])})
        native = _native_scanner()
        medians = native.window_medians(window.recent, values, [p - seen for p in points], window.window) \
            if native is not None else None
        if medians is not None:  # (the medians at every point in one C call, as the loop below gives them)
            window.extend(values)
            if loss:
                self.loss_scale = max([self.loss_scale, *map(abs, medians)])
            else:
                self.norm_scale = max([self.norm_scale, *medians])
            return
        start = 0
        for point in points:
            window.extend(values[start:point - seen])
            if loss:
                self.loss_scale = max(self.loss_scale, abs(window.median()))
            else:
                self.norm_scale = max(self.norm_scale, window.median())
            start = point - seen
        window.extend(values[start:])

    def _learn_scales(self, scales: list[Any]) -> None:
        """The loss-scale bookkeeping of the parent's ``_learn``: the scales of records with a norm."""
        proven = self.config.overflow_proven_steps
        for raw in scales:
            if type(raw) not in _NUMBER_TYPES:
                continue
            scale = number(raw)
            run = self._scale_run
            n = run[1] + 1 if run is not None and run[0] == scale else 1
            self._scale_run = (scale, n)
            if n >= proven:
                self._proven_scale = scale


# A batch's loss and norm columns as float64s (``parse.KeyColumns.floats``; ``None``: not taken).
_Floats = tuple[Optional[Any], Optional[Any]]
# A batch's loss, norm and loss-scale columns (the scales ``None`` when no record has one).
_Columns = tuple[list[Any], list[Any], Optional[list[Any]]]
# A chunk's values of one judged series and the positions (in the chunk) of the records that have
# one (``None``: every record has one).
_Present = tuple[Optional[list[int]], list[float]]


_NOTHING: _Present = (None, [])
# The kinds of stretch of a batch (``_stretches``).
_PLAIN, _ODD, _ZERO = "plain", "odd", "zero"


def _stretches(n: int, odd: set[int], zeros: set[int]) -> list[tuple[int, int, str]]:
    """Records ``[0, n)`` as consecutive ``(lo, hi, kind)`` stretches: each position of ``odd``
    alone (``_ODD``), each run of consecutive positions of ``zeros`` (``_ZERO``; none in
    ``odd``), and the plain records between them (``_PLAIN``)."""
    out: list[tuple[int, int, str]] = []
    lo = 0
    for i in sorted(odd | zeros):
        if i in zeros and out and out[-1][2] == _ZERO and out[-1][1] == i:
            out[-1] = (out[-1][0], i + 1, _ZERO)
        else:
            if i > lo:
                out.append((lo, i, _PLAIN))
            out.append((i, i + 1, _ZERO if i in zeros else _ODD))
        lo = i + 1
    if lo < n:
        out.append((lo, n, _PLAIN))
    return out


def _column(values: list[Any], types: set[type]) -> tuple[list[Any], list[int]]:
    """A field's values (``values``: ``None`` where absent, not changed here; ``types``: theirs;
    integers as floats, as the rule takes them), and the positions of values that are neither
    absent nor a finite number (bools, text, NaN, inf, integers too big for a float): those records
    go through ``AlarmRule.update``."""
    if types == _FLOAT:  # the common column: C calls only
        if math.isfinite(sum(values)):
            return values, []
        return values, [i for i, v in enumerate(values) if not _finite_number(v)]
    absent = values.count(None)
    if absent == len(values):
        return values, []
    if types <= _NUMBER_TYPES | _NO_VALUE:
        if int in types:
            values = [float(v) if type(v) is int and _finite_number(v) else v for v in values]
        try:
            if math.isfinite(sum(filter(None, values)) if absent else sum(values)):
                return values, []
        except OverflowError:
            pass
    return values, [i for i, v in enumerate(values) if v is not None and not _finite_number(v)]


def _zero_norms(columns: KeyColumns, norms: list[Any], types: set[type]) -> list[int]:
    """Positions of the records whose norm is zero (``alarms.is_zero_norm``; ``norms``: as
    :func:`_column` gives them): one pass in C over the scanner's float64 column, else a ``min``."""
    native = _native_scanner()
    floats = columns.floats("grad_norm") if native is not None else None
    if floats is not None:
        return native.rows_in(floats, 0.0, ZERO_NORM)  # type: ignore[union-attr]
    if types == _FLOAT and min(norms, default=_INF) > ZERO_NORM:
        return []
    return [i for i, v in enumerate(norms) if _finite_number(v) and is_zero_norm(v)]


def _kth_of_both(k: int, a: Sequence[float], b: Sequence[float]) -> float:
    """``sorted(chain(a, b))[k]``: by a selection in C where it gives the same (a chunk's median
    ceiling sorted ~300 values, for every chunk whose loss rose above its floor)."""
    native = _native_scanner()
    got = native.order_statistic(k, a, b) if native is not None else None
    return got if got is not None else sorted(chain(a, b))[k]


def _present(values: list[Any], sparse: bool) -> _Present:
    if not sparse:
        return None, values
    positions = [i for i, v in enumerate(values) if v is not None]
    return positions, [values[i] for i in positions]


def _before(present: _Present, end: int) -> list[float]:
    """The values of the records before position ``end`` of the chunk."""
    positions, values = present
    return values[:end] if positions is None else values[:bisect_left(positions, end)]


def _finite_number(v: Any) -> bool:
    if type(v) not in _NUMBER_TYPES:
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def _flag_without_norm(columns: KeyColumns, norms: list[Any]) -> Iterable[int]:
    """Positions of records with no norm and the ``nonfinite`` flag (flagged by the rule)."""
    if None not in norms or "nonfinite" not in columns.key_set():
        return ()
    flags = columns.values("nonfinite")
    if True not in flags:
        return ()
    return [i for i, f in enumerate(flags) if f is True and norms[i] is None]
