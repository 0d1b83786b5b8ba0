"""Split a byte stream into complete lines: the one rule every reader of a run log follows.

A line is taken only once its ``\\n`` has arrived (the writer may be half-way through it), and a
line longer than :data:`MAX_LINE_BYTES` is skipped without ever being held whole in memory. The
writer refuses records longer than the same limit.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import accumulate, repeat
from operator import add
from typing import Optional

__all__ = ["MAX_LINE_BYTES", "LineSplitter"]

MAX_LINE_BYTES = 1 << 20  # records are small; anything longer is garbage, skipped unbuffered


# A compiled equivalent of the loop over a block's lines after its first (the server's,
# ``gradmon.server.native``): ``split_lines(data, start, base, max_line)`` gives the complete lines of
# ``data[start:]`` as ``(base + end, line)`` pairs (a ``\r`` before a ``\n`` dropped) and the position
# after the last ``\n``, or ``None`` when a line is longer than ``max_line``.
SplitLines = Callable[[bytes, int, int, int], Optional[tuple[list[tuple[int, bytes]], int]]]


class LineSplitter:
    """Incremental splitter of a byte stream into complete LF-terminated lines.

    ``feed(data)`` takes the bytes that follow everything fed before and returns the complete
    lines it finishes as ``(end_offset, line)`` pairs: ``end_offset`` is the file offset just
    after the line's ``\\n``; ``line`` is the line without its ``\\n`` (and without a ``\\r``
    before it), or ``None`` for a line longer than ``max_line`` (skipped, never buffered whole).
    Bytes after the last ``\\n`` wait, buffered (at most ``max_line`` of them), for the next feed.
    ``split_lines``: a compiled splitter (:data:`SplitLines`) for the lines after a block's first,
    which then need no Python object but their own (the same lines either way).
    """

    def __init__(self, offset: int = 0, max_line: int = MAX_LINE_BYTES,
                 split_lines: SplitLines | None = None) -> None:
        self.line_start = offset  # offset where the pending (partial) line begins
        self.fed = offset  # offset of the next byte to feed
        self.max_line = max_line
        self._buf = bytearray()
        self._oversize = False
        self._split_lines = split_lines

    @property
    def pending(self) -> int:
        """Bytes of the partial line fed so far (including skipped bytes of an oversize line)."""
        return self.fed - self.line_start

    def feed(self, data: bytes | bytearray) -> list[tuple[int, bytes | None]]:
        """The lines ``data`` completes (a ``bytearray`` is read here only: the lines are bytes
        of their own, so its owner may reuse it once this returns)."""
        out: list[tuple[int, bytes | None]] = []
        if not data:
            return out
        base = self.fed
        self.fed = base + len(data)
        max_line = self.max_line
        if self._split_lines is not None:
            nl = data.find(b"\n")
            got = self._split_lines(data, nl + 1, base, max_line) if nl >= 0 else None
            if got is not None:  # (else a line too long after the first: the loop below says which)
                self._finish_line(bytes(data[:nl]), base + nl + 1, out)
                lines, last = got
                out += lines
                if lines:
                    self.line_start = lines[-1][0]
                self._keep(data[last:])
                return out
        if type(data) is not bytes:
            data = bytes(data)  # (the lines below are its parts: bytes, not views of a reused buffer)
        parts = data.split(b"\n")  # one C call for the whole block; the last part is unfinished
        rest = parts.pop()
        if parts:
            end = base + len(parts[0]) + 1
            self._finish_line(parts[0], end, out)
            del parts[0]
            if parts:
                cr = b"\r" in data
                if not cr and max(map(len, parts)) <= max_line:  # the common block: plain lines
                    ends = list(accumulate(map(add, map(len, parts), repeat(1)), initial=end))
                    del ends[0]  # (that is the first line's end, already out)
                    end = ends[-1]
                    out.extend(zip(ends, parts))
                else:
                    for p in parts:
                        end += len(p) + 1
                        if len(p) > max_line:
                            out.append((end, None))
                        else:
                            out.append((end, p[:-1] if cr and p.endswith(b"\r") else p))
            self.line_start = end
        self._keep(rest)
        return out

    def _finish_line(self, first: bytes, end: int, out: list[tuple[int, bytes | None]]) -> None:
        """Hand out the line that ``first`` (a block's bytes before its first ``\\n``, which is at
        ``end - 1``) finishes: the buffered partial line and ``first``."""
        if self._oversize or len(self._buf) + len(first) > self.max_line:
            line: bytes | None = None
        else:
            line = bytes(self._buf) + first if self._buf else first
            if line.endswith(b"\r"):
                line = line[:-1]
        out.append((end, line))
        self.line_start = end
        self._buf = bytearray()
        self._oversize = False

    def _keep(self, rest: bytes) -> None:
        """Buffer a block's bytes after its last ``\\n`` (the start of a line still being written)."""
        if rest and not self._oversize:
            if len(self._buf) + len(rest) > self.max_line:
                self._oversize = True
                self._buf = bytearray()
            else:
                self._buf += rest
