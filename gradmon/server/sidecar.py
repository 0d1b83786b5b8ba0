"""The index sidecar: a cache, beside a run's log, of what indexing it learned.

The log stays the only source of truth: the sidecar is never required, is checked against the log
before it is trusted, and is rebuilt from the log whenever it is stale or damaged. It lives in a
hidden directory beside the log, ``.<log file name>.gmidx/`` (run discovery skips hidden
directories), and holds:

- ``rows.offset`` / ``rows.step`` (int64) and ``rows.flags`` (uint8): one entry per step record,
  in file order (``columns.py``); ``col.<n>`` (float64): one numeric key's values from its first
  row on. Little-endian raw arrays, append-only (``numpy.memmap`` reads them as they are; the server
  itself needs only the standard library). A zoom reads its rows back from these instead of
  decoding the log's lines (:func:`read_rows`).
- ``lvl<L>.b`` / ``lvl<L>.f<k>``: the pyramid's four finest levels, which hold 255/256 of its
  buckets (``levelfiles.py``): the index reads them through memory maps instead of holding them.
- ``state``: a checkpoint of the rest of the index (the upper pyramid levels and the stored
  levels' newest summaries, segments, marks, events, eval, system, the alarm rule's state) at a
  line boundary ``size`` of the log, as one JSON header line (the format, ``size``, checksums of
  the log's first and last 64 KiB before ``size``, the row and column counts, the level files'
  lengths, the payload's CRC) and a pickle restricted to the index's own classes. Written to
  ``state.tmp`` and renamed, so a kill at any moment leaves the previous checkpoint or the new one.
  A restart restores it and tails the log from ``size`` on; the column and level files are cut back
  to the checkpoint's lengths (what was appended after it is read again from the log). Those files
  carry no checksum (checking one would read them whole at every restart): a file shorter than its
  length is found, a bit flipped inside one is not.
- ``lock``: held (``flock``) by the one server that writes the sidecar; another server of the
  same log, or a log directory the server cannot write, works from memory as before.

A log in a directory the server cannot write (a read-only mount of a cluster's logs) can have its
sidecar in an index directory instead (``gradmon serve --index-dir DIR``): ``DIR/<run directory's
name>-<hash of the log's real path>.gmidx/``, the same files, checked against the log the same way.

Writes that fail (a full disk) drop the sidecar for this server: it goes on from memory.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import mmap
import os
import pickle
import re
import sys
import warnings
import zlib
from array import array
from bisect import bisect_left
from dataclasses import dataclass
from typing import Any

from gradmon.server.columns import MAX_COLUMNS, MISSING, Rows

__all__ = ["FORMAT", "ColumnsRef", "Sidecar", "read_rows", "sidecar_dir", "unwritable"]

log = logging.getLogger("gradmon.server")

# 2: the four finest pyramid levels in lvl.* files (levelfiles.py); 3: a bucket's summary leaves a
# NaN in its middle out of its count and ends (pyramid.column_summary), so older levels are rebuilt;
# 4: the alarm rule learns no zero-norm step (logformat/alarms.py), so older derived alarms are rederived
FORMAT = 4
_HASHED = 65_536  # bytes of the log hashed at each end of the checkpointed part
_ROW_FILES = (("offset", "q"), ("step", "q"), ("flags", "B"))
_LITTLE = sys.byteorder == "little"
_COL_FILES = tuple(f"col.{num}" for num in range(MAX_COLUMNS))  # (named once, not at every append)
_LEVEL_FILE = re.compile(r"lvl\d{1,2}\.(?:b|f\d{1,4})")
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")  # (of a run directory's name, in an index directory's)


def sidecar_dir(log_path: str, index_dir: str | None = None) -> str:
    """The sidecar directory of a log file: beside it, or in ``index_dir`` (one directory for the
    sidecars of many logs, each named after its run directory and a hash of the log's real path:
    two logs never share one, and a log reached by another path finds its own)."""
    if index_dir is None:
        head, name = os.path.split(log_path)
        return os.path.join(head, f".{name}.gmidx")
    real = os.path.realpath(log_path)
    run = _UNSAFE_NAME.sub("_", os.path.basename(os.path.dirname(real)))[:64] or "run"
    return os.path.join(index_dir, f"{run}-{hashlib.sha256(os.fsencode(real)).hexdigest()[:16]}.gmidx")


def unwritable(exc: OSError) -> bool:
    """Whether a sidecar was refused because its directory cannot be written (a read-only mount,
    permissions), not because another server holds it."""
    return exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS)


def _raw(a: array | memoryview) -> bytes | memoryview:
    """An array, or a memoryview of native values (``Rows``: the compiled scanner's float64s), as
    the files keep them (little-endian)."""
    if isinstance(a, memoryview):
        if _LITTLE:
            return a.cast("B")  # (not copied)
        a = array(a.format, a.tobytes())  # pragma: no cover - big-endian hosts
    if not _LITTLE:  # pragma: no cover - big-endian hosts
        a = array(a.typecode, a)
        a.byteswap()
    return a.tobytes()


def _unraw(typecode: str, data: bytes) -> array:
    a = array(typecode)
    a.frombytes(data[:len(data) - len(data) % a.itemsize])
    if not _LITTLE:  # pragma: no cover
        a.byteswap()
    return a


def _log_digest(path: str, size: int) -> tuple[str, str] | None:
    """Checksums of the log's first and last ``_HASHED`` bytes before ``size`` (``None``: shorter)."""
    try:
        with open(path, "rb", buffering=0) as f:
            if os.fstat(f.fileno()).st_size < size:
                return None
            head = os.pread(f.fileno(), min(size, _HASHED), 0)
            lo = max(0, size - _HASHED)
            tail = os.pread(f.fileno(), size - lo, lo)
    except OSError:
        return None
    return hashlib.sha1(head).hexdigest(), hashlib.sha1(tail).hexdigest()


# What a checkpoint may hold: the index's own classes and the containers they use. Anything else
# in a (crafted or damaged) state file fails to load, and the index is rebuilt from the log.
_ALLOWED = {
    ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "object"), ("collections", "deque"),
    ("array", "array"), ("array", "_array_reconstructor"), ("copyreg", "_reconstructor"),
    ("gradmon.server.index", "RunIndex"), ("gradmon.server.steps", "StepSeries"),
    ("gradmon.server.pyramid", "Pyramid"), ("gradmon.server.pyramid", "Level"),
    ("gradmon.server.pyramid", "Summary"), ("gradmon.server.levelfiles", "LevelFile"),
    ("gradmon.server.segments", "Segments"),
    ("gradmon.server.sampled", "SampledSeries"), ("gradmon.server.sampled", "_Points"),
    ("gradmon.server.derived", "DerivedAlarms"), ("gradmon.server.derived", "Derived"),
    ("gradmon.server.alarmrule", "BatchAlarmRule"), ("gradmon.server.alarmrule", "WindowBaseline"),
    ("gradmon.logformat.alarms", "AlarmConfig"), ("gradmon.logformat.alarms", "AlarmRule"),
    ("gradmon.logformat.alarms", "RunningBaseline"), ("gradmon.logformat.alarms", "_Incident"),
}


class _CrcWriter:
    """A file's ``write`` that keeps the CRC-32 of what went through it."""

    def __init__(self, f: Any) -> None:
        self._f = f
        self.crc = 0

    def write(self, data: bytes) -> int:
        self.crc = zlib.crc32(data, self.crc)
        return self._f.write(data)


def _size(path: str) -> int:
    """A file's size; 0 when it does not exist (no row written yet)."""
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return 0


def _crc_of_rest(f: Any, chunk: int = 1 << 20) -> int:
    """CRC-32 of a file from its position to its end, a chunk at a time."""
    crc = 0
    while data := f.read(chunk):
        crc = zlib.crc32(data, crc)
    return crc


def _fork() -> int:
    """``os.fork()``; -1 where there is none (or it fails)."""
    if not hasattr(os, "fork"):
        return -1
    try:
        with warnings.catch_warnings():  # (3.12+: a warning about threads; the child only writes a file)
            warnings.simplefilter("ignore", DeprecationWarning)
            return os.fork()
    except OSError:
        return -1


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"{module}.{name} is not part of an index")
        return super().find_class(module, name)


@dataclass(frozen=True)
class ColumnsRef:
    """Where a history answer finds the rows (picklable, for the worker): the sidecar directory,
    the rows complete at the job's cursor, and per numeric key its file number and first row."""

    path: str
    rows: int
    columns: dict[str, tuple[int, int]]


def read_rows(ref: ColumnsRef, byte_lo: int, byte_hi: int,
              ) -> tuple[array, array, bytes, dict[str, tuple[int, array]]]:
    """The rows whose lines start in ``[byte_lo, byte_hi)``: steps, offsets, flags and per key
    ``(first position, values)`` as ``columns.series_from_columns`` takes them."""
    if ref.rows == 0:
        return array("q"), array("q"), b"", {}
    with open(os.path.join(ref.path, "rows.offset"), "rb") as f:
        size = min(os.fstat(f.fileno()).st_size // 8, ref.rows)
        if size == 0:
            return array("q"), array("q"), b"", {}
        with mmap.mmap(f.fileno(), size * 8, access=mmap.ACCESS_READ) as m:
            view = memoryview(m).cast("q")
            try:
                r0 = bisect_left(view, byte_lo)
                r1 = bisect_left(view, byte_hi, r0)
            finally:
                view.release()
    return _read_span(ref, r0, r1)


def _pread(path: str, lo: int, hi: int) -> bytes:
    with open(path, "rb", buffering=0) as f:
        return os.pread(f.fileno(), hi - lo, lo)


def _read_span(ref: ColumnsRef, r0: int, r1: int) -> tuple[array, array, bytes, dict[str, tuple[int, array]]]:
    d = ref.path
    offsets = _unraw("q", _pread(os.path.join(d, "rows.offset"), r0 * 8, r1 * 8))
    steps = _unraw("q", _pread(os.path.join(d, "rows.step"), r0 * 8, r1 * 8))
    flags = _pread(os.path.join(d, "rows.flags"), r0, r1)
    n = min(len(offsets), len(steps), len(flags))  # a sidecar reset under us: what is there
    cols: dict[str, tuple[int, array]] = {}
    for name, (num, first) in ref.columns.items():
        a = max(r0, first)
        if a >= r1:
            continue
        values = _unraw("d", _pread(os.path.join(d, f"col.{num}"), (a - first) * 8, (r1 - first) * 8))
        cols[name] = (a - r0, values)
    return steps[:n], offsets[:n], flags[:n], cols


class Sidecar:
    """The sidecar of one log, locked by this server (see the module docstring)."""

    # Checkpoints written by a forked child (where the platform forks). Off: on the shared 2-core
    # machine of benchmarks/RESULTS.md the live pushes' p99 while a big run was indexed was ~0.4 s
    # with it (3 runs of benchmarks.server_stress) and ~0.1 s without, though the fork itself costs
    # the caller 2-20 ms (the copy-on-write faults that follow, presumably: not understood yet).
    background = False

    def __init__(self, path: str, lock_fd: int) -> None:
        self.path = path
        self._lock_fd = lock_fd
        self.rows = 0
        self.columns: dict[str, tuple[int, int]] = {}  # key -> (file number, first row)
        self.complete = True  # every numeric key has a column (else zooms read the log's lines)
        self.checkpointed = -1  # the log size of the latest checkpoint written or read
        self.seen: set[str] = set()  # keys of the step records so far (columns.step_rows)
        self._fds: dict[str, int] = {}
        self._pending: dict[str, list[bytes]] = {}  # appended rows not written yet, per file
        self._pending_bytes = 0
        self._child: int | None = None  # the child writing a checkpoint

    @classmethod
    def open(cls, log_path: str, index_dir: str | None = None) -> Sidecar:
        """The sidecar of ``log_path`` (beside it, or in ``index_dir``: :func:`sidecar_dir`),
        created if need be. Raises ``OSError`` when it cannot be written (:func:`unwritable`: a
        read-only directory) or another server holds it."""
        path = sidecar_dir(log_path, index_dir)
        fd = -1
        try:
            os.makedirs(path, exist_ok=True)
            fd = os.open(os.path.join(path, "lock"), os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            if fd >= 0:
                os.close(fd)
            raise
        return cls(path, fd)

    # ---- restoring ------------------------------------------------------------------------

    def load(self, log_path: str) -> tuple[Any, int] | None:
        """The checkpointed index and the log size it covers, when the checkpoint is intact and
        matches the log (then the columns are cut back to it); else ``None`` (call :meth:`reset`)."""
        try:
            with open(os.path.join(self.path, "state"), "rb") as f:
                head = json.loads(f.readline())
                start = f.tell()
                if head.get("format") != FORMAT or _crc_of_rest(f) != head["crc"]:
                    return None
                size, rows = int(head["size"]), int(head["rows"])
                if _log_digest(log_path, size) != (head["head"], head["tail"]):
                    return None  # the log changed (rewritten, truncated) since: stale
                columns = {str(k): (int(v[0]), int(v[1])) for k, v in head["columns"].items()}
                lengths = [(f"rows.{n}", rows * array(tc).itemsize) for n, tc in _ROW_FILES]
                lengths += [(f"col.{num}", (rows - first) * 8) for num, first in columns.values()]
                files = {str(k): int(v) for k, v in head["files"].items()}
                if not all(map(_LEVEL_FILE.fullmatch, files)):
                    return None  # (a crafted name: nothing outside the directory is ever touched)
                lengths += files.items()
                for name, want in lengths:
                    if _size(os.path.join(self.path, name)) < want:
                        return None  # a column shorter than the checkpoint: damaged
                f.seek(start)
                index = _Unpickler(f).load()  # from the file: the payload is never held whole
            from gradmon.server.index import RunIndex

            if not isinstance(index, RunIndex) or index.steps.pyramid.files() != files:
                return None
            for name, want in lengths:  # rows after the checkpoint are read again from the log
                if want or _size(os.path.join(self.path, name)):
                    os.truncate(os.path.join(self.path, name), want)
        except Exception as exc:  # any damage at all: rebuild from the log
            log.info("index sidecar of %s not used (%s: %s): re-indexing", log_path, type(exc).__name__, exc)
            return None
        self.rows, self.columns, self.complete = rows, columns, bool(head["complete"])
        self.seen = set(head.get("seen", ()))
        self.checkpointed = size
        return index, size

    def reset(self) -> None:
        """Forget everything (a new generation of the log, or a checkpoint not usable)."""
        self._pending, self._pending_bytes, self.seen = {}, 0, set()
        self._close_files()
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(self.path, "state"))
        for name in os.listdir(self.path):
            if name.startswith(("rows.", "col.", "lvl")):
                os.unlink(os.path.join(self.path, name))
        self.rows, self.columns, self.complete, self.checkpointed = 0, {}, True, -1

    # ---- writing --------------------------------------------------------------------------

    def _fd(self, name: str) -> int:
        fd = self._fds.get(name)
        if fd is None:
            fd = self._fds[name] = os.open(os.path.join(self.path, name),
                                           os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        return fd

    def _add(self, name: str, data: bytes) -> None:
        self._pending.setdefault(name, []).append(data)
        self._pending_bytes += len(data)

    def flush(self) -> None:
        """Write the rows appended so far (raises ``OSError`` when a write fails)."""
        pending, self._pending, self._pending_bytes = self._pending, {}, 0
        for name, parts in pending.items():
            data = b"".join(parts)
            fd = self._fd(name)
            while data:
                data = data[os.write(fd, data):]

    @property
    def unflushed(self) -> int:
        """Bytes appended and not written yet."""
        return self._pending_bytes

    def append(self, rows: Rows) -> None:
        """Append a batch's rows (buffered: :meth:`flush` writes them)."""
        n = len(rows)
        if n == 0:
            return
        for name, col in rows.columns.items():
            if name not in self.columns:
                if len(self.columns) >= MAX_COLUMNS:
                    self.complete = False
                    continue
                self.columns[name] = (len(self.columns), self.rows + col[0])
        for name, (num, _first) in self.columns.items():
            col = rows.columns.get(name)
            # A known key's values start at the batch's first row, a new key's at its column's first;
            # a key no record of the batch has gets MISSING.
            self._add(_COL_FILES[num], _raw(array("d", [MISSING])) * n if col is None else _raw(col[1]))
        self._add("rows.offset", _raw(rows.offsets))
        self._add("rows.step", _raw(rows.steps))
        self._add("rows.flags", bytes(rows.flags))
        self.rows += n

    def checkpoint(self, index: Any, log_path: str, size: int) -> bool:
        """Write the checkpoint of ``index``, which covers the log's first ``size`` bytes (a line
        boundary), atomically; ``False`` when the previous one is still being written (then try
        later). Raises ``OSError`` when it cannot.

        It runs on the event loop (the GIL makes a thread no better): the columns' and stored
        levels' last appends, then the pickle of what the index holds in memory (~1 MB for 2M
        steps: ~3 ms; it was the whole pyramid, ~14 MB and ~0.1 s, before the levels went to
        files). With ``background`` set, a forked child (a copy-on-write snapshot of the index)
        writes it while the server goes on."""
        if not self.reap():
            return False
        digest = _log_digest(log_path, size)
        if digest is None:
            return True  # the log shrank under us: the next poll resets everything
        self.flush()  # the columns first: a checkpoint never counts rows that are not on disk
        index.steps.pyramid.flush()  # and the stored levels' tails (smaller checkpoints)
        head = {"format": FORMAT, "size": size, "head": digest[0], "tail": digest[1], "rows": self.rows,
                "columns": self.columns, "complete": self.complete, "seen": sorted(self.seen),
                "files": index.steps.pyramid.files()}
        pid = _fork() if self.background else -1
        if pid > 0:
            self._child = pid
        elif pid == 0:  # the child
            code = 1
            try:
                self._write_state(index, head)
                code = 0
            finally:
                os._exit(code)
        else:  # no fork here: in this process
            self._write_state(index, head)
        self.checkpointed = size
        return True

    def _write_state(self, index: Any, head: dict[str, Any]) -> None:
        """Pickle straight into the file (a payload built in memory first, ~14 MB for 2M steps,
        stays in the server's RSS afterwards: the allocator keeps it), the header line rewritten
        in place with the payload's CRC once it is known (padded to a fixed width)."""
        line = json.dumps({**head, "crc": 0}).encode()
        width = len(line) + 16  # room for any 32-bit CRC
        tmp = os.path.join(self.path, "state.tmp")
        with open(tmp, "wb") as f:
            f.write(b" " * width + b"\n")
            out = _CrcWriter(f)
            pickle.Pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(index)
            f.seek(0)
            f.write(json.dumps({**head, "crc": out.crc}).encode().ljust(width))
        os.replace(tmp, os.path.join(self.path, "state"))

    def reap(self, wait: bool = False) -> bool:
        """Whether no checkpoint is being written by a child (``wait``: until it is done)."""
        if self._child is None:
            return True
        try:
            pid, _status = os.waitpid(self._child, 0 if wait else os.WNOHANG)
        except ChildProcessError:
            pid = self._child
        if pid == 0:
            return False
        self._child = None
        return True

    def ref(self) -> ColumnsRef | None:
        """What a history job needs to read rows (``None`` when some key has no column); the rows
        appended so far are written first (raises ``OSError`` when that fails)."""
        if not self.complete:
            return None
        self.flush()
        return ColumnsRef(self.path, self.rows, dict(self.columns))

    def _close_files(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = {}

    def close(self) -> None:
        """Close the files and release the lock (after a checkpoint being written is done)."""
        self.reap(wait=True)
        self._close_files()
        if self._lock_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)
            self._lock_fd = -1
