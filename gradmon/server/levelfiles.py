"""The lower pyramid levels of a run, kept in files of its index sidecar and read through memory maps.

Most of a pyramid is its finest levels (the four finest hold 255/256 of its buckets); for a
10M-step run of ten numeric fields they hold ~74 MB. With a sidecar (``sidecar.py``) a
:class:`LevelFile` keeps the buckets of one such level that are written (``pyramid.Level`` holds
the newer ones in memory and writes them in batches), so a server's memory no longer grows with
the run's length: only the pages a query touches are read, and they are the operating system's
cache, dropped from the process with the maps after each query (:meth:`LevelFile.release`).

Files, in the sidecar directory, little-endian fixed-width records, append-only:

- ``lvl<L>.b``: per bucket ``lo, hi, n, offset`` (4 int64: ``BASE``);
- ``lvl<L>.f<k>``: per bucket from the field's first bucket on, its
  ``[count, first_step, first, last_step, last, min_step, min, max_step, max]`` (``FIELD``).

A record is never rewritten once written (the next write starts at the stored count), so a checkpoint
that names the files' lengths stays true whatever is appended after it; the checkpoint's loader
cuts them back to those lengths (``Sidecar.load``). The standard library's ``mmap`` and ``struct``
read them (numpy would do the same, but the server does not depend on it).
"""

from __future__ import annotations

import mmap
import os
import struct
import sys
from array import array
from collections.abc import Sequence
from typing import Any

from gradmon.server.native import scanner as _native_scanner

__all__ = ["BASE", "FIELD", "LevelFile", "field_columns"]

BASE = struct.Struct("<qqqq")  # lo, hi, n, offset
FIELD = struct.Struct("<qqdqdqdqd")  # as pyramid.Summary.fields holds it
_SPAN = struct.Struct("<qq")
_Q = struct.Struct("<q")
_LITTLE = sys.byteorder == "little"


def _map(path: str, length: int) -> mmap.mmap:
    with open(path, "rb") as f:
        return mmap.mmap(f.fileno(), length, access=mmap.ACCESS_READ)


def _rows(record: struct.Struct, columns: Sequence[Sequence[Any]], k: int) -> bytes:
    """The first ``k`` records of ``columns`` packed as ``record`` (``BASE`` or ``FIELD``: 8-byte
    little-endian items), by the compiled scanner in one call where it can (``array`` columns of
    4- and 8-byte items, on a little-endian machine), else a record at a time."""
    native = _native_scanner() if _LITTLE else None
    if native is not None and all(type(c) is array for c in columns):
        return native.rows_of_columns(list(columns), tuple(c.itemsize for c in columns), k)
    return b"".join(map(record.pack, *columns))


def _write_at(path: str, offset: int, data: bytes) -> None:
    """Write ``data`` at ``offset`` (what lay there and after is overwritten: an earlier write that
    failed half way, or rows written after the checkpoint this index was restored from)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while data:
            n = os.pwrite(fd, data, offset)
            data = data[n:]
            offset += n
    finally:
        os.close(fd)


class LevelFile:
    """The written buckets ``[0, size)`` of pyramid level ``level`` (see the module docstring).
    Pickled without its directory: :meth:`attach` gives it one (a restored index)."""

    def __init__(self, level: int) -> None:
        self.level = level
        self.size = 0
        self.fields: dict[str, tuple[int, int]] = {}  # name -> (file number, first bucket)
        self.directory: str | None = None
        # Mapped at first read, apart: most reads of a query (spans, counts) need the base file only.
        self._base_map: mmap.mmap | None = None
        self._field_maps: list[tuple[str, mmap.mmap, int]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"level": self.level, "size": self.size, "fields": dict(self.fields)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["level"])  # type: ignore[misc]
        self.size, self.fields = state["size"], state["fields"]

    def attach(self, directory: str) -> None:
        self.directory = directory
        self.release()

    def _path(self, suffix: str) -> str:
        assert self.directory is not None, "a LevelFile used before attach()"
        return os.path.join(self.directory, f"lvl{self.level}.{suffix}")

    def lengths(self) -> dict[str, int]:
        """The bytes each file must hold (file name -> length)."""
        out = {f"lvl{self.level}.b": self.size * BASE.size}
        for num, first in self.fields.values():
            out[f"lvl{self.level}.f{num}"] = (self.size - first) * FIELD.size
        return out

    # ---- writing --------------------------------------------------------------------------

    def append(self, lo: Sequence[int], hi: Sequence[int], n: Sequence[int], offset: Sequence[int],
               fields: dict[str, list[array]]) -> None:
        """Write the next buckets (columns as ``pyramid.Level`` holds them; ``fields`` holds every
        field this file has, and maybe new ones). Raises ``OSError`` when a write fails (then
        nothing counts as written)."""
        k = len(lo)
        if k == 0:
            return
        new = dict(self.fields)
        writes = [(self._path("b"), self.size * BASE.size, _rows(BASE, [lo, hi, n, offset], k))]
        for name, cols in fields.items():
            if name not in new:
                new[name] = (len(new), self.size)
            num, first = new[name]
            writes.append((self._path(f"f{num}"), (self.size - first) * FIELD.size, _rows(FIELD, cols, k)))
        assert len(new) == len(fields), "a field of the file missing from the buckets written"
        for path, at, data in writes:
            _write_at(path, at, data)
        self.fields = new
        self.size += k
        self.release()

    # ---- reading --------------------------------------------------------------------------

    def release(self) -> None:
        """Drop the maps (the pages read go back to being the system's cache, not this process's
        memory); the next read maps the files again."""
        self._base_map = self._field_maps = None

    @property
    def mapped(self) -> bool:
        """Whether a file is mapped (until :meth:`release`)."""
        return self._base_map is not None or self._field_maps is not None

    def _mapped_base(self) -> mmap.mmap:
        if self._base_map is None:
            self._base_map = _map(self._path("b"), self.size * BASE.size)
        return self._base_map

    def _mapped_fields(self) -> list[tuple[str, mmap.mmap, int]]:
        if self._field_maps is None:
            self._field_maps = [(name, _map(self._path(f"f{num}"), (self.size - first) * FIELD.size), first)
                                for name, (num, first) in self.fields.items() if first < self.size]
        return self._field_maps

    def base(self, i: int) -> tuple[int, int, int, int]:
        """Bucket ``i``'s ``lo, hi, n, offset``."""
        return BASE.unpack_from(self._mapped_base(), i * BASE.size)

    def span(self, i: int) -> tuple[int, int]:
        """Bucket ``i``'s smallest and largest step."""
        return _SPAN.unpack_from(self._mapped_base(), i * BASE.size)

    def column(self, i: int, k: int) -> int:
        """Bucket ``i``'s ``k``-th base value (0: lo, 1: hi, 2: n, 3: offset)."""
        return _Q.unpack_from(self._mapped_base(), i * BASE.size + 8 * k)[0]

    def fields_at(self, i: int) -> dict[str, list]:
        """Bucket ``i``'s fields (those with a value there)."""
        out = {}
        for name, m, first in self._mapped_fields():
            if i >= first:
                f = list(FIELD.unpack_from(m, (i - first) * FIELD.size))
                if f[0]:
                    out[name] = f
        return out

    def field_records(self, name: str, i0: int, i1: int) -> tuple[int, bytes] | None:
        """Buckets ``[i0, i1)`` of field ``name`` as its ``FIELD`` records, from its first bucket
        there on: ``(that bucket, the records' bytes)``; ``None`` when it has none. One read
        (``pread``: no map to set up and tear down, ~0.1 ms a query for ten fields' files)."""
        got = self.fields.get(name)
        if got is None:
            return None
        num, first = got
        j0, j1 = max(i0, first) - first, min(i1, self.size) - first
        if j1 <= j0:
            return None
        fd = os.open(self._path(f"f{num}"), os.O_RDONLY)
        try:
            raw = os.pread(fd, (j1 - j0) * FIELD.size, j0 * FIELD.size)
        finally:
            os.close(fd)
        if len(raw) != (j1 - j0) * FIELD.size:
            raise OSError(f"{self._path(f'f{num}')} is shorter than its {self.size} buckets")
        return j0 + first, raw


def field_columns(raw: bytes) -> list[array]:
    """``FIELD`` records' bytes as nine columns (the record's members)."""
    ints, floats = array("q"), array("d")
    ints.frombytes(raw)
    floats.frombytes(raw)
    if not _LITTLE:  # (the records are little-endian)
        ints.byteswap()
        floats.byteswap()
    return [(floats if k in (2, 4, 6, 8) else ints)[k::9] for k in range(9)]
