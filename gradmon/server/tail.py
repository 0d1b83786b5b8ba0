"""Tail one run-log file: complete lines only, with truncation and replacement detection.

A line is taken only once its ``\\n`` has arrived (a writer may be half-way through it). A line
longer than ``max_line`` bytes is skipped and counted without ever being held whole in memory.
A file that shrinks below what was read (truncation), changes inode or device (replacement), or
whose first line changes (truncated and rewritten between two polls) restarts the tail with a
new *generation* id. The generation is derived from device, inode and the first line, so it is
stable across server restarts for an unchanged file: a client's cursor stays valid.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass, field

from gradmon.logformat.lines import MAX_LINE_BYTES, LineSplitter
from gradmon.server.native import scanner as _native_scanner

# While a backlog is read, the next this many bytes are asked of the kernel ahead of the reads
# (posix_fadvise WILLNEED, asynchronous): each poll opens the file afresh, so the kernel's own
# readahead starts small every time, and a log that is not in the page cache was read from the
# disk 64 KB at a time, each read blocking the event loop (up to ~0.4 s seen on a VM disk).
READAHEAD_BYTES = 8 << 20
# Reads of a log ask for cached bytes only (preadv with RWF_NOWAIT, Linux): a slice not in the page
# cache yet is not read on this poll (``TailResult.waiting``; its bytes are asked ahead) instead of
# blocking the event loop until the disk delivers it; after this many such polls in a row the read
# blocks anyway (a file system that never caches ahead still gets read).
_NOWAIT = getattr(os, "RWF_NOWAIT", None) if hasattr(os, "preadv") else None
NOWAIT_POLLS = 25

__all__ = ["FileTailer", "TailResult", "make_gen", "read_lines"]

_GEN_PREFIX_BYTES = 256  # of the first line (header: run_id, start_time) that go into the gen id
_FIRST_LINE_PROBE = 4096  # bytes read to find the first line when computing the gen id


def line_splitter(offset: int = 0, max_line: int = MAX_LINE_BYTES) -> LineSplitter:
    """A :class:`LineSplitter` from byte ``offset``, with the compiled scanner's loop over a
    block's lines when it is built (``native.py``: a third of the Python loop's time)."""
    native = _native_scanner()
    return LineSplitter(offset, max_line, native.split_lines if native is not None else None)


def make_gen(dev: int, ino: int, first_line: bytes) -> str:
    """The generation id of a file: a short hash of its device, inode and first line."""
    h = hashlib.sha1(f"{dev}:{ino}:".encode())
    h.update(first_line[:_GEN_PREFIX_BYTES])
    return h.hexdigest()[:16]


@dataclass
class TailResult:
    """What one :meth:`FileTailer.poll` found."""

    lines: list[tuple[int, bytes | None]] = field(default_factory=list)
    reset: bool = False  # the file was truncated or replaced: everything before is void
    missing: bool = False  # the file does not exist (any more)
    more: bool = False  # more bytes are waiting than this poll read
    waiting: bool = False  # the next bytes are not in the page cache yet: read them later


class FileTailer:
    """Follow one append-only file by polling ``os.stat`` (cheap) and reading what was appended.

    ``offset`` (the cursor) is the end of the last complete line handed out; ``gen`` is ``None``
    until the file holds one complete line.
    """

    def __init__(self, path: str, max_line: int = MAX_LINE_BYTES) -> None:
        self.path = path
        self.max_line = max_line
        self.gen: str | None = None
        self.size = 0
        self.mtime = 0.0
        self._ident: tuple[int, int] | None = None
        self._first_line = b""
        self._split = line_splitter(0, max_line)
        self._advised = 0  # the end of the bytes asked ahead of the reads (_read_ahead)
        self._nowait = _NOWAIT is not None
        self._waits = 0  # polls in a row that found the next bytes not cached
        # The buffer of the cached-only reads, kept while a backlog is read: a fresh one per slice
        # (hundreds of KiB: mapped and faulted in anew each time) doubled the time a read takes.
        self._read_buf: bytearray | None = None

    @property
    def offset(self) -> int:
        return self._split.line_start

    def _first_line_of(self, fd: int) -> bytes | None:
        head = os.pread(fd, _FIRST_LINE_PROBE, 0)
        nl = head.find(b"\n")
        if nl >= 0:
            return head[:nl]
        if len(head) >= _FIRST_LINE_PROBE:  # a very long first line: its first bytes will do
            return head
        return None

    def _restart(self, st: os.stat_result, first_line: bytes) -> None:
        old = self.gen
        self._ident = (st.st_dev, st.st_ino)
        self._first_line = first_line[:_GEN_PREFIX_BYTES]
        gen = make_gen(st.st_dev, st.st_ino, first_line)
        # A truncated file rewritten with the same first line still needs a different id.
        self.gen = gen if gen != old else make_gen(st.st_dev, st.st_ino, first_line + old.encode())
        self._split = line_splitter(0, self.max_line)

    def unread(self, offset: int) -> None:
        """Hand the lines after byte ``offset`` (the end of a line the last poll handed out) out
        again at the next poll, read afresh."""
        if offset > self.offset:
            raise ValueError(f"cannot unread past the lines handed out ({offset} > {self.offset})")
        self._split = line_splitter(offset, self.max_line)

    def resume(self, offset: int) -> bool:
        """Go on from byte ``offset`` (a line boundary up to which the file was read before, e.g.
        by a previous server: ``sidecar.py``), as if it had been polled up to there; ``False``
        when the file is gone or has no complete line."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return False
        try:
            st = os.fstat(fd)
            first = self._first_line_of(fd)
            if first is None or st.st_size < offset:
                return False
            self.gen = None
            self._restart(st, first)
            self._split = line_splitter(offset, self.max_line)
            self.size = st.st_size
            self.mtime = st.st_mtime
            return True
        finally:
            os.close(fd)

    def poll(self, max_bytes: int = 4 << 20) -> TailResult:
        """Stat the file and read at most ``max_bytes`` of what was appended since the last poll."""
        try:
            st = os.stat(self.path)
        except OSError:
            return TailResult(missing=True)
        self.mtime = st.st_mtime
        replaced = self._ident is not None and self._ident != (st.st_dev, st.st_ino)
        if st.st_size == self._split.fed and not replaced and self.gen is not None:
            return TailResult()  # the common case: nothing new, one stat() and done
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return TailResult(missing=True)
        try:
            st = os.fstat(fd)  # the file we actually opened
            replaced = self._ident is not None and self._ident != (st.st_dev, st.st_ino)
            result = TailResult()
            if self.gen is None or replaced or st.st_size < self._split.fed:
                first = self._first_line_of(fd)
                if self.gen is not None:
                    result.reset = True
                    self.gen = self.gen if first is not None else None
                if first is None:  # no complete line yet: no generation, wait
                    self.gen = None
                    self._ident = (st.st_dev, st.st_ino)
                    self._split = line_splitter(0, self.max_line)
                    self.size = st.st_size
                    return result
                self._restart(st, first)
            elif self._first_line and os.pread(fd, len(self._first_line), 0) != self._first_line:
                # Truncated and rewritten between two polls, past our offset.
                first = self._first_line_of(fd) or b""
                self._restart(st, first)
                result.reset = True
            self.size = st.st_size
            todo = st.st_size - self._split.fed
            if todo > 0:
                n = min(todo, max_bytes)
                data, partial = self._read(fd, n, self._split.fed, result)
                result.lines = self._split.feed(data)
                result.more = len(data) < todo
                if result.more:
                    self._read_ahead(fd, st.st_size)
                else:
                    self._read_buf = None  # (followed, not read through: small reads from here on)
                if len(data) < n and not partial:  # shrank while reading: next poll sorts it out
                    self.size = self._split.fed
            return result
        finally:
            os.close(fd)

    def _read(self, fd: int, n: int, pos: int, result: TailResult) -> tuple[bytes | bytearray, bool]:
        """Up to ``n`` bytes at ``pos``: the cached ones only, when the system can say (``True``
        with them: maybe fewer than there are; none, ``result.waiting``, when none is cached),
        else (or after ``NOWAIT_POLLS`` such polls) a plain read (``False``). A whole read buffer
        comes as that buffer (no copy), valid until the next read."""
        if self._nowait:
            if self._read_buf is None or len(self._read_buf) < n:
                self._read_buf = bytearray(n)
            buf = memoryview(self._read_buf)[:n]
            try:
                got = os.preadv(fd, [buf], pos, _NOWAIT)
            except BlockingIOError:
                got = 0
            except OSError:  # (not supported here: plain reads from now on)
                self._nowait = False
                return os.pread(fd, n, pos), False
            if got or self._waits >= NOWAIT_POLLS:
                self._waits = 0
                if got == len(self._read_buf):  # (the common read of a backlog: a whole slice)
                    return self._read_buf, True  # (LineSplitter.feed copies what it keeps)
                if got:
                    return bytes(buf[:got]), True
            else:
                self._waits += 1
                result.waiting = True
                return b"", True
        return os.pread(fd, n, pos), False

    def _read_ahead(self, fd: int, size: int) -> None:
        """Ask the kernel for the next ``READAHEAD_BYTES`` past the read position, in steps of half
        that (not at every poll), where it can be asked."""
        pos = self._split.fed
        if self._advised > pos + READAHEAD_BYTES:  # (asked for another file, or before a restart)
            self._advised = 0
        if pos + READAHEAD_BYTES // 2 <= self._advised or not hasattr(os, "posix_fadvise"):
            return
        start = max(pos, self._advised)
        end = min(size, pos + READAHEAD_BYTES)
        if end > start:
            with contextlib.suppress(OSError):  # (a file system that cannot take it: reads as before)
                os.posix_fadvise(fd, start, end - start, os.POSIX_FADV_WILLNEED)
        self._advised = end


def read_lines(path: str, start: int, end: int, max_line: int = MAX_LINE_BYTES,
               chunk: int = 1 << 20) -> list[tuple[int, bytes | None]]:
    """Read the complete lines in ``[start, end)`` of a file (``end`` on a line boundary).

    Returns ``(end_offset, line)`` pairs as :meth:`LineSplitter.feed` does; a missing file or
    a short read gives the lines read so far.
    """
    out: list[tuple[int, bytes | None]] = []
    split = line_splitter(start, max_line)
    try:
        with open(path, "rb", buffering=0) as f:
            pos = start
            while pos < end:
                data = os.pread(f.fileno(), min(chunk, end - pos), pos)
                if not data:
                    break
                out.extend(split.feed(data))
                pos += len(data)
    except OSError:
        pass
    return out
