"""Split a byte stream into complete lines: the one rule every reader of a run log follows.

A line is taken only once its ``\\n`` has arrived (the writer may be half-way through it), and a
line longer than :data:`MAX_LINE_BYTES` is skipped without ever being held whole in memory. The
writer refuses records longer than the same limit.
"""

from __future__ import annotations

from itertools import accumulate, repeat
from operator import add

__all__ = ["MAX_LINE_BYTES", "LineSplitter"]

MAX_LINE_BYTES = 1 << 20  # records are small; anything longer is garbage, skipped unbuffered


class LineSplitter:
    """Incremental splitter of a byte stream into complete LF-terminated lines.

    ``feed(data)`` takes the bytes that follow everything fed before and returns the complete
    lines it finishes as ``(end_offset, line)`` pairs: ``end_offset`` is the file offset just
    after the line's ``\\n``; ``line`` is the line without its ``\\n`` (and without a ``\\r``
    before it), or ``None`` for a line longer than ``max_line`` (skipped, never buffered whole).
    Bytes after the last ``\\n`` wait, buffered (at most ``max_line`` of them), for the next feed.
    """

    def __init__(self, offset: int = 0, max_line: int = MAX_LINE_BYTES) -> None:
        self.line_start = offset  # offset where the pending (partial) line begins
        self.fed = offset  # offset of the next byte to feed
        self.max_line = max_line
        self._buf = bytearray()
        self._oversize = False

    @property
    def pending(self) -> int:
        """Bytes of the partial line fed so far (including skipped bytes of an oversize line)."""
        return self.fed - self.line_start

    def feed(self, data: bytes) -> list[tuple[int, bytes | None]]:
        out: list[tuple[int, bytes | None]] = []
        if not data:
            return out
        base = self.fed
        self.fed = base + len(data)
        parts = data.split(b"\n")  # one C call for the whole block; the last part is unfinished
        rest = parts.pop()
        max_line = self.max_line
        if parts:
            first = parts[0]
            end = base + len(first) + 1
            if self._oversize or len(self._buf) + len(first) > max_line:
                line: bytes | None = None
            else:
                line = bytes(self._buf) + first if self._buf else first
                if line.endswith(b"\r"):
                    line = line[:-1]
            out.append((end, line))
            self._buf = bytearray()
            self._oversize = False
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
        if rest and not self._oversize:
            if len(self._buf) + len(rest) > max_line:
                self._oversize = True
                self._buf = bytearray()
            else:
                self._buf += rest
        return out
