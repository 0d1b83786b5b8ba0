"""One writer per run log: an advisory lock held while a writer has the log open.

The lock is ``fcntl.flock`` on a small file beside the log (``dir/.metrics.jsonl.lock``) that
also holds a note naming its holder (pid, host, start time, run id), so a refused writer can say
who has the log. ``flock`` belongs to the open file, so a second writer in the same process is
refused like one in another process, and the kernel releases the lock when its holder dies: a
killed run never blocks the next one (its note is simply overwritten). The holder removes the
file when it closes the log. Where ``flock`` is unavailable (Windows, some network file systems)
writing goes on unlocked, with a warning.

Stdlib only: the server and benchmarks import the writer without MindSpore.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Mapping
from typing import Any

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["LogInUseError", "WriterLock", "lock_path"]

_log = logging.getLogger("gradmon.monitor.writelock")


def lock_path(log_path: str) -> str:
    """``dir/metrics.jsonl`` -> ``dir/.metrics.jsonl.lock``."""
    directory, name = os.path.split(log_path)
    return os.path.join(directory, f".{name}.lock")


class LogInUseError(RuntimeError):
    """Another writer holds the run log. ``holder``: its note (``pid``, ``host``, ``since``,
    ``run_id``), empty when it could not be read."""

    def __init__(self, log_path: str, holder: Mapping[str, Any]) -> None:
        self.log_path = log_path
        self.holder = dict(holder)
        who = (f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}"
               if holder else "another writer (its note is not readable yet)")
        if holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
            who += " (this process: close the other writer first)"
        since = holder.get("since")
        when = ""
        if isinstance(since, (int, float)):
            when = time.strftime(" since %Y-%m-%d %H:%M:%S", time.localtime(since))
        super().__init__(
            f"run log {log_path} is being written by {who}{when}; one writer per log: stop that run, or "
            f"write to another file (lock: {lock_path(log_path)})"
        )


class WriterLock:
    """The lock of one run log. :meth:`acquire` takes it or raises :class:`LogInUseError`;
    :meth:`release` gives it back (and removes the lock file)."""

    def __init__(self, log_path: str) -> None:
        self.log_path = log_path
        self.path = lock_path(log_path)
        self._fd: int | None = None
        self._ino: tuple[int, int] | None = None
        self.unlocked_reason: str | None = None  # set when locking is impossible here

    @property
    def held(self) -> bool:
        """Whether this writer holds the lock and the lock file is still in place (a removed run
        directory takes it along: then :meth:`acquire` again)."""
        if self._fd is None:
            return False
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self._ino

    def acquire(self, note: Mapping[str, Any]) -> None:
        """Take the lock (the log's directory must exist) and write ``note`` (plus ``pid``,
        ``host``, ``since``) into it. Raises :class:`LogInUseError` when another writer holds
        it; an ``OSError`` when the lock file cannot be made."""
        self.release()
        if fcntl is None:
            self._unlocked("fcntl.flock is not available on this platform")
            return
        for _ in range(100):  # a holder that is closing removes the file: then lock the new one
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_note(fd)
                os.close(fd)
                raise LogInUseError(self.log_path, holder) from None
            except OSError as exc:  # ENOLCK, EOPNOTSUPP: no locks on this file system
                os.close(fd)
                self._unlocked(f"cannot lock {self.path}: {exc}")
                return
            st = os.fstat(fd)
            try:
                same = os.stat(self.path).st_ino == st.st_ino
            except OSError:
                same = False
            if same:
                self._fd, self._ino = fd, (st.st_dev, st.st_ino)
                break
            os.close(fd)
        else:
            raise OSError(f"could not lock {self.path}: it keeps being replaced")
        info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(), **note}
        with contextlib.suppress(OSError):  # the note only serves error messages
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, (json.dumps(info) + "\n").encode("utf-8"), 0)

    def release(self) -> None:
        """Remove the lock file (while still holding it, so nobody locks a file on its way out)
        and unlock. Idempotent."""
        if self._fd is None:
            return
        if self.held:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        with contextlib.suppress(OSError):
            os.close(self._fd)
        self._fd = self._ino = None

    def __del__(self) -> None:  # a writer that was never closed: its lock goes with it
        with contextlib.suppress(Exception):  # (at interpreter exit the kernel releases it anyway)
            self.release()

    def _unlocked(self, reason: str) -> None:
        if self.unlocked_reason is None:
            _log.warning("gradmon: %s; writing %s without the one-writer lock", reason, self.log_path)
        self.unlocked_reason = reason


def _read_note(fd: int) -> dict[str, Any]:
    try:
        note = json.loads(os.pread(fd, 4096, 0).decode("utf-8"))
    except (OSError, ValueError):
        return {}
    return note if isinstance(note, dict) else {}
