"""The process's open-files limit (``RLIMIT_NOFILE``), raised by ``gradmon serve`` at start.

Every WebSocket client holds a descriptor, besides the run files being tailed: 1,000 clients need
more than the soft limit of 1,024 that many systems start processes with, while the hard limit is
usually far higher. Raising the soft limit up to the hard one needs no privilege. It is raised to
the hard limit, at most :data:`MAX_OPEN_FILES` (plenty for a dashboard server; a huge soft limit
slows programs that close every possible descriptor). Failing to raise it is never an error: the
server runs with what it has, and says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["MAX_OPEN_FILES", "OpenFilesLimit", "raise_open_files_limit"]

MAX_OPEN_FILES = 65_536
LOW_OPEN_FILES = 4_096  # below this, the start-up line says how to get more


@dataclass(frozen=True)
class OpenFilesLimit:
    """The soft limit ``before`` and ``after`` raising it, the ``hard`` limit (``None``: unlimited,
    or unknown with ``error``), and why it could not be raised."""

    before: int | None
    after: int | None
    hard: int | None
    error: str | None = None

    def describe(self) -> str:
        """One line for the server's start-up output."""
        hard = "unlimited" if self.hard is None else str(self.hard)
        if self.error is not None and self.before is None:
            return f"open-files limit unknown ({self.error})"
        if self.error is not None:
            return (f"open-files limit stays {self.before} (hard limit {hard}): could not raise it "
                    f"({self.error}); about {self.before} WebSocket clients at most")
        if self.after != self.before:
            return f"open-files limit raised from {self.before} to {self.after} (hard limit {hard})"
        if self.after is None:
            return f"open-files limit unlimited (hard limit {hard})"
        note = "" if self.after >= LOW_OPEN_FILES else \
            f"; about {self.after} WebSocket clients at most (raise the hard limit, ulimit -Hn, for more)"
        return f"open-files limit {self.after} (hard limit {hard}){note}"


def raise_open_files_limit(target: int = MAX_OPEN_FILES, *, resource_module: Any = None) -> OpenFilesLimit:
    """Raise this process's soft ``RLIMIT_NOFILE`` towards its hard limit, to at most ``target``;
    never raises. (``resource_module``: a stand-in for the ``resource`` module, for tests.)"""
    res = resource_module
    if res is None:
        try:
            import resource as res
        except ImportError:  # not a POSIX system
            return OpenFilesLimit(None, None, None, "no resource module on this platform")
    try:
        soft, hard = res.getrlimit(res.RLIMIT_NOFILE)
    except (OSError, ValueError) as exc:
        return OpenFilesLimit(None, None, None, str(exc))
    inf = res.RLIM_INFINITY
    hard_or_none = None if hard == inf else hard
    if soft == inf:
        return OpenFilesLimit(None, None, hard_or_none)
    want = target if hard == inf else min(hard, target)
    if soft >= want:
        return OpenFilesLimit(soft, soft, hard_or_none)
    error = ""
    value = want
    while value > soft:  # some systems refuse more than a kernel maximum: halve down to what fits
        try:
            res.setrlimit(res.RLIMIT_NOFILE, (value, hard))
            return OpenFilesLimit(soft, value, hard_or_none)
        except (OSError, ValueError) as exc:
            error = str(exc) or type(exc).__name__
            value //= 2
    return OpenFilesLimit(soft, soft, hard_or_none, error)
