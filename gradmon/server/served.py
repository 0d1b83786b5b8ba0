"""What the request handlers need of the server: the runs it serves and its limits, as protocols.

:class:`~gradmon.server.routes.HttpRoutes` and :class:`~gradmon.server.sessions.Sessions` are
typed against these, not against :class:`~gradmon.server.app.GradmonServer`, so neither imports
the server that creates them, and each is tested alone against a small fake
(tests/test_routes.py, tests/test_sessions.py), the way TensorBoard's directory watcher is
tested with a fake loader.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable, Protocol

if TYPE_CHECKING:
    from gradmon.server.runs import Run

__all__ = ["RouteHost", "ServedRuns", "SessionHost", "Workers"]


class Workers(Protocol):
    """Runs a function elsewhere (the history worker process): ``call(fn, *args) -> fn(*args)``."""

    def call(self, fn: Callable[..., Any], *args: Any) -> Any: ...


class ServedRuns(Protocol):
    """The runs a client may see: by name, and as the entries of ``/api/runs`` and ``hello``."""

    def run(self, name: str) -> Run | None:
        """The announced run of that name, or ``None``."""

    def run_infos(self) -> list[dict[str, Any]]:
        """The announced runs' entries (docs/protocol.md), sorted by name."""


class RouteHost(ServedRuns, Protocol):
    """What the HTTP routes read: the served runs, where the server listens, its token and its workers."""

    host: str
    port: int
    token: str | None
    workers: Workers


class SessionHost(ServedRuns, Protocol):
    """What the WebSocket sessions read: the served runs (all of them, for catch-ups that outlive
    an announcement), the tail poll interval and the per-client queue limit."""

    runs: Mapping[str, Run]
    poll_interval: float
    client_queue_bytes: int
