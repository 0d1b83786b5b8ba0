"""The stream of one run to one client, Sans-I/O: the no-gap/no-duplicate rules, no sockets, no
files, no asyncio.

docs/protocol.md promises each client, per run, ``records`` messages with no gap and no
duplicate: each carries ``prev`` and ``cursor`` (the file positions before and after its records)
and the next one starts where the last ended. :class:`RunStream` holds what that takes: the
position (generation, offset) up to which the client has been sent records, and a mode:

- ``LIVE``: it follows the tail; a batch that starts at its position is sent.
- ``CATCH_UP``: it is behind (a ``subscribe`` from an older cursor); records are read back from
  the file a chunk at a time until it reaches the run's position, then it is ``LIVE`` again.
  Batches meanwhile are not sent: the reading covers them. A chunk ends at the next place where a
  message sent before ended (``SENT_KEPT`` of them are kept): the client may have applied the
  messages sent before its ``subscribe`` took effect up to any of those, and goes on from there.
- ``HELD``: the run's backlog is being read (indexing); its records are not streamed. When the
  reading ends, one ``lagged`` tells the client to refetch the history; then ``LIVE``.

Every event is a method that updates the state and returns what the I/O layer must do: an
:class:`Action` (nothing, send the batch, start a catch-up), or a message to send
(:class:`Reset`, :class:`Lagged`). A catch-up is driven by :meth:`RunStream.next_step`, which
says what to check or read next; results come back through :meth:`RunStream.on_checked` and
:meth:`RunStream.on_read`, and a result whose position has moved meanwhile (a new ``subscribe``,
a reset) is ignored. ``GradmonServer`` carries the actions out.
"""

from __future__ import annotations

import enum
from array import array
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = [
    "CATCH_UP_CHUNK", "SENT_KEPT", "Action", "Check", "CursorError", "Lagged", "Mode", "Position", "Read",
    "Reset", "RunStream", "Step", "parse_cursor",
]

CATCH_UP_CHUNK = 64 << 10  # bytes read back (and validated, on the loop) per catch-up step
# Where the latest messages sent ended, kept per stream (32 to 64 of them, 8 bytes each; none for a
# stream that sent nothing): a catch-up's chunks end there too. A page subscribes right after its
# history answer, so the messages it may have applied meanwhile are the latest few.
SENT_KEPT = 64


class Position(NamedTuple):
    """A place in a run's file: its generation (``None`` while it has no complete line) and a
    byte offset; a cursor of docs/protocol.md."""

    gen: str | None
    offset: int

    def cursor(self) -> dict[str, Any]:
        return {"gen": self.gen, "offset": self.offset}


class Mode(enum.Enum):
    LIVE = "live"
    CATCH_UP = "catch-up"
    HELD = "held"


class Action(enum.Enum):
    NONE = "none"
    SEND = "send"  # send the records [prev, cursor) just handled
    START_CATCH_UP = "start catch-up"  # start a task that drives next_step() (see catch_up_token)


@dataclass(frozen=True)
class Reset:
    """Send ``{"type": "reset", "cursor": position}``: drop what you have, the stream goes on here."""

    position: Position


@dataclass(frozen=True)
class Lagged:
    """Send ``{"type": "lagged", "cursor": position}``: refetch the history, the stream goes on here."""

    position: Position


class Step(enum.Enum):
    WAIT = "wait"  # the run is behind the stream's position (still indexing): try again later
    DONE = "done"  # the catch-up is over (live again, or superseded)


@dataclass(frozen=True)
class Check:
    """Find out whether ``offset`` is on a line boundary of the file, then :meth:`RunStream.on_checked`."""

    gen: str | None
    offset: int


@dataclass(frozen=True)
class Read:
    """Read the complete lines of ``[start, end)`` (all up to the run's position when none ends
    before ``end``), then :meth:`RunStream.on_read`."""

    gen: str | None
    start: int
    end: int


class CursorError(ValueError):
    """A ``subscribe`` cursor that is neither ``null`` nor ``{"gen": str, "offset": int}`` with an
    offset a file can have (``0..MAX_OFFSET``)."""


# The largest offset a file can have (a signed 64-bit off_t): a cursor past it is malformed, not a
# position to wait for (seeking there would fail in the catch-up, which then sent nothing more).
MAX_OFFSET = (1 << 63) - 1


def parse_cursor(raw: Any) -> Position | None:
    """A client's cursor (``None`` for ``null``: from now on); :class:`CursorError` when malformed."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise CursorError("expected {gen, offset} or null")
    gen, offset = raw.get("gen"), raw.get("offset")
    if not isinstance(gen, str) or type(offset) is not int or not 0 <= offset <= MAX_OFFSET:
        raise CursorError("expected {gen, offset} or null")
    return Position(gen, offset)


class RunStream:
    """One client's stream of one run: where it is, and how it follows the run."""

    __slots__ = ("_checked", "_sent", "catch_up_token", "gen", "mode", "offset")

    def __init__(self, gen: str | None, offset: int, mode: Mode = Mode.LIVE) -> None:
        self.gen = gen
        self.offset = offset
        self.mode = mode
        self.catch_up_token = 0  # identifies the newest catch-up: an older one's steps are DONE
        self._checked: Position | None = None  # a position known to be on a line boundary
        self._sent: array | None = None  # where messages of this generation ended (none sent: None)

    @property
    def position(self) -> Position:
        return Position(self.gen, self.offset)

    def __repr__(self) -> str:
        return f"RunStream({self.gen!r}, {self.offset}, {self.mode.name})"

    def _move(self, to: Position, mode: Mode) -> None:
        if to.gen != self.gen:
            self._sent = None
        self.gen, self.offset = to
        self.mode = mode

    def _send(self, end: int) -> Action:
        """The records up to ``end`` are sent: ``SEND``, noting where they end."""
        self.offset = end
        sent = self._sent
        if sent is None:
            sent = self._sent = array("q")
        elif len(sent) >= SENT_KEPT:
            del sent[:SENT_KEPT // 2]  # (the older half: one deletion per SENT_KEPT // 2 messages)
        sent.append(end)
        return Action.SEND

    def _start_catch_up(self) -> Action:
        if self.mode is Mode.CATCH_UP:
            return Action.NONE  # the running catch-up goes on from the new position
        self.mode = Mode.CATCH_UP
        self.catch_up_token += 1
        return Action.START_CATCH_UP

    # ---- events of the run --------------------------------------------------------------------

    def on_batch(self, gen: str, prev: int, cursor: int, indexing: bool) -> Action:
        """The tailer read the records ``[prev, cursor)`` of generation ``gen``; ``indexing``:
        they are part of the backlog the server reads at start (or after a reset)."""
        if self.mode is Mode.CATCH_UP:
            return Action.NONE
        if self.position != (gen, prev):  # should not happen: recover from the file
            return self._start_catch_up()
        if indexing or self.mode is Mode.HELD:
            # Streaming a backlog of a 10M-line file to every open page would cost far more than
            # the one history fetch that the `lagged` at its end asks for.
            self.offset = cursor
            self.mode = Mode.HELD
            return Action.NONE
        return self._send(cursor)

    def on_reset(self, gen: str | None) -> Reset:
        """The file was truncated or replaced (new generation ``gen``): the stream restarts at 0."""
        self._sent = None  # (a truncated file may keep its generation: its offsets are new)
        self._move(Position(gen, 0), Mode.LIVE)
        return Reset(self.position)

    def on_indexed(self) -> Lagged | None:
        """The server has read the run's backlog: a held stream goes live from where it is."""
        if self.mode is not Mode.HELD:
            return None
        self.mode = Mode.LIVE
        return Lagged(self.position)

    # ---- events of the client -----------------------------------------------------------------

    def on_subscribe(self, cursor: Position | None, run: Position) -> Action | Reset:
        """The client asks for the records after ``cursor`` (``None``: from now on); ``run`` is
        where the run's file has been read up to."""
        if cursor is None:
            self._move(run, Mode.LIVE)
            return Action.NONE
        if cursor.gen != run.gen:
            self._move(run, Mode.LIVE)
            return Reset(run)
        if cursor.gen != self.gen:
            self._sent = None
        self.gen, self.offset = cursor
        if self.mode is Mode.HELD:
            self.mode = Mode.LIVE  # the stream restarts here: nothing is held back any more
        return self._start_catch_up()

    # ---- the catch-up ---------------------------------------------------------------------------

    def next_step(self, token: int, run: Position) -> Step | Check | Read:
        """What the catch-up with ``token`` does next, the run's file being read up to ``run``."""
        if self.mode is not Mode.CATCH_UP or token != self.catch_up_token:
            return Step.DONE
        if self.gen != run.gen:  # a reset was sent meanwhile
            self.mode = Mode.LIVE
            return Step.DONE
        if self._checked != self.position:
            return Check(self.gen, self.offset)
        if self.offset == run.offset:
            self.mode = Mode.LIVE  # in step with the run: live from here on (no gap: no await between)
            return Step.DONE
        if self.offset > run.offset:  # the server (re)starting has not read that far yet
            return Step.WAIT
        end = min(run.offset, self.offset + CATCH_UP_CHUNK)
        # (a client that applied the messages sent before its subscribe took effect is at one of
        # their ends: a chunk that passed over it would never be followed)
        end = min((e for e in self._sent or () if self.offset < e < end), default=end)
        return Read(self.gen, self.offset, end)

    def on_checked(self, check: Check, on_boundary: bool, run: Position) -> Reset | None:
        """The answer to a :class:`Check`: a position inside a line cannot be continued from."""
        if self.mode is not Mode.CATCH_UP or self.position != (check.gen, check.offset):
            return None  # moved meanwhile
        if on_boundary:
            self._checked = self.position
            return None
        self._move(run, Mode.LIVE)
        return Reset(run)

    def on_read(self, read: Read, end: int) -> Action:
        """The answer to a :class:`Read`: the complete lines of ``[read.start, end)`` were read
        (``end == read.start``: none). ``SEND`` them, or nothing when the position moved."""
        if self.mode is not Mode.CATCH_UP or self.position != (read.gen, read.start):
            return Action.NONE
        if end <= read.start:  # nothing to read (the file shrank): stop, a reset follows
            self.mode = Mode.LIVE
            return Action.NONE
        return self._send(end)
