"""The ``gradmon serve`` server: tails run logs and pushes records to browsers.

Programmatic use::

    from gradmon.server import start_server
    handle = start_server("logs", port=0)   # background thread; port 0 = any free port
    print(handle.url); ...; handle.stop()

or ``await gradmon.server.serve("logs", port=8686)`` inside an event loop. The server does not
import MindSpore nor numpy. Protocol: docs/protocol.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["DEFAULT_PORT", "GradmonServer", "ServerHandle", "serve", "start_server"]

if TYPE_CHECKING:
    from gradmon.server.app import DEFAULT_PORT, GradmonServer, ServerHandle, serve, start_server


def __getattr__(name: str) -> Any:
    # Lazy: `gradmon --help` and the CLI parser do not pay for importing websockets.
    if name in __all__:
        from gradmon.server import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
