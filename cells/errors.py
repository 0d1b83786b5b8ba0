"""The errors the cells raise for configurations they refuse (a leaf: imports nothing of gradmon's)."""

from __future__ import annotations

__all__ = ["UnsupportedParallelError"]


class UnsupportedParallelError(ValueError):
    """The parallel configuration's global norm would be wrong; the message says what is supported."""
