"""Running ``gradmon serve`` for the benchmarks: the server process, plain HTTP, the run-log writer, real
websockets clients in a child process and one paced latency case. Shared by the server, stress,
big-run and page sections (none of which imports another).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

from benchmarks.runlogs import step_record


def server_unavailable_reason() -> str | None:
    if importlib.util.find_spec("gradmon.server.cli") is None:
        return "gradmon.server.cli not available (the `gradmon serve` command is not built yet)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str, timeout: float = 60.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@functools.lru_cache(maxsize=1)
def _logdir_is_an_option() -> bool:
    """Whether ``gradmon serve`` takes the log directory as ``--logdir`` (asked once: a process)."""
    help_text = subprocess.run([sys.executable, "-m", "gradmon", "serve", "--help"], capture_output=True,
                               text=True, timeout=60).stdout
    return "--logdir" in help_text


def _serve_command(logdir: str, port: int) -> list[str]:
    """``gradmon serve`` with the log directory passed the way its parser wants it."""
    args = ["--logdir", logdir] if _logdir_is_an_option() else [logdir]
    return [sys.executable, "-m", "gradmon", "serve", *args, "--host", "127.0.0.1", "--port", str(port)]



@contextlib.contextmanager
def serve(logdir: str, log_path: str, ready_timeout: float = 60.0) -> Iterator[dict[str, Any]]:
    """Start ``gradmon serve`` on a free loopback port; yield ``{"url", "pid", "proc"}``; stop it."""
    port = free_port()
    cmd = _serve_command(logdir, port)
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            def answers() -> bool:
                try:
                    return http_get(url + "/api/runs", timeout=5)[0] == 200
                except OSError:
                    return False

            wait_until_ready(proc, answers, ready_timeout, 0.05, f"gradmon serve (see {log_path})")
            yield {"url": url, "ws": f"ws://127.0.0.1:{port}/ws", "pid": proc.pid, "proc": proc}
        finally:
            stop_process(proc, 10)


def wait_until_ready(proc: subprocess.Popen, ready: Callable[[], bool], timeout: float, interval: float,
                     what: str) -> None:
    """Poll ``ready()`` every ``interval`` seconds until it is true; raise when ``proc`` exits first
    or ``timeout`` seconds pass (``what`` names the process in the message)."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        if ready():
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not ready after {timeout:.0f} s")
        time.sleep(interval)


def stop_process(proc: subprocess.Popen, timeout: float) -> None:
    """Terminate a server process; kill it when it has not exited after ``timeout`` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def list_runs(url: str) -> list[dict[str, Any]]:
    status, body = http_get(url + "/api/runs")
    if status != 200:
        raise RuntimeError(f"/api/runs answered {status}")
    return json.loads(body)["runs"]


def run_log_writer(path: str) -> Any:
    """A ``RunLogWriter`` (or, without gradmon.monitor.writer, a bare write+flush file) with
    ``write``/``close``."""
    try:
        from gradmon.monitor.writer import RunLogWriter

        return RunLogWriter(path)
    except ImportError:
        from gradmon.logformat.jsonl import encode_record

        class Bare:
            def __init__(self) -> None:
                self.f = open(path, "a", encoding="utf-8")  # noqa: SIM115

            def write(self, r: dict[str, Any]) -> None:
                self.f.write(encode_record(r))
                self.f.flush()

            def close(self, *_a: Any) -> None:
                self.f.close()

        return Bare()


def start_clients(
    ws_url: str, clients: int, until: float, ready: str, stop: str, out: str, idle: bool = False,
    samples: bool = False,
) -> subprocess.Popen:
    """Start ``clients`` real websockets clients in a child process (see :mod:`benchmarks.ws_clients`)."""
    cmd = [sys.executable, "-m", "benchmarks.ws_clients", "--url", ws_url, "--clients", str(clients),
           "--until", str(until), "--ready", ready, "--stop", stop, "--out", out]
    return subprocess.Popen(cmd + (["--idle"] if idle else []) + (["--samples"] if samples else []))


def latency_case(
    srv: dict[str, Any], writer: Any, first_step: int, clients: int, rate: int, duration: float, tmp: str,
    samples: bool = False,
) -> tuple[dict[str, Any], int]:
    """``rate`` records/s for ``duration`` s, measured by ``clients`` clients; ``samples``: the result
    also holds each record's ``[bench_wts, latency]`` (``ws_clients --samples``)."""
    import psutil

    ready = os.path.join(tmp, f"ready-{clients}-{rate}")
    stop = os.path.join(tmp, f"stop-{clients}-{rate}")
    out = os.path.join(tmp, f"clients-{clients}-{rate}.json")
    connect_budget = 10.0 + 0.2 * clients
    until = time.time() + connect_budget + duration + 10.0
    child = start_clients(srv["ws"], clients, until, ready, stop, out, samples=samples)
    result: dict[str, Any] = {"clients": clients, "rate": rate, "duration_s": duration}
    step = first_step
    try:
        deadline = time.monotonic() + connect_budget
        while not os.path.exists(ready) and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.02)
        if not os.path.exists(ready):
            result["error"] = "clients did not all connect"
        else:
            proc = psutil.Process(srv["pid"])
            proc.cpu_percent(None)
            t0 = time.perf_counter()
            n = int(rate * duration)
            for i in range(n):
                target = t0 + i / rate
                delay = target - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                step += 1
                writer.write(step_record(step, time.time(), bench_wts=time.time()))
            result["written"] = n
            result["write_rate_achieved"] = n / (time.perf_counter() - t0)
            time.sleep(1.0)  # let the last records arrive
            result["server_cpu_percent"] = proc.cpu_percent(None)
    finally:
        open(stop, "w").close()
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    if os.path.exists(out):
        with open(out, encoding="utf-8") as f:
            got = json.load(f)
        result.update({k: v for k, v in got.items() if k != "clients"})
        if "written" in result:
            result["expected"] = result["written"] * clients
    return result, step
