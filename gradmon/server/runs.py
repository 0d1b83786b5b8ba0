"""Find runs under a log root, and follow each one (tail + index + status).

A run is a directory under the root holding ``metrics.jsonl`` (named by its relative path) or a
``metrics.rank<N>.jsonl`` (named ``<dir>/rank<N>``); see docs/format.md. A run directory that
is the root itself is named after the root's base name. Discovery never leaves the root: every
directory and file is resolved (symlinks included) and refused unless it lies inside the
resolved root; a directory reached twice (a symlink loop) is walked once.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from gradmon.server.columns import step_rows
from gradmon.server.derived import Derived, splice
from gradmon.server.index import RunIndex
from gradmon.server.native import scanner as _native_scanner
from gradmon.server.parse import ParsedLines
from gradmon.server.pyramid import BUCKET, TAIL_MAX
from gradmon.server.sidecar import ColumnsRef, Sidecar, unwritable
from gradmon.server.tail import FileTailer

__all__ = ["MAX_DEPTH", "STALE_AFTER_S", "Batch", "Run", "discover_runs", "is_inside", "run_status"]

log = logging.getLogger("gradmon.server")

MAX_DEPTH = 8  # directory levels below the root that discovery walks
MAX_RUNS = 2_000
STALE_AFTER_S = 120.0  # a run not finished whose file has not grown for this long is "stale"
# When the index is checkpointed into its sidecar (sidecar.py): once the backlog is read, then
# every CHECKPOINT_S while the log grows, every CHECKPOINT_BYTES of a long backlog, and when the
# server stops. Each costs the event loop the pickling of what the index holds in memory (~3 ms for
# 2M steps: the finest pyramid levels are in files already); a server killed in between re-reads
# what it read since from the log at its next start.
CHECKPOINT_S = 300.0
CHECKPOINT_BYTES = 256 << 20
FLUSH_BYTES = 512 << 10  # the rows of a backlog go to the sidecar in pieces of this size (RSS: +~1 MB)
_RANK_FILE = re.compile(r"^metrics\.rank(\d{1,6})\.jsonl$")


def is_inside(path: str, root: str) -> bool:
    """Whether the resolved ``path`` is ``root`` or below it (``root`` already resolved)."""
    real = os.path.realpath(path)
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def discover_runs(root: str, max_depth: int = MAX_DEPTH, max_runs: int = MAX_RUNS) -> dict[str, str]:
    """Map run name -> resolved path of its log file, for every run under ``root``."""
    root = os.path.realpath(root)
    base = os.path.basename(root) or "root"
    found: dict[str, str] = {}
    seen: set[str] = set()
    stack: list[tuple[str, str, int]] = [(root, "", 0)]  # (dir path, relative name, depth)
    while stack and len(found) < max_runs:
        path, rel, depth = stack.pop()
        real = os.path.realpath(path)
        if real in seen or not is_inside(real, root):
            continue
        seen.add(real)
        try:
            entries = sorted(os.scandir(real), key=lambda e: e.name)
        except OSError:
            continue
        name = rel or base
        for e in entries:
            try:
                is_dir = e.is_dir()  # follows symlinks; the target is checked when walked
                is_file = e.is_file()
            except OSError:
                continue
            if is_dir:
                if depth < max_depth and not e.name.startswith("."):
                    stack.append((e.path, f"{rel}/{e.name}" if rel else e.name, depth + 1))
                continue
            if not is_file:
                continue
            if e.name == "metrics.jsonl":
                run = name
            else:
                m = _RANK_FILE.match(e.name)
                if m is None:
                    continue
                run = f"{name}/rank{int(m.group(1))}"
            target = os.path.realpath(e.path)
            if is_inside(target, root) and run not in found:
                found[run] = target
    return found


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off for a block (as it was after). A batch of lines makes
    ~40,000 tracked containers (line tuples, records) that all live until it is indexed and hold
    no cycles: collecting them generation by generation in the middle of the batch frees nothing
    and took ~10 % of a cold index. One collection after the batch sees them instead."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def run_status(ended: str | None, mtime: float, now: float) -> str:
    """``finished`` once the latest segment has an ``end`` record, else ``stale`` when the file has
    not changed for ``STALE_AFTER_S``, else ``live``."""
    if ended is not None:
        return "finished"
    return "stale" if now - mtime > STALE_AFTER_S else "live"


@dataclass
class Batch:
    """Records read in one poll: lines ``[prev, cursor)`` of generation ``gen``."""

    gen: str
    prev: int
    cursor: int
    lines: list[bytes]  # the raw valid lines, strict JSON already (sent as they are), and the
    # alarm events the server derived from them (derived.py), each at its place
    status_changing: bool = False  # holds a header or an end record (the run's status may change)
    parsed: ParsedLines | None = None  # the valid lines decoded
    derived: list[Derived] = field(default_factory=list)  # the alarm events derived from them

    @property
    def records(self) -> Sequence[dict]:
        """The records of ``lines``: ``parsed``'s, with the derived events at their places (for
        the webhook alerts; spliced when asked for, as the compiled scanner's records are made)."""
        if self.parsed is None:
            return []
        return splice(self.parsed.records, self.parsed.offsets, self.derived, attrgetter("event"))


def _raise() -> None:
    raise OSError("the sidecar's rows could not be written")


class Run:
    """One run: its file tailer, its index and its status."""

    def __init__(self, name: str, path: str, sidecar: bool = True, index_dir: str | None = None) -> None:
        self.name = name
        self.path = path
        self.tailer = FileTailer(path)
        self.index = RunIndex()
        self.status = "live"
        self.indexing = True  # until the first poll that reaches the end of the file
        self.missing = False
        self.waiting = False  # the last poll found the next bytes not in the page cache yet
        self.restored = 0  # bytes of the log whose index came from the sidecar
        self._lost = False  # the index lost its stored levels: re-read the log at the next poll
        self.sidecar: Sidecar | None = None
        self.read_only = False  # the sidecar's directory cannot be written: indexed from memory
        if sidecar:
            try:  # (index_dir: where the sidecar is kept, when not beside the log: sidecar.sidecar_dir)
                self.sidecar = Sidecar.open(path, index_dir)
            except OSError as exc:
                self.read_only = unwritable(exc)
                log.debug("no index sidecar for %s (%s): indexing from memory", path, exc)
        self._checkpoint_time = time.monotonic()
        if self.sidecar is not None:
            self._restore()

    def _restore(self) -> None:
        sc = self.sidecar
        assert sc is not None
        got = sc.load(self.path)
        if got is not None and self.tailer.resume(got[1]):
            self.index, self.restored = got
        else:
            self._with_sidecar(sc.reset)
        self._attach()

    def _attach(self) -> None:
        """Keep the index's finest pyramid levels in the sidecar's files (levelfiles.py)."""
        if self.sidecar is not None:
            self.index.steps.pyramid.attach(self.sidecar.path)

    def _with_sidecar(self, fn: Any, *args: Any) -> None:
        """Call a sidecar method; when it fails (a full disk, a directory gone read-only), go on
        without the sidecar: it is a cache."""
        sc = self.sidecar
        if sc is None:
            return
        try:
            fn(*args)
        except OSError as exc:
            log.warning("index sidecar of %s dropped (%s): indexing from memory", self.path, exc)
            self.sidecar = None
            try:
                self.index.steps.pyramid.detach()  # before its files go
            except (OSError, ValueError) as exc2:  # (cannot be read: index the log again, from memory)
                log.warning("index of %s lost with its sidecar (%s): re-indexing", self.path, exc2)
                self._lost = True
            with contextlib.suppress(OSError):
                sc.reset()
            sc.close()

    def columns(self) -> ColumnsRef | None:
        """Where history reads this run's step records as columns (``None``: from the log)."""
        sc = self.sidecar
        if sc is None:
            return None
        try:
            return sc.ref()
        except OSError:
            self._with_sidecar(_raise)  # drop it (and say why): this answer reads the log
            return None

    def checkpoint(self, force: bool = False) -> None:
        """Checkpoint the index into the sidecar when it is due (``force``: whenever it is behind)."""
        sc = self.sidecar
        if sc is None or self.tailer.gen is None or self.offset <= sc.checkpointed:
            return
        now = time.monotonic()
        behind = self.offset - max(sc.checkpointed, 0)
        due = (force or sc.checkpointed < 0 or behind >= CHECKPOINT_BYTES
               or now - self._checkpoint_time >= CHECKPOINT_S)
        if due and (not self.indexing or behind >= CHECKPOINT_BYTES) and sc.reap():
            # (reap: the previous checkpoint is written; while it is not, the next poll tries again)
            self._checkpoint_time = now
            self._with_sidecar(sc.checkpoint, self.index, self.path, self.offset)

    def close(self) -> None:
        """Checkpoint what was read since the last checkpoint and release the sidecar."""
        if self.sidecar is not None:
            self.sidecar.reap(wait=True)  # so that this last checkpoint is not skipped
        self.checkpoint(force=True)
        if self.sidecar is not None:
            self.sidecar.close()
            self.sidecar = None

    @property
    def gen(self) -> str | None:
        return self.tailer.gen

    @property
    def offset(self) -> int:
        return self.tailer.offset

    def cursor(self) -> dict[str, Any]:
        return {"gen": self.tailer.gen, "offset": self.tailer.offset}

    def info(self) -> dict[str, Any]:
        """The run's entry in ``/api/runs``, ``hello`` and ``runs`` messages."""
        out: dict[str, Any] = {"name": self.name, "status": self.status}
        out.update(self.index.summary())
        out["cursor"] = self.cursor()
        out["indexing"] = self.indexing
        out["file_bytes"] = self.tailer.size
        return out

    def progress(self) -> dict[str, Any]:
        """How far the reading of the run's file has come (an ``indexing`` message's entry): the
        bytes read (``offset``) of ``file_bytes``, the records and the last step indexed so far."""
        return {"name": self.name, "offset": self.tailer.offset, "file_bytes": self.tailer.size,
                "records": self.index.records, "last_step": self.index.steps.last_step}

    def poll(self, max_bytes: int = 4 << 20) -> tuple[bool, Batch | None, bool]:
        """Read what was appended. Returns ``(reset, batch, more)``: ``reset`` when the file was
        truncated or replaced (the index restarts, a new generation begins), the new records if
        any, and whether more bytes are waiting."""
        with collector_paused():
            return self._poll(max_bytes)

    def _poll(self, max_bytes: int) -> tuple[bool, Batch | None, bool]:
        if self._lost:  # as at a start without a sidecar (the generation stays the file's)
            self._lost = False
            self.tailer = FileTailer(self.path)
            self.index = RunIndex()
            self.indexing = True
        prev = self.tailer.offset
        res = self.tailer.poll(max_bytes)
        self.missing = res.missing
        self.waiting = res.waiting  # (its next bytes are still on the disk: poll again at the next tick)
        if res.reset:
            self.index = RunIndex()
            self.indexing = True
            prev = 0
            if self.sidecar is not None:
                self._with_sidecar(self.sidecar.reset)
                self._attach()
        if res.more and not res.reset:
            self._whole_buckets_only(res.lines)
        batch = None
        if res.lines and self.tailer.gen is not None:
            marks_status = self.index.status_records
            parsed = self.index.add_lines(res.lines, prev)
            sc = self.sidecar
            if sc is not None:
                sc.append(step_rows(parsed, sc.columns, sc.seen))
                if sc.unflushed >= FLUSH_BYTES or not res.more:
                    self._with_sidecar(sc.flush)
                self._with_sidecar(self.index.steps.pyramid.flush, TAIL_MAX)
                self.index.steps.pyramid.release()  # (a map holds a descriptor: none outlives a poll)
            derived = self.index.derived.between(prev, self.tailer.offset)
            batch = Batch(self.tailer.gen, prev, self.tailer.offset, self.lines_to_send(parsed, derived),
                          self.index.status_records != marks_status, parsed, derived)
        backlog_read = self.indexing and not res.more
        if not res.more:
            self.indexing = False
        if self.sidecar is not None:
            self.checkpoint(force=backlog_read)
        return res.reset, batch, res.more

    def _whole_buckets_only(self, lines: list[tuple[int, bytes | None]]) -> None:
        """While more of the backlog waits, take only the lines whose step records fill the open
        bucket and whole buckets after it (``pyramid.BUCKET`` records; the compiled scanner's
        ``bucket_cut``): the rest are read again at the next poll. A bucket left open at every
        slice's end was summarized a piece at a time, ~5 % of a cold index."""
        native = _native_scanner()
        if native is None:
            return
        keep = native.bucket_cut(lines, self.index.steps.open_records, BUCKET)
        if keep < len(lines):
            self.tailer.unread(lines[keep - 1][0])
            del lines[keep:]

    @staticmethod
    def lines_to_send(parsed: ParsedLines, derived: list[Derived]) -> list[bytes]:
        """The lines of a range as clients get them: its valid lines (strict JSON) with the alarm
        events the server derived from them (``index.derived.between`` the range) at their places."""
        return splice(parsed.raw, parsed.offsets, derived, attrgetter("line"))

    def update_status(self, now: float | None = None) -> bool:
        """Recompute the status; return whether it changed."""
        status = run_status(self.index.ended, self.tailer.mtime, time.time() if now is None else now)
        changed = status != self.status
        self.status = status
        return changed
