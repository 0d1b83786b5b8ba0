"""Section ``server``: ``gradmon serve`` latency, CPU, and the cost of big histories.

The server runs as its own process (``python -m gradmon serve``), so its CPU and RSS are its own
(``psutil``). The clients are real ``websockets`` clients in a child process
(:mod:`benchmarks.ws_clients`); the writer is this process, appending step records that embed
``bench_wts = time.time()`` through ``RunLogWriter`` (one write + flush per line), paced to a rate.
Latency = client receive time - ``bench_wts``: file append -> server tail -> WebSocket -> client.

History: 1M- and 10M-step run logs are generated once into ``benchmarks/out/bigruns/`` (reused when
complete; the 10M one is ~2 GB and is skipped with a note when the disk has < 10 GB free) and
served by a fresh server each; we time until ``/api/runs`` reports all records (load/index time),
then ``/api/runs/<name>/history`` (first and repeated fetches, response size) and the server RSS.

Stress (issue #14, :mod:`benchmarks.server_stress`): live latency while another client zooms on a
2M-step run and while such a run is indexed, RSS under a client that floods bad subscribes and
never reads, and 1,000 idle clients.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

from benchmarks.runlogs import ensure_run_log, header
from benchmarks.server_harness import (
    http_get,
    latency_case,
    list_runs,
    run_log_writer,
    serve,
    server_unavailable_reason,
    start_clients,
)
from benchmarks.stats import percentile

GB = 1 << 30


def _latency(settings: dict[str, Any], out_dir: str, log: Callable[[str], None]) -> dict[str, Any]:
    import psutil

    tmp = tempfile.mkdtemp(prefix="gradmon-bench-srv-")
    section: dict[str, Any] = {"latency": []}
    try:
        path = os.path.join(tmp, "logs", "live", "metrics.jsonl")
        writer = run_log_writer(path)
        writer.write(header("latency"))
        with serve(os.path.join(tmp, "logs"), os.path.join(out_dir, "server-latency.log")) as srv:
            section["server_rss_mb_start"] = psutil.Process(srv["pid"]).memory_info().rss / 2**20
            step = 0
            for clients in settings["clients"]:
                for rate in settings["rates"]:
                    case, step = latency_case(srv, writer, step, clients, rate, settings["duration_s"], tmp)
                    section["latency"].append(case)
                    log(
                        f"  {clients} clients @ {rate}/s: p50 {case.get('p50_ms', float('nan')):.1f} ms, "
                        f"p99 {case.get('p99_ms', float('nan')):.1f} ms, received {case.get('received')} "
                        f"of {case.get('expected')}"
                    )
            # Idle: one client connected, nothing written.
            ready = os.path.join(tmp, "ready-idle")
            stop = os.path.join(tmp, "stop-idle")
            until = time.time() + settings["idle_s"] + 20
            child = start_clients(srv["ws"], 1, until, ready, stop, os.path.join(tmp, "idle.json"))
            deadline = time.monotonic() + 15
            while not os.path.exists(ready) and time.monotonic() < deadline:
                time.sleep(0.02)
            section["idle_cpu_percent"] = psutil.Process(srv["pid"]).cpu_percent(interval=settings["idle_s"])
            open(stop, "w").close()
            child.wait(timeout=30)
            section["server_rss_mb_end"] = psutil.Process(srv["pid"]).memory_info().rss / 2**20
        writer.close("finished")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return section


def _history_case(
    n_steps: int, settings: dict[str, Any], out_dir: str, log: Callable[[str], None]
) -> dict[str, Any]:
    import psutil

    name = f"r{n_steps}"
    root = os.path.join(out_dir, "bigruns", name)
    path = os.path.join(root, name, "metrics.jsonl")
    case: dict[str, Any] = {"records": n_steps}
    need = n_steps * 230 * 1.2
    free = shutil.disk_usage(out_dir).free
    if not os.path.exists(path) and (free < 10 * GB or free < need):
        case["skipped"] = f"only {free / GB:.1f} GB free (need >= 10 GB and {need / GB:.1f} GB for the file)"
        return case
    gen = ensure_run_log(path, n_steps)
    case["file_mb"] = gen["bytes"] / 1e6
    case["generated_s"] = gen.get("seconds", 0.0)
    log(
        f"  history {n_steps:,}: file {'reused' if gen['reused'] else 'generated'} "
        f"({gen['bytes'] / 1e6:.0f} MB)"
    )
    t0 = time.perf_counter()
    with serve(
        root, os.path.join(out_dir, f"server-{name}.log"), ready_timeout=settings["load_timeout_s"]
    ) as srv:
        deadline = time.monotonic() + settings["load_timeout_s"]
        loaded = False
        while time.monotonic() < deadline:
            runs = {r["name"]: r for r in list_runs(srv["url"])}
            info = runs.get(name)
            if info and (info.get("last_step") == n_steps or info.get("status") == "finished"):
                loaded = True
                break
            time.sleep(0.1)
        case["index_s"] = time.perf_counter() - t0
        if not loaded:
            case["error"] = f"run not fully loaded after {settings['load_timeout_s']} s"
            return case
        times = []
        size = 0
        for _ in range(settings["fetches"]):
            t1 = time.perf_counter()
            status, body = http_get(
                f"{srv['url']}/api/runs/{name}/history", timeout=settings["load_timeout_s"]
            )
            times.append(time.perf_counter() - t1)
            if status != 200:
                case["error"] = f"history answered {status}: {body[:200]!r}"
                return case
            size = len(body)
        doc = json.loads(body)
        case["first_fetch_ms"] = times[0] * 1e3
        case["fetch_ms"] = percentile(times, 50) * 1e3
        case["fetch_kb"] = size / 1e3
        case["series_points"] = len(doc.get("series", {}).get("loss", {}).get("step", []))
        case["marks"] = len(doc.get("marks", []))
        case["rss_mb"] = psutil.Process(srv["pid"]).memory_info().rss / 2**20
    log(
        f"  history {n_steps:,}: ready in {case['index_s']:.1f} s, fetch {case['fetch_ms']:.0f} ms, "
        f"{case['fetch_kb']:.0f} KB, RSS {case['rss_mb']:.0f} MB"
    )
    return case


def run_section(
    device: str, smoke: bool, log: Callable[[str], None], out_dir: str, big_history: bool = False
) -> dict[str, Any]:
    reason = server_unavailable_reason()
    if reason:
        return {"skipped": reason}
    if smoke:
        settings = {
            "clients": [1, 10],
            "rates": [100],
            "duration_s": 0.5,
            "idle_s": 0.5,
            "history_sizes": [20_000],
            "load_timeout_s": 60,
            "fetches": 2,
        }
    else:
        settings = {
            "clients": [1, 10, 50, 100],
            "rates": [100, 1000],
            "duration_s": 4.0,
            "idle_s": 3.0,
            # The 10M case (generation ~30 s, indexing ~2 min) is opt-in: --big-history.
            "history_sizes": [1_000_000, 10_000_000] if big_history else [1_000_000],
            "load_timeout_s": 300,
            "fetches": 5,
        }
    log("server: latency")
    section = _latency(settings, out_dir, log)
    section["settings"] = settings
    section["history"] = []
    for n in settings["history_sizes"]:
        try:
            section["history"].append(_history_case(n, settings, out_dir, log))
        except Exception as exc:
            section["history"].append({"records": n, "error": f"{type(exc).__name__}: {exc}"})
    from benchmarks.server_stress import run_stress

    section["stress"] = run_stress(smoke, out_dir, log)
    section["about"] = (__doc__ or "").strip()
    return section
