"""The stream protocol of one client and one run (gradmon.server.stream), Sans-I/O: every mode
against every event, then random interleavings checked for no gap and no duplicate."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gradmon.server.stream import (
    CATCH_UP_CHUNK,
    SENT_KEPT,
    Action,
    Check,
    CursorError,
    Lagged,
    Mode,
    Position,
    Read,
    Reset,
    RunStream,
    Step,
    parse_cursor,
)

MODES = list(Mode)
RUN = Position("g", 1000)


def _stream(mode: Mode, offset: int = 500, gen: str = "g") -> RunStream:
    s = RunStream(gen, offset)
    if mode is Mode.CATCH_UP:
        assert s.on_subscribe(Position(gen, offset), Position(gen, 10_000)) is Action.START_CATCH_UP
    elif mode is Mode.HELD:
        s.offset -= 1
        assert s.on_batch(gen, offset - 1, offset, indexing=True) is Action.NONE
    assert (s.mode, s.position) == (mode, Position(gen, offset))
    return s


# ---- batches read by the tailer ------------------------------------------------------------------

def test_a_live_stream_sends_a_batch_that_starts_where_it_is():
    s = _stream(Mode.LIVE)
    assert s.on_batch("g", 500, 600, indexing=False) is Action.SEND
    assert (s.mode, s.position) == (Mode.LIVE, ("g", 600))


@pytest.mark.parametrize("mode", [Mode.LIVE, Mode.HELD])
def test_a_batch_of_the_backlog_or_while_held_is_not_sent(mode):
    s = _stream(mode)
    assert s.on_batch("g", 500, 600, indexing=True) is Action.NONE
    assert (s.mode, s.position) == (Mode.HELD, ("g", 600))
    assert s.on_batch("g", 600, 700, indexing=False) is Action.NONE  # held until on_indexed
    assert (s.mode, s.position) == (Mode.HELD, ("g", 700))


@pytest.mark.parametrize("mode", [Mode.LIVE, Mode.HELD])
@pytest.mark.parametrize("gen, prev", [("g", 400), ("g", 600), ("other", 500)])
def test_a_batch_elsewhere_starts_a_catch_up_from_the_stream_position(mode, gen, prev):
    s = _stream(mode)
    token = s.catch_up_token
    assert s.on_batch(gen, prev, prev + 100, indexing=False) is Action.START_CATCH_UP
    assert (s.mode, s.position, s.catch_up_token) == (Mode.CATCH_UP, ("g", 500), token + 1)


@pytest.mark.parametrize("indexing", [False, True])
def test_batches_during_a_catch_up_are_left_to_it(indexing):
    s = _stream(Mode.CATCH_UP)
    for prev in (500, 700):
        assert s.on_batch("g", prev, prev + 100, indexing) is Action.NONE
    assert (s.mode, s.position) == (Mode.CATCH_UP, ("g", 500))


# ---- resets and the end of indexing ----------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("gen", ["new", None])
def test_a_reset_restarts_at_zero_live(mode, gen):
    s = _stream(mode)
    assert s.on_reset(gen) == Reset(Position(gen, 0))
    assert (s.mode, s.position) == (Mode.LIVE, (gen, 0))


def test_the_end_of_indexing_lags_a_held_stream_once():
    s = _stream(Mode.HELD)
    assert s.on_indexed() == Lagged(Position("g", 500))
    assert s.mode is Mode.LIVE and s.on_indexed() is None
    assert s.on_batch("g", 500, 600, indexing=False) is Action.SEND


@pytest.mark.parametrize("mode", [Mode.LIVE, Mode.CATCH_UP])
def test_the_end_of_indexing_leaves_other_streams_alone(mode):
    s = _stream(mode)
    assert s.on_indexed() is None and (s.mode, s.position) == (mode, ("g", 500))


# ---- subscribe --------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_subscribe_null_follows_live_from_the_run_position(mode):
    s = _stream(mode)
    assert s.on_subscribe(None, RUN) is Action.NONE
    assert (s.mode, s.position) == (Mode.LIVE, RUN)


@pytest.mark.parametrize("mode", MODES)
def test_subscribe_with_another_generation_resets_to_the_run_position(mode):
    s = _stream(mode)
    assert s.on_subscribe(Position("old", 20), RUN) == Reset(RUN)
    assert (s.mode, s.position) == (Mode.LIVE, RUN)


@pytest.mark.parametrize("mode", [Mode.LIVE, Mode.HELD])
def test_subscribe_with_a_cursor_catches_up_from_it(mode):
    s = _stream(mode)
    token = s.catch_up_token
    assert s.on_subscribe(Position("g", 20), RUN) is Action.START_CATCH_UP
    assert (s.mode, s.position, s.catch_up_token) == (Mode.CATCH_UP, ("g", 20), token + 1)
    assert s.on_indexed() is None  # nothing is held back any more


def test_subscribe_during_a_catch_up_moves_the_running_one():
    s = _stream(Mode.CATCH_UP)
    token = s.catch_up_token
    assert s.on_subscribe(Position("g", 20), RUN) is Action.NONE
    assert (s.mode, s.position, s.catch_up_token) == (Mode.CATCH_UP, ("g", 20), token)
    assert s.next_step(token, RUN) == Check("g", 20)  # the new position is checked again


@pytest.mark.parametrize("raw, want", [
    (None, None), ({"gen": "g", "offset": 0}, Position("g", 0)),
    ({"gen": "", "offset": 7, "x": 1}, Position("", 7)),
    ({"gen": "g", "offset": 2**63 - 1}, Position("g", 2**63 - 1)),
])
def test_parse_cursor_accepts(raw, want):
    assert parse_cursor(raw) == want


@pytest.mark.parametrize("raw", [
    "x", 5, [], {}, {"gen": 5, "offset": 0}, {"gen": "g"}, {"gen": "g", "offset": -1},
    {"gen": "g", "offset": True}, {"gen": "g", "offset": 1.0}, {"gen": None, "offset": 0},
    {"gen": "g", "offset": 2**63}, {"gen": "g", "offset": 2**70},  # (no file offset: off_t is 64-bit)
])
def test_parse_cursor_refuses(raw):
    with pytest.raises(CursorError):
        parse_cursor(raw)


# ---- the catch-up ----------------------------------------------------------------------------------

def test_a_catch_up_checks_then_reads_in_chunks_then_goes_live():
    s = _stream(Mode.CATCH_UP, offset=0)
    token = s.catch_up_token
    run = Position("g", CATCH_UP_CHUNK + 100)
    check = s.next_step(token, run)
    assert check == Check("g", 0)
    assert s.on_checked(check, True, run) is None
    read = s.next_step(token, run)
    assert read == Read("g", 0, CATCH_UP_CHUNK)
    assert s.on_read(read, CATCH_UP_CHUNK - 10) is Action.SEND  # up to its last complete line
    assert s.position == ("g", CATCH_UP_CHUNK - 10)
    assert s.next_step(token, run) == Check("g", CATCH_UP_CHUNK - 10)  # each new position is checked
    s.on_checked(Check("g", CATCH_UP_CHUNK - 10), True, run)
    read = s.next_step(token, run)
    assert read == Read("g", CATCH_UP_CHUNK - 10, run.offset)
    assert s.on_read(read, run.offset) is Action.SEND
    s.on_checked(Check(*s.position), True, run)
    assert s.next_step(token, run) is Step.DONE and s.mode is Mode.LIVE
    assert s.on_batch("g", run.offset, run.offset + 5, indexing=False) is Action.SEND


def test_a_cursor_inside_a_line_is_reset_to_the_run_position():
    s = _stream(Mode.CATCH_UP, offset=7)
    check = s.next_step(s.catch_up_token, RUN)
    assert s.on_checked(check, False, RUN) == Reset(RUN)
    assert (s.mode, s.position) == (Mode.LIVE, RUN)


def test_a_cursor_beyond_the_run_waits_for_the_server_to_read_that_far():
    s = _stream(Mode.CATCH_UP, offset=2000)
    token = s.catch_up_token
    s.on_checked(s.next_step(token, RUN), True, RUN)
    assert s.next_step(token, RUN) is Step.WAIT
    assert s.next_step(token, Position("g", 2000)) is Step.DONE and s.mode is Mode.LIVE


def test_stale_results_and_superseded_catch_ups_change_nothing():
    s = _stream(Mode.CATCH_UP, offset=0)
    token = s.catch_up_token
    check = s.next_step(token, RUN)
    read = Read("g", 0, 100)
    s.on_subscribe(Position("g", 50), RUN)  # moved while the check and a read were out
    assert s.on_checked(check, False, RUN) is None and s.position == ("g", 50)
    assert s.on_read(read, 100) is Action.NONE and s.position == ("g", 50)
    s.on_subscribe(None, RUN)
    s.on_subscribe(Position("g", 60), RUN)  # a newer catch-up: the older task is done
    assert s.catch_up_token == token + 1
    assert s.next_step(token, RUN) is Step.DONE and s.mode is Mode.CATCH_UP
    assert s.next_step(token + 1, RUN) == Check("g", 60)


def test_a_catch_up_ends_on_a_reset_or_an_empty_read():
    s = _stream(Mode.CATCH_UP, offset=0)
    token = s.catch_up_token
    s.on_reset("new")
    assert s.next_step(token, Position("new", 0)) is Step.DONE
    s = _stream(Mode.CATCH_UP, offset=0)
    s.on_checked(Check("g", 0), True, RUN)
    read = s.next_step(s.catch_up_token, RUN)
    assert s.on_read(read, 0) is Action.NONE and s.mode is Mode.LIVE
    s = _stream(Mode.CATCH_UP, offset=0)
    assert s.next_step(s.catch_up_token, Position("other", 100)) is Step.DONE and s.mode is Mode.LIVE



def test_a_catch_up_s_reads_end_where_the_messages_sent_before_ended():
    # (a client that applied them is at one of those ends: the catch-up must pass there)
    s = RunStream("g", 0)
    assert s.on_batch("g", 0, 10, indexing=False) is Action.SEND
    assert s.on_batch("g", 10, 25, indexing=False) is Action.SEND
    run = Position("g", 40)
    assert s.on_subscribe(Position("g", 0), run) is Action.START_CATCH_UP
    token, ends = s.catch_up_token, []
    while (step := s.next_step(token, run)) is not Step.DONE:
        if isinstance(step, Check):
            s.on_checked(step, True, run)
        else:
            ends.append(step.end)
            assert s.on_read(step, step.end) is Action.SEND
    assert ends == [10, 25, 40] and s.mode is Mode.LIVE
    # a reset forgets them (the file's offsets are new); past SENT_KEPT, the older half is forgotten
    s.on_reset("g")
    for k in range(SENT_KEPT + 1):
        s.on_batch("g", k, k + 1, indexing=False)
    run = Position("g", SENT_KEPT + 1)
    assert s.on_subscribe(Position("g", 0), run) is Action.START_CATCH_UP
    s.on_checked(s.next_step(s.catch_up_token, run), True, run)
    assert s.next_step(s.catch_up_token, run) == Read("g", 0, SENT_KEPT // 2 + 1)

# ---- random interleavings: no gap, no duplicate -------------------------------------------------------

class _Client:
    """Applies messages as docs/protocol.md tells a page to: ``records`` when ``prev`` is its
    cursor; ``reset``/``lagged``: refetch the history (everything up to the carried cursor)."""

    def __init__(self, at: int):
        self.cursor = at
        self.have = set(range(at))  # byte offsets of the lines it holds (lines are 1 byte here)

    def records(self, prev: int, end: int) -> None:
        assert prev == self.cursor, "a gap or a duplicate"
        assert not self.have & set(range(prev, end))
        self.have |= set(range(prev, end))
        self.cursor = end

    def refetch(self, at: Position) -> None:
        self.cursor = at.offset
        self.have = set(range(at.offset))


class _World:
    """One run's file (one line per byte), its tailer, one stream and its client."""

    def __init__(self):
        self.size = self.read = 10
        self.indexing = True
        self.stream = RunStream("g", self.read)
        self.client = _Client(self.read)
        self.token = None

    def _send(self, prev: int, end: int) -> None:
        """The server sends the records ``[prev, end)``: here the client has them at once."""
        self.client.records(prev, end)

    def tail(self, n: int) -> bool:
        if self.read >= self.size:
            return False
        prev, self.read = self.read, min(self.size, self.read + 1 + n % 7)
        action = self.stream.on_batch("g", prev, self.read, self.indexing)
        if action is Action.SEND:
            self._send(prev, self.read)
        elif action is Action.START_CATCH_UP:
            self.token = self.stream.catch_up_token
        return True

    def indexed(self) -> bool:
        if not self.indexing or self.read < self.size:
            return False
        self.indexing = False
        lagged = self.stream.on_indexed()
        if lagged is not None:
            self.client.refetch(lagged.position)
        return True

    def subscribe(self, offset: int | None) -> None:
        run = Position("g", self.read)
        cursor = None if offset is None else Position("g", min(offset, self.read))
        self.client.refetch(cursor or run)  # the page fetched the history up to its cursor
        if self.stream.on_subscribe(cursor, run) is Action.START_CATCH_UP:
            self.token = self.stream.catch_up_token

    def step(self, n: int) -> bool:
        if self.token is None:
            return False
        step = self.stream.next_step(self.token, Position("g", self.read))
        if isinstance(step, Check):
            self.stream.on_checked(step, True, Position("g", self.read))
        elif isinstance(step, Read):
            end = min(step.end, step.start + 1 + n % 5)
            if self.stream.on_read(step, end) is Action.SEND:
                self._send(step.start, end)
        elif step is Step.DONE:
            self.token = None
        return True

    def append(self, n: int) -> None:
        self.size += n

    # A random interleaving's moves, by name: each takes the world and a number (ignored by some).
    MOVES: ClassVar[dict[str, Callable[[Any, int], Any]]] = {
        "append": append, "tail": tail, "step": step, "subscribe": subscribe,
        "null": lambda w, _n: w.subscribe(None), "indexed": lambda w, _n: w.indexed(),
    }

    def play(self, ops: list[tuple[str, int]]) -> None:
        """Make each ``(move, n)`` of ``ops``, in order."""
        for op, n in ops:
            self.MOVES[op](self, n)


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(list(_World.MOVES)), st.integers(0, 40)), max_size=60))
def test_random_interleavings_have_no_gap_and_no_duplicate(ops):
    w = _World()
    w.play(ops)
    while w.step(1) or w.tail(3) or w.indexed():  # the server goes on until all is read
        pass
    # the client holds every line exactly once, and follows the run live from its end
    assert w.client.have == set(range(w.size)) and w.client.cursor == w.stream.offset == w.size
    assert w.stream.mode is Mode.LIVE


# ---- messages in flight: a client that applies `records` exactly when `prev` is its cursor ----------

class _Page:
    """A client at the far end of a wire (docs/protocol.md's rule): it applies a ``records``
    message exactly when ``prev`` is its cursor and ignores it otherwise; a history fetch sets its
    cursor to the history's, while messages the server sent before are still on their way."""

    def __init__(self, at: int):
        self.cursor = at
        self.have = list(range(at))  # the lines it holds, in order (each line is 1 byte)

    def records(self, prev: int, end: int) -> None:
        if prev == self.cursor:
            self.have.extend(range(prev, end))
            self.cursor = end

    def refetch(self, at: int) -> None:
        self.cursor = at
        self.have = list(range(at))


class _Wire(_World):
    """``_World`` with a wire: what the server sends reaches the page only at a ``deliver``, and a
    page's ``subscribe`` (sent after its history fetch) reaches the server only at an ``arrive``."""

    def __init__(self):
        super().__init__()
        self.indexing = False
        self.client = _Page(self.read)
        self.wire: list[tuple] = []
        self.subscribes: list[Position] = []

    def _send(self, prev: int, end: int) -> None:
        self.wire.append(("records", prev, end))  # (on its way: the page has it at a deliver)

    def history(self) -> None:
        self.client.refetch(self.read)  # the history answer ends where the run has been read
        self.subscribes.append(Position("g", self.read))

    def arrive(self) -> bool:
        if not self.subscribes:
            return False
        action = self.stream.on_subscribe(self.subscribes.pop(0), Position("g", self.read))
        if action is Action.START_CATCH_UP:
            self.token = self.stream.catch_up_token
        return True

    def deliver(self) -> bool:
        if not self.wire:
            return False
        _kind, prev, end = self.wire.pop(0)
        self.client.records(prev, end)
        return True

    MOVES: ClassVar[dict[str, Callable[[Any, int], Any]]] = {
        **{name: _World.MOVES[name] for name in ("append", "tail", "step")},
        "history": lambda w, _n: w.history(), "arrive": lambda w, _n: w.arrive(),
        "deliver": lambda w, _n: w.deliver(),
    }


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(list(_Wire.MOVES)), st.integers(0, 40)), max_size=60))
# (the page's history ends at 10; the connect-time stream sends [10, 13); the subscribe from 10
# arrives; the tailer reads on to 16 unsent; the catch-up reads [10, 15): after it, only a message
# from 13 would continue the page, which applied [10, 13))
@example(ops=[("append", 20), ("history", 0), ("tail", 2), ("arrive", 0), ("tail", 2), ("step", 0),
              ("step", 4)])
def test_messages_sent_before_a_subscribe_takes_effect_leave_no_gap_and_no_duplicate(ops):
    # (a records message of the connect-time stream that starts at the page's history cursor is
    # applied; the catch-up from that cursor must then go on from where that message ended)
    w = _Wire()
    w.play(ops)
    while w.arrive() or w.step(1) or w.tail(3) or w.deliver():  # all is read, sent and delivered
        pass
    assert w.client.have == list(range(w.size)) and w.client.cursor == w.stream.offset == w.size
    assert w.stream.mode is Mode.LIVE
