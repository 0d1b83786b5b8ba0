"""Worker processes for the server's heavy pure work (history answers), off the event loop.

Decoding the 20,000 lines of a zoomed range, merging and JSON-encoding the answer takes a few
hundred milliseconds of pure Python. In a thread it would still hold the GIL (``orjson.loads``
mapped over a chunk, ``json.dumps`` of a body are single C calls), so every live push would wait
for it; a child process does not share the GIL. The children are plain ``python -m
gradmon.server.worker`` processes (not ``multiprocessing``, which re-imports the parent's
``__main__``: a user's training script, or ``python -m gradmon`` itself), talking length-prefixed
pickles over their stdin/stdout. Only functions of ``gradmon.server`` modules are called.

:class:`WorkerPool` is thread-safe and shared by every server of the process
(:func:`shared_pool`); callers run :meth:`WorkerPool.call` in a thread (``asyncio.to_thread``).
A child that dies is replaced on the next call; when no child can be started at all (a sandbox
without ``fork``), calls run in the calling thread instead, with a warning logged once.

A restarted server's first history requests do not wait for the worker's interpreter to start
(~0.1 s quiet, 0.2-0.9 s on a loaded machine, where a warm restart restores a 10M-step index in
~0.01-0.1 s): calls that ask for it (``early=True``) run in the calling thread until a child has
answered once, and then start one in the background (:meth:`WorkerPool.warm`; the server also
warms the pool shortly after it listens).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import logging
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
from typing import Any, BinaryIO, Callable

__all__ = ["WorkerPool", "loaded_modules", "process_id", "shared_pool"]

log = logging.getLogger("gradmon.server")

_HEADER = struct.Struct("!Q")
_MODULE_PREFIX = "gradmon.server."


def _write(stream: BinaryIO, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _read(stream: BinaryIO) -> Any:
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        raise EOFError("worker pipe closed")
    (n,) = _HEADER.unpack(head)
    data = stream.read(n)
    if len(data) < n:
        raise EOFError("worker pipe closed")
    return pickle.loads(data)


def _resolve(name: str) -> Callable[[Any], Any]:
    module, _, attr = name.rpartition(".")
    if not module.startswith(_MODULE_PREFIX):
        raise ValueError(f"not a gradmon.server function: {name!r}")
    return getattr(importlib.import_module(module), attr)


class _Child:
    """One worker process and its pipes (used by one thread at a time)."""

    def __init__(self) -> None:
        import gradmon

        env = dict(os.environ)
        here = os.path.dirname(os.path.dirname(os.path.abspath(gradmon.__file__)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen([sys.executable, "-m", "gradmon.server.worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env, close_fds=True)

    def request(self, name: str, arg: Any) -> tuple[bool, Any]:
        """Send one call; ``(True, result)`` or ``(False, what went wrong)``."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        _write(self.proc.stdin, (name, arg))
        return _read(self.proc.stdout)

    def close(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class WorkerPool:
    """At most ``size`` worker processes, started on demand; :meth:`call` blocks its thread."""

    def __init__(self, size: int = 1) -> None:
        self.size = max(1, size)
        self._idle: list[_Child] = []
        self._started = 0
        self._cond = threading.Condition()
        self._closed = False
        self.in_process = False  # no child could be started: calls run in the caller's thread
        self._up = False  # a child has answered: from then on early calls wait for one too
        self._warmer: threading.Thread | None = None

    def call(self, fn: Callable[[Any], Any], arg: Any, early: bool = False) -> Any:
        """``fn(arg)`` in a worker process (``fn``: a module-level function of gradmon.server);
        ``early``: in the calling thread until a worker is up (then one is started in the background)."""
        name = f"{fn.__module__}.{fn.__qualname__}"
        _resolve(name)  # refuse anything else here, not in the child
        if self.in_process:
            return fn(arg)
        if early and not self._up:
            try:
                return fn(arg)
            finally:  # (after the answer: a worker's start would slow it down)
                self._warm_in_background()
        child = self._acquire()
        for attempt in (0, 1):
            if child is None:
                return fn(arg)
            try:
                ok, result = child.request(name, arg)
            except (EOFError, OSError):  # the child died (killed, out of memory): once more, in a new one
                self._discard(child)
                if attempt:
                    raise
                child = self._acquire()
                continue
            except BaseException:  # the pipe is in an unknown state
                self._discard(child)
                raise
            self._release(child)
            if not ok:
                raise RuntimeError(f"{name} failed in the worker process: {result}")
            return result
        raise AssertionError("unreachable")

    def warm(self) -> None:
        """Start a worker now and wait until it has imported the history code, so that no request
        waits for it (~100 ms: a Python start and the imports); until then, ``early`` calls run in
        the calling thread. Never raises: a failure here is the next call's to report."""
        try:
            self.call(ready, None)
        except Exception as exc:  # best effort: the next call reports it
            log.debug("worker warm-up failed: %s", exc)

    def _warm_in_background(self) -> None:
        with self._cond:
            if self._warmer is not None or self._closed:
                return
            self._warmer = threading.Thread(target=self.warm, name="gradmon-worker-warm", daemon=True)
        self._warmer.start()

    def _acquire(self) -> _Child | None:
        with self._cond:
            while not self._idle and self._started >= self.size:
                self._cond.wait()
            if self._idle:
                return self._idle.pop()
            self._started += 1
        try:
            return _Child()
        except OSError as exc:
            log.warning("cannot start a worker process (%s): history is computed in a thread", exc)
            with self._cond:
                self._started -= 1
                self.in_process = True
                self._cond.notify_all()
            return None

    def _release(self, child: _Child) -> None:
        with self._cond:
            self._up = True  # (released after an answer)
            if self._closed:
                child.close()
            else:
                self._idle.append(child)
            self._cond.notify()

    def _discard(self, child: _Child) -> None:
        child.close()
        with self._cond:
            self._started -= 1
            self._cond.notify()

    def close(self) -> None:
        """Stop the idle workers (busy ones stop when their call returns)."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
        for child in idle:
            child.close()


def ready(arg: Any) -> Any:
    """A call that loads what history answers need, in the worker (see :meth:`WorkerPool.warm`)."""
    import gradmon.server.history  # noqa: F401

    return arg


def process_id(_arg: Any) -> int:
    """The process a call ran in (for tests and diagnostics)."""
    return os.getpid()


def loaded_modules(_arg: Any) -> list[str]:
    """The modules imported in the process a call ran in (for tests and diagnostics: a worker's
    start is what a restarted server's first answers compete with on a busy core)."""
    return sorted(sys.modules)


_shared: WorkerPool | None = None
_shared_lock = threading.Lock()


def shared_pool() -> WorkerPool:
    """The process-wide pool (one worker: a second one would only compete for the same cores)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = WorkerPool(1)
            atexit.register(_shared.close)
        return _shared


def _serve(inp: BinaryIO, out: BinaryIO) -> None:
    while True:
        try:
            name, arg = _read(inp)
        except EOFError:
            return
        try:
            result = (True, _resolve(name)(arg))
        except Exception as exc:  # reported to the caller, the worker goes on
            result = (False, f"{type(exc).__name__}: {exc}")
        _write(out, result)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the server; stdin's EOF stops us
    ready(None)  # now, not when the server's first call comes: it started us before its own imports
    channel = sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but replies goes to the channel
    _serve(sys.stdin.buffer, channel)
