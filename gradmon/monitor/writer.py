"""Writing a run log (``metrics.jsonl``, see docs/format.md): the writer behind ``LiveMonitor``.

:class:`RunLogWriter` appends strict JSON lines, one ``write()`` per complete line, straight to the
file descriptor (no user-space buffer, so a tailing reader sees a line as soon as it is written).
An I/O failure never raises into training: the writer warns once, counts the dropped records and
reopens the file later with exponential backoff. One writer per log (:mod:`gradmon.monitor.writelock`); a
writer that finds the log ending in a partial line (its previous writer died mid-write) first ends
that line, so the fragment is one malformed line and the new records start on a line of their own.
Reading is :mod:`gradmon.logformat.reader`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Mapping
from typing import Any, Callable, Union

from gradmon.logformat.jsonl import encode_record
from gradmon.logformat.lines import MAX_LINE_BYTES
from gradmon.logformat.schema import SCHEMA_VERSION
from gradmon.monitor.writelock import LogInUseError, WriterLock

__all__ = ["LogInUseError", "RunLogWriter", "describe_io_error", "header_record"]

_log = logging.getLogger("gradmon.monitor.writer")

PathLike = Union[str, "os.PathLike[str]"]


def header_record(**fields: Any) -> dict[str, Any]:
    """A ``header`` record with the fields every header has (schema, run id, start time, host,
    pid, Python version), overridden or extended by ``fields``."""
    from gradmon import __version__

    record: dict[str, Any] = {
        "type": "header",
        "schema": SCHEMA_VERSION,
        "run_id": uuid.uuid4().hex,
        "start_time": time.time(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "versions": {"gradmon": __version__, "python": sys.version.split()[0]},
    }
    record.update(fields)
    return record


# Errors that waiting does not heal: something in the way, a read-only mount, missing permission.
_LASTING = {errno.ENOTDIR, errno.EEXIST, errno.EISDIR, errno.EROFS, errno.EACCES, errno.EPERM}


def _file_in_the_way(path: str) -> str | None:
    """The nearest existing ancestor of ``path`` that is not a directory (a regular file, say)."""
    here = os.path.dirname(os.path.abspath(path))
    while here and not os.path.lexists(here):
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent
    return here if here and not os.path.isdir(here) else None


def describe_io_error(exc: OSError, path: str) -> tuple[str, bool]:
    """What an I/O error on the run log ``path`` means, in words a user can act on, and whether it
    lasts (waiting will not heal it: something in the way, a read-only file system, no permission)
    or may pass (a full disk, a removed directory, a flaky mount)."""
    code = exc.errno
    if code in (errno.ENOTDIR, errno.EEXIST):
        blocker = _file_in_the_way(path)
        if blocker is not None:
            return (f"{blocker} is a file, not a directory (LiveMonitor(path) takes a run directory, or a "
                    f"file path ending in .jsonl: move that file or choose another path)"), True
    if code == errno.EISDIR:
        return f"{path} is a directory (name the log file inside it, e.g. {path}/metrics.jsonl)", True
    if code == errno.EROFS:
        return (f"{os.path.dirname(path) or '.'} is on a read-only file system "
                f"(write the log to a writable directory)"), True
    if code in (errno.EACCES, errno.EPERM):
        # the log itself, or else its directory (the lock file beside the log is an internal detail)
        where = path if exc.filename == path else os.path.dirname(path) or "."
        return f"no permission to write {where} ({exc.strerror}; choose a directory you can write to)", True
    return str(exc), code in _LASTING


class RunLogWriter:
    """Append-only, thread-safe writer of one run log.

    ``header``: when given, a ``header`` record (see :func:`header_record`) with these fields is
    written on open. :meth:`close` writes the ``end`` record.

    One writer per log: the constructor raises :class:`LogInUseError` (naming the holder) when
    another writer, in this process or another, has the log open. The lock is held until
    :meth:`close`; should the log's directory be removed and another writer take the log while
    this one reopens it, this one drops (and counts) its records from then on.

    Failure handling: any ``OSError`` (disk full, permission denied, directory removed, ...) is
    caught. The first one emits a :class:`RuntimeWarning` (and a log message) saying what it is
    (:func:`describe_io_error`); the record is dropped and counted in :attr:`dropped_records`; the
    file is reopened at the next write after a backoff of ``retry_initial`` seconds, doubling up
    to ``retry_max`` — or, for an error that lasts (a file in the way, a read-only file system, no
    permission), after ``retry_max`` seconds each time. Records written while waiting are dropped
    and counted too; :meth:`close` says once how many were lost and why. After a recovery an
    ``event`` record of kind ``io_error`` tells readers how many records are missing. If the log
    file is deleted or replaced while open, the writer notices within ``check_interval`` seconds
    and recreates it (its directory included).
    """

    def __init__(
        self,
        path: PathLike,
        *,
        header: Mapping[str, Any] | None = None,
        retry_initial: float = 1.0,
        retry_max: float = 30.0,
        check_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = os.fspath(path)
        self._retry_initial = retry_initial
        self._retry_max = retry_max
        self._check_interval = check_interval
        self._clock = clock
        self._mutex = threading.Lock()
        self._writer_lock = WriterLock(self.path)
        self._superseded: LogInUseError | None = None
        self._fd: int | None = None
        self._inode: tuple[int, int] | None = None
        self._next_check = 0.0
        self._retry_at = 0.0
        self._backoff = retry_initial
        self._failing = False
        self._warned = False
        self._dropped = 0
        self._dropped_since_recovery = 0
        self._drop_reason = ""  # why the last record was dropped, for the summary at close
        self._closed = False
        first = header_record(**header) if header is not None else None
        self._lock_note = {"run_id": first["run_id"]} if first is not None else {}
        with self._mutex:
            self._open(first=True)
        if first is not None:
            self.write(first)

    # -- public API ---------------------------------------------------------------------------

    @property
    def dropped_records(self) -> int:
        """Records that could not be written (I/O errors, or refused as too long)."""
        return self._dropped

    @property
    def closed(self) -> bool:
        return self._closed

    def write(self, record: Mapping[str, Any]) -> bool:
        """Append one record as one line. Returns whether it reached the file; never raises for
        I/O errors (a record that cannot be JSON-encoded raises ``ValueError``/``TypeError``)."""
        line = encode_record(record).encode("utf-8")
        with self._mutex:
            if self._closed:
                raise ValueError(f"write to a closed run log {self.path}")
            if len(line) > MAX_LINE_BYTES:
                self._dropped += 1
                self._drop_reason = f"a record exceeded the {MAX_LINE_BYTES}-byte line limit"
                self._warn(f"record of {len(line)} bytes exceeds the {MAX_LINE_BYTES}-byte line limit; "
                           "dropped")
                return False
            return self._write_line(line)

    def close(self, status: str | None = "finished", **fields: Any) -> None:
        """Write the ``end`` record (unless ``status`` is None) and close the file; if records
        were dropped, say once how many and why. Idempotent."""
        if self._closed:
            return
        if status is not None:
            end = {"type": "end", "ts": time.time(), "status": status, **fields}
            # dropped_records counts this very record too if it cannot be written: read it last.
            with self._mutex:
                end["dropped_records"] = self._dropped
                self._write_line(encode_record(end).encode("utf-8"))
        with self._mutex:
            self._closed = True
            self._close_fd()
            self._writer_lock.release()
            dropped, reason = self._dropped, self._drop_reason
        if dropped:
            superseded = f"another writer took the log ({self._superseded})" if self._superseded else ""
            records = "record" if dropped == 1 else "records"
            message = f"{dropped} {records} could not be written to {self.path}: {superseded or reason}"
            _log.warning("gradmon: %s", message)
            warnings.warn(f"gradmon: {message}", RuntimeWarning, stacklevel=2)

    def __enter__(self) -> RunLogWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.close("finished" if exc_type is None else "failed")

    # -- internals (called with the mutex held) ----------------------------------------------

    def _open(self, *, first: bool = False) -> bool:
        """Open (or reopen) the log: its directory, the one-writer lock, the file, and the end of
        a partial line left by a writer that died. ``first``: a held lock raises, else it makes
        this writer superseded."""
        try:
            directory = os.path.dirname(self.path)
            if directory:
                os.makedirs(directory, exist_ok=True)
            lock = self._writer_lock
            if not lock.held and lock.unlocked_reason is None:
                try:
                    lock.acquire(self._lock_note)
                except LogInUseError as exc:
                    if first:
                        raise
                    self._superseded = exc
                    self._warn(f"{exc}; this writer drops its records from now on")
                    return False
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
            fd = os.open(self.path, flags, 0o644)
            st = os.fstat(fd)
            self._fd = fd
            self._inode = (st.st_dev, st.st_ino)
        except OSError as exc:
            self._fail(exc, "open")
            return False
        if not self._end_partial_line(st.st_size):
            return False
        self._next_check = self._clock() + self._check_interval
        return True

    def _end_partial_line(self, size: int) -> bool:
        """If the log does not end with ``\\n`` its last writer died mid-line: end that line, so
        it is one malformed line to readers instead of swallowing our next record. False when
        that write failed (the file is then closed again, as after any failed write)."""
        if size == 0:
            return True
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                if (st.st_dev, st.st_ino) != self._inode:
                    return True
                f.seek(size - 1)
                last = f.read(1)
        except OSError:  # unreadable (a write-only file, a device): nothing to check
            return True
        if not last or last == b"\n":
            return True
        _log.warning("gradmon: run log %s ended in a partial line (its last writer died mid-write); "
                     "ending that line before writing", self.path)
        return self._write_all(b"\n")

    def _close_fd(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def _file_replaced(self) -> bool:
        """Whether the path no longer names the open file (deleted, or its directory removed)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return True
        return (st.st_dev, st.st_ino) != self._inode

    def _write_line(self, line: bytes) -> bool:
        if self._superseded is not None:  # another writer has the log now: never interleave
            self._dropped += 1
            return False
        now = self._clock()
        if self._fd is None:
            if now < self._retry_at or not self._open():
                self._dropped += 1
                self._dropped_since_recovery += 1
                return False
        elif now >= self._next_check:
            self._next_check = now + self._check_interval
            if self._file_replaced():
                self._close_fd()
                if not self._open():
                    self._dropped += 1
                    self._dropped_since_recovery += 1
                    return False
        if self._failing and not self._report_recovery():
            self._dropped += 1
            self._dropped_since_recovery += 1
            return False
        if not self._write_all(line):
            self._dropped += 1
            self._dropped_since_recovery += 1
            return False
        return True

    def _write_all(self, data: bytes) -> bool:
        assert self._fd is not None
        view = memoryview(data)
        try:
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
        except OSError as exc:
            self._fail(exc, "write")
            return False
        return True

    def _report_recovery(self) -> bool:
        """First successful reopen after failures: tell readers (and the user) what was lost."""
        missing = self._dropped_since_recovery
        event = {
            "type": "event",
            "kind": "io_error",
            "ts": time.time(),
            "dropped": missing,
            "message": f"run log was not writable; {missing} records dropped",
        }
        if not self._write_all(encode_record(event).encode("utf-8")):
            return False
        _log.warning("gradmon: run log %s writable again after dropping %d records", self.path, missing)
        self._failing = False
        self._backoff = self._retry_initial
        self._dropped_since_recovery = 0
        return True

    def _fail(self, exc: OSError, action: str) -> None:
        self._close_fd()
        self._failing = True
        what, lasting = describe_io_error(exc, self.path)
        self._drop_reason = what
        if lasting:  # no use trying at every step; a fix (chmod, remount, moving the file) is still seen
            self._retry_at = self._clock() + self._retry_max
            self._warn(f"cannot {action} run log {self.path}: {what}; its records are dropped (checked "
                       f"again every {self._retry_max:g} s, not at every step)")
            return
        self._retry_at = self._clock() + self._backoff
        self._backoff = min(self._backoff * 2, self._retry_max)
        self._warn(f"cannot {action} run log {self.path}: {what}; dropping records and retrying")

    def _warn(self, message: str) -> None:
        if self._warned:
            _log.debug("gradmon: %s", message)
            return
        self._warned = True
        _log.warning("gradmon: %s", message)
        warnings.warn(f"gradmon: {message}", RuntimeWarning, stacklevel=4)
