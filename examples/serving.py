"""The live dashboard around an example's training: start it first, keep it up after."""

from __future__ import annotations

import time
from typing import Any


def start_dashboard(logdir: str, host: str, port: int) -> Any:
    """Serve ``logdir`` with ``gradmon serve`` in a background thread and print the URL."""
    from gradmon.server import start_server

    server = start_server(logdir, host=host, port=port)
    print(f"gradmon dashboard: {server.url}", flush=True)
    return server


def finish_serving(server: Any, exit_after_train: bool) -> None:
    """Keep serving until Ctrl-C (unless ``exit_after_train``), then stop the server."""
    if server is None:
        return
    if not exit_after_train:
        print(f"still serving {server.url} — Ctrl-C to stop", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    server.stop()
