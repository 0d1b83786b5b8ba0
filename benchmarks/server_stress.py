"""Section ``server``, stress part (issue #14): live pushes while the server works hard, and abuse.

A live run is written at ``rate`` records/s (``RunLogWriter``, each record embeds ``bench_wts``)
and one real client measures flush → receive latency (:mod:`benchmarks.ws_clients`), while:

- ``zoom``: another client zooms on a big run (2M steps, ~400 MB, generated once into
  ``benchmarks/out/bigruns/``) back to back: the history of a random 1 % step range, 2000
  points, gzip. Blocks alternate — nothing else / zooming — for ``rounds`` rounds, so the two
  conditions see the same machine; each block's p99 is reported and the median per condition.
- ``indexing``: a fresh server reads the big run at start; the block runs while it indexes (``cold``:
  its index sidecar removed first, so that it does index it), its figures over the records written
  before the server said the run is indexed.
- ``abuse``: issue #14 B's client (4 KiB receive buffer, never reads) sends ``frames`` subscribe
  frames of ~245 KB, each naming 16,000 unknown runs. Server RSS before, at peak and ``settle_s``
  after the client left; the healthy client's WebSocket latency and ``/api/runs`` HTTP latency meanwhile.
- ``idle_clients``: ``idle`` connected clients that read nothing after ``hello``, plus the one
  measuring client.

Targets (issue #14): live p99 ≤ 50 ms while zooming and while indexing; RSS back to baseline +
10 MB after the abuse; p99 ≤ 100 ms with 1,000 idle clients.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

from benchmarks.runlogs import ensure_run_log, header
from benchmarks.server_harness import http_get, latency_case, list_runs, run_log_writer, serve, start_clients
from benchmarks.stats import latency_summary, percentile
from benchmarks.ws_clients import send_text_frame, stalled_client

SMOKE = {"big_steps": 20_000, "rounds": 1, "block_s": 0.5, "rate": 50, "frames": 3, "idle": 20,
         "index_block_s": 0.5, "load_timeout_s": 120, "settle_s": 0.5, "cold": 1}
FULL = {"big_steps": 2_000_000, "rounds": 3, "block_s": 4.0, "rate": 50, "frames": 60, "idle": 1000,
        "index_block_s": 5.0, "load_timeout_s": 600, "settle_s": 3.0, "cold": 1}
# (index_block_s: longer than a 2M-step cold index with a page connected on this machine, ~2.5-4 s
# from the server's start, so that indexed_s is the index's time with the page there. The records
# written once the server says the run is indexed measure the idle poll interval, not the indexing:
# _indexing_block leaves them out of the block's figures and counts them in after_index.
# still_indexing_after is read after the block's last wait)


def _rss_mb(pid: int) -> float:
    import psutil

    return psutil.Process(pid).memory_info().rss / 2**20


_LATENCY_KEYS = ("p50_ms", "p99_ms", "max_ms")
_BLOCK_KEYS = (*_LATENCY_KEYS, "received", "written", "server_cpu_percent", "error")


def _block(srv: dict[str, Any], writer: Any, step: int, settings: dict[str, Any], tmp: str,
           duration: float | None = None) -> tuple[dict[str, Any], int]:
    """One live-latency block: one measuring client, ``rate`` records/s for ``block_s``."""
    case, step = latency_case(srv, writer, step, 1, settings["rate"], duration or settings["block_s"],
                               tempfile.mkdtemp(dir=tmp))
    return {k: case.get(k) for k in _BLOCK_KEYS if k in case}, step


def _indexing_block(srv: dict[str, Any], writer: Any, step: int, settings: dict[str, Any], tmp: str,
                    name: str, started: float) -> tuple[dict[str, Any], int]:
    """The block of ``index_block_s`` while the big run is indexed, its latencies over the records
    written before the measuring page got the ``runs`` message that lists the run as indexed (the
    server sends it as the backlog ends; ``ws_clients --samples``' ``indexed_at``): those written
    after measure the idle poll, not the indexing (``after_index`` counts them). ``indexed_s``:
    that moment from ``started`` (wall time, the server's start), the page connected throughout
    (``None``: not within the block)."""
    case, step = latency_case(srv, writer, step, 1, settings["rate"], settings["index_block_s"],
                              tempfile.mkdtemp(dir=tmp), samples=True)
    samples = case.pop("samples", [])
    indexed = (case.pop("indexed_at", None) or {}).get(name)
    cut = indexed if indexed is not None else float("inf")
    during = [latency for wts, latency in samples if wts < cut]
    out = {k: case[k] for k in _BLOCK_KEYS if k in case and k not in _LATENCY_KEYS}
    out["block_p99_ms"] = case.get("p99_ms")  # (the whole block's, idle polls after the index included)
    if during:  # (none: the run was indexed before the first record was written, as a small one is)
        summary = latency_summary(during)
        out.update({k: summary[k] for k in _LATENCY_KEYS})
    out["while_indexing"] = len(during)
    out["after_index"] = len(samples) - len(during)
    out["indexed_s"] = round(indexed - started, 2) if indexed is not None else None
    return out, step


@contextlib.contextmanager
def _repeat(fn: Callable[[random.Random], Any]) -> Iterator[list[float]]:
    """Call ``fn`` back to back in a thread while the block runs; yield the call times (s)."""
    times: list[float] = []
    stop = threading.Event()

    def loop() -> None:
        rnd = random.Random(1)
        while not stop.is_set():
            t0 = time.perf_counter()
            fn(rnd)
            times.append(time.perf_counter() - t0)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield times
    finally:
        stop.set()
        t.join(timeout=120)


def _zoom(url: str, name: str, steps: int) -> Callable[[random.Random], Any]:
    width = max(100, steps // 100)

    def fetch(rnd: random.Random) -> None:
        s = rnd.randint(1, max(1, steps - width))
        req = urllib.request.Request(f"{url}/api/runs/{name}/history?start={s}&end={s + width}&points=2000",
                                     headers={"Accept-Encoding": "gzip"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            resp.read()
    return fetch


def _wait_indexed(url: str, name: str, steps: int, timeout: float) -> bool:
    """Whether the run is indexed to ``steps`` within ``timeout`` s (asked at least once: 0 = now)."""
    deadline = time.monotonic() + timeout
    while True:
        info = {r["name"]: r for r in list_runs(url)}.get(name)
        if info and info.get("last_step") == steps and not info.get("indexing"):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def _summary(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    p99s = [b["p99_ms"] for b in blocks if isinstance(b.get("p99_ms"), (int, float))]
    return {"blocks": blocks, "p99_ms_median": percentile(p99s, 50) if p99s else None,
            "p99_ms_max": max(p99s) if p99s else None}


def _zoom_and_indexing(settings: dict[str, Any], out_dir: str, log: Callable[[str], None]) -> dict[str, Any]:
    n = settings["big_steps"]
    name = f"r{n}"
    root = os.path.join(out_dir, "bigruns", name)
    ensure_run_log(os.path.join(root, name, "metrics.jsonl"), n)
    if settings["cold"]:  # the index sidecar of an earlier start (issue #26) would leave nothing to index
        shutil.rmtree(os.path.join(root, name, ".metrics.jsonl.gmidx"), ignore_errors=True)
    live_dir = os.path.join(root, "live")
    shutil.rmtree(live_dir, ignore_errors=True)
    writer = run_log_writer(os.path.join(live_dir, "metrics.jsonl"))
    writer.write(header("live"))
    tmp = tempfile.mkdtemp(prefix="gradmon-bench-stress-")
    out: dict[str, Any] = {"big_steps": n}
    step = 0
    try:
        t0 = time.perf_counter()
        started = time.time()
        with serve(root, os.path.join(out_dir, "server-stress-zoom.log"), settings["load_timeout_s"]) as srv:
            out["indexing"], step = _indexing_block(srv, writer, step, settings, tmp, name, started)
            out["indexing"]["still_indexing_after"] = not _wait_indexed(srv["url"], name, n, 0.0)
            if not _wait_indexed(srv["url"], name, n, settings["load_timeout_s"]):
                return {**out, "error": "the big run was not indexed in time"}
            out["index_s"] = time.perf_counter() - t0
            out["rss_mb_indexed"] = _rss_mb(srv["pid"])
            quiet, busy, zoom_s = [], [], []
            for _ in range(settings["rounds"]):
                block, step = _block(srv, writer, step, settings, tmp)
                quiet.append(block)
                with _repeat(_zoom(srv["url"], name, n)) as times:
                    block, step = _block(srv, writer, step, settings, tmp)
                block["zooms"] = len(times)
                zoom_s += times
                busy.append(block)
            out["quiet"] = _summary(quiet)
            out["zooming"] = _summary(busy)
            if zoom_s:
                out["zoom_ms"] = latency_summary(zoom_s)
            out["rss_mb_after_zooms"] = _rss_mb(srv["pid"])
        log(f"  zoom: live p99 {out['quiet']['p99_ms_median']} ms quiet, "
            f"{out['zooming']['p99_ms_median']} ms zooming; indexing: {out['indexing'].get('p99_ms')} ms "
            f"({out['indexing'].get('while_indexing')} records while indexing, "
            f"{out['indexing'].get('after_index')} after; the page saw it indexed at "
            f"{out['indexing'].get('indexed_s')} s)")
    finally:
        writer.close("finished")
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _unknown_runs_frame(n: int) -> str:
    return json.dumps({"type": "subscribe", "runs": {f"n{i}": None for i in range(n)}})


def _abuse(srv: dict[str, Any], frames: int, peak: list[float], done: threading.Event) -> None:
    """Issue #14 B: a client that never reads floods subscribe frames naming unknown runs."""
    port = int(srv["url"].rsplit(":", 1)[1])
    frame = _unknown_runs_frame(16_000)
    sock = stalled_client(port)
    try:
        for _ in range(frames):
            try:
                send_text_frame(sock, frame)
            except OSError:  # the server closed the connection
                break
            peak.append(_rss_mb(srv["pid"]))
        time.sleep(1.0)
        peak.append(_rss_mb(srv["pid"]))
    finally:
        sock.close()
        done.set()


@contextlib.contextmanager
def _live_server(tag: str, out_dir: str) -> Iterator[tuple[dict[str, Any], Any, str]]:
    """A fresh server on a temporary log root holding one live run; yields the server, the live
    run's writer and a temporary directory; removes everything after."""
    tmp = tempfile.mkdtemp(prefix=f"gradmon-bench-{tag}-")
    writer = run_log_writer(os.path.join(tmp, "logs", "live", "metrics.jsonl"))
    writer.write(header("live"))
    try:
        with serve(os.path.join(tmp, "logs"), os.path.join(out_dir, f"server-stress-{tag}.log")) as srv:
            yield srv, writer, tmp
    finally:
        writer.close("finished")
        shutil.rmtree(tmp, ignore_errors=True)


def _abuse_case(settings: dict[str, Any], out_dir: str, log: Callable[[str], None]) -> dict[str, Any]:
    out: dict[str, Any] = {"frames": settings["frames"]}
    with _live_server("abuse", out_dir) as (srv, writer, tmp):
        out["quiet"], step = _block(srv, writer, 0, settings, tmp)  # warms the server up
        out["rss_mb_before"] = _rss_mb(srv["pid"])
        peak: list[float] = []
        done = threading.Event()
        abuser = threading.Thread(target=_abuse, args=(srv, settings["frames"], peak, done), daemon=True)

        def probe(_rnd: random.Random) -> None:
            http_get(srv["url"] + "/api/runs")
            time.sleep(0.01)

        with _repeat(probe) as http_times:
            abuser.start()
            out["abused"], step = _block(srv, writer, step, settings, tmp)
            done.wait(timeout=300)
        abuser.join(timeout=10)
        time.sleep(settings["settle_s"])
        out["rss_mb_peak"] = max(peak, default=None)
        out["rss_mb_after"] = _rss_mb(srv["pid"])
        out["rss_mb_after_minus_before"] = out["rss_mb_after"] - out["rss_mb_before"]
        if http_times:
            out["http_ms"] = latency_summary(http_times)
    log(f"  abuse: RSS {out['rss_mb_before']:.0f} -> peak {out['rss_mb_peak']} -> "
        f"{out['rss_mb_after']:.0f} MB; healthy p99 {out['abused'].get('p99_ms')} ms")
    return out


def _idle_clients(settings: dict[str, Any], out_dir: str, log: Callable[[str], None]) -> dict[str, Any]:
    n = settings["idle"]
    out: dict[str, Any] = {"idle_clients": n}
    with _live_server("idle", out_dir) as (srv, writer, tmp):
        out["rss_mb_before"] = _rss_mb(srv["pid"])
        ready, stop = os.path.join(tmp, "idle-ready"), os.path.join(tmp, "idle-stop")
        child = start_clients(srv["ws"], n, time.time() + 60 + 0.3 * n, ready, stop,
                               os.path.join(tmp, "idle.json"), idle=True)
        try:
            deadline = time.monotonic() + 30 + 0.3 * n
            while not os.path.exists(ready) and time.monotonic() < deadline and child.poll() is None:
                time.sleep(0.05)
            if not os.path.exists(ready):
                return {**out, "error": "the idle clients did not all connect"}
            out["rss_mb_connected"] = _rss_mb(srv["pid"])
            out["healthy"], _step = _block(srv, writer, 0, settings, tmp)
        finally:
            open(stop, "w").close()
            child.wait(timeout=60)
    log(f"  {n} idle clients: healthy p99 {out['healthy'].get('p99_ms')} ms, "
        f"RSS {out['rss_mb_before']:.0f} -> {out['rss_mb_connected']:.0f} MB")
    return out


CASES = {"zoom": _zoom_and_indexing, "abuse": _abuse_case, "idle": _idle_clients}


def run_stress(smoke: bool, out_dir: str, log: Callable[[str], None], only: list[str] | None = None,
               **overrides: Any) -> dict[str, Any]:
    """The stress cases (zoom and indexing, abuse, idle clients); a case that fails records its
    error and the others still run. ``overrides``: settings to change (e.g. ``rate=10``)."""
    settings = {**(SMOKE if smoke else FULL), **overrides}
    out: dict[str, Any] = {"settings": settings}
    for key, case in CASES.items():
        if only and key not in only:
            continue
        log(f"server: stress {key}")
        try:
            out[key] = case(settings, out_dir, log)
        except Exception as exc:  # a broken case is reported, the section goes on
            out[key] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


if __name__ == "__main__":  # python -m benchmarks.server_stress [--smoke]: this part alone
    import argparse

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--only", action="append", choices=list(CASES))
    p.add_argument("--set", action="append", default=[], metavar="KEY=INT", help="change a setting")
    p.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "out"))
    a = p.parse_args()
    os.makedirs(a.out_dir, exist_ok=True)
    changes = {k: int(v) for k, v in (kv.split("=", 1) for kv in a.set)}
    result = run_stress(a.smoke, a.out_dir, lambda m: print(m, file=sys.stderr, flush=True), a.only,
                        **changes)
    print(json.dumps(result, indent=1))
