"""Reading run logs (``metrics.jsonl``, see docs/format.md): the half of the log contract every reader shares.

:func:`read_records` yields the valid records of a log, never a trailing partial line, and counts
what it skips in a :class:`ReadStats`.

No MindSpore import here: the server uses this module.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any, Union

from gradmon.logformat.jsonl import RecordError, decode_line
from gradmon.logformat.lines import MAX_LINE_BYTES, LineSplitter

__all__ = ["ReadStats", "read_records"]

PathLike = Union[str, "os.PathLike[str]"]

@dataclass
class ReadStats:
    """What :func:`read_records` saw.

    ``lines``: complete lines (each ended by ``\\n``); ``records``: valid records yielded;
    ``malformed``: complete lines skipped (not JSON, no ``type`` nor integer ``step``, wrong field
    types, longer than the line limit, blank); ``partial_tail_bytes``: bytes after the last ``\\n``
    (a line still being written, not taken); ``consumed_bytes``: bytes up to and including the
    last ``\\n`` — where to resume reading once more data has arrived.
    """

    lines: int = 0
    records: int = 0
    malformed: int = 0
    partial_tail_bytes: int = 0
    consumed_bytes: int = 0


def read_records(
    source: PathLike | IO[bytes],
    *,
    stats: ReadStats | None = None,
    max_line_bytes: int = MAX_LINE_BYTES,
    chunk_size: int = 1 << 16,
) -> Iterator[dict[str, Any]]:
    """Yield the valid records of a run log, in order.

    ``source``: a path, or a binary file object read from its current position to its end.
    Complete lines only: bytes after the last ``\\n`` are a partial line and are not taken
    (counted in ``stats.partial_tail_bytes``). Lines that are not valid records are skipped and
    counted; a line longer than ``max_line_bytes`` is skipped without being held in memory.
    Non-finite values written as ``"NaN"``/``"Infinity"``/``"-Infinity"`` come back as floats.
    Logs of other writers are read too (docs/format.md): bare ``NaN``/``Infinity``/``-Infinity``
    tokens are floats, and an object without ``type`` but with an integer ``step`` is a step
    record (yielded with ``"type": "step"``). Never raises for bad content (only for an
    unreadable path).
    """
    st = stats if stats is not None else ReadStats()
    if isinstance(source, (str, bytes, os.PathLike)):
        with open(source, "rb") as f:
            yield from _read_stream(f, st, max_line_bytes, chunk_size)
    else:
        yield from _read_stream(source, st, max_line_bytes, chunk_size)


def _read_stream(
    f: IO[bytes], st: ReadStats, max_line_bytes: int, chunk_size: int
) -> Iterator[dict[str, Any]]:
    if isinstance(f, io.TextIOBase):
        raise TypeError("read_records needs a binary file (open(path, 'rb'))")
    splitter = LineSplitter(0, max_line_bytes)
    while True:
        chunk = f.read(chunk_size)
        if not chunk:
            break
        for end, line in splitter.feed(chunk):
            st.lines += 1
            st.consumed_bytes = end
            if line is None:  # over the line limit, skipped unbuffered
                st.malformed += 1
                continue
            try:
                record = decode_line(line)
            except RecordError:
                st.malformed += 1
            else:
                st.records += 1
                yield record
    st.partial_tail_bytes = splitter.pending
