"""Section ``server``, big runs (issue #26): a big run log's index, restarts and zooms, served by this
tree and by another one (the previous release: ``--prev DIR``, a checkout) in the same run.

Each *start* is a fresh ``python -m gradmon serve`` process of one tree (its directory first on
``sys.path``) on a copy-free hard link of the log: ``cold`` removes the index sidecar first (a
first start; the previous release has none, so its every start is cold), ``warm`` keeps what the
previous start left. Per start: ``index_s`` (process start -> ``/api/runs`` lists every record, not
indexing), ``first_answer_ms`` (the first full-range history after that), then ``fetches``
full-range histories and ``fetches`` 1 % zooms (random windows of ``steps / 100`` steps, the same
for both trees), 2000 points each: p50 and p99; the server's and its history worker's RSS; the
sidecar's size. Starts alternate between the trees round by round (the machine is shared: quote
medians). ``python -m benchmarks.bigruns --steps 2000000 --prev /tmp/prev``.

``--log-dir DIR`` serves an existing log (``DIR/r<steps>/metrics.jsonl``, e.g. a hard-linked copy
with its sidecar) instead of generating one; ``--other TREE`` (with ``--other-log-dir``, its own
copy: each tree writes its own sidecar) serves a second tree warm, alternating with this one
start by start, and ``--warm-only`` leaves out the cold starts: two trees' warm restarts and
queries compared on one big index that is built once. ``--system-every K`` generates a log with a
``system`` record after every K-th step (``runlogs.generate_run_log``, in ``bigruns26/r<steps>-sys<K>``),
as a real run's log holds them: a run whose steps take seconds has one every step or two.
``--diverge-at K`` generates one whose every step from the K-th on is non-finite, as the writer
logs a diverged run that goes on training (``bigruns26/r<steps>-div<K>``).
``--numbers writer`` generates one whose floats are written as gradmon's writer writes them (up to
17 digits; ``bigruns26/r<steps>-writer``) rather than with a few fixed decimals.
``--gzip`` asks for compressed answers, as the page does. Each tree's modules are compiled once
into ``OUT/pycache`` and every start uses them, as an installed package's (``--no-bytecode``: each
start compiles them, ~0.1 s, where the environment sets ``PYTHONDONTWRITEBYTECODE`` as this one
does). Times are to the answer's last
byte, its JSON decoded by the client after (a 10M run's full range: ~7 ms).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import random
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

from benchmarks.runlogs import NUMBERS, ensure_run_log
from benchmarks.server_harness import free_port, http_get, stop_process
from benchmarks.stats import percentile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _rss_mb(pid: int) -> tuple[float, float]:
    """The process's RSS and its children's (the history worker), in MiB."""
    import psutil

    p = psutil.Process(pid)
    kids = sum(c.memory_info().rss for c in p.children(recursive=True))
    return p.memory_info().rss / 2**20, kids / 2**20


def _cpu_s(pid: int) -> float:
    """The process's CPU time so far (user + system), its children's not included: what its
    indexing cost, whatever the machine's load made of the wall-clock time."""
    import psutil

    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def _du(path: str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(dirpath, f)) for f in files)
    return total


def _bytecode_env(pycache: str | None) -> dict[str, str]:
    """The environment of a tree's processes: with ``pycache``, compiled modules are kept there
    (``PYTHONPYCACHEPREFIX``) and used, as an installed package's are, even where the environment
    says not to write them (``PYTHONDONTWRITEBYTECODE``: every start would compile the server's
    modules, ~0.1 s of a restart)."""
    env = dict(os.environ)
    if pycache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = pycache
    return env


def compile_tree(tree: str, pycache: str) -> None:
    """Compile a tree's ``gradmon`` package into ``pycache`` (as ``pip install`` does at install)."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(tree, "gradmon")],
                   env=_bytecode_env(pycache), check=True, stdout=subprocess.DEVNULL, timeout=300)


@contextlib.contextmanager
def _server(tree: str, logdir: str, out_log: str, pycache: str | None = None) -> Iterator[dict[str, Any]]:
    port = free_port()
    env = {**_bytecode_env(pycache), "PYTHONPATH": tree}
    with open(out_log, "ab") as f:
        proc = subprocess.Popen([sys.executable, "-m", "gradmon", "serve", logdir, "--host", "127.0.0.1",
                                 "--port", str(port)], cwd=tree, env=env, stdout=f, stderr=subprocess.STDOUT)
    try:
        yield {"url": f"http://127.0.0.1:{port}", "pid": proc.pid, "proc": proc}
    finally:
        stop_process(proc, 30)


def _fetch(url: str, timeout: float = 120.0, gzip_ok: bool = False) -> tuple[Any, float]:
    """The decoded JSON answer to a GET and the seconds to its last byte (decoding not counted)."""
    t0 = time.perf_counter()
    if gzip_ok:
        req = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, body = resp.status, resp.read()
        took = time.perf_counter() - t0
        if resp.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
    else:
        status, body = http_get(url, timeout)
        took = time.perf_counter() - t0
    if status != 200:
        raise RuntimeError(f"{url} answered {status}: {body[:200]!r}")
    return json.loads(body), took


def _get_json(url: str, timeout: float = 120.0) -> Any:
    return _fetch(url, timeout)[0]


def one_start(tree: str, logdir: str, name: str, steps: int, windows: list[int], fetches: int,
              cold: bool, out_dir: str, timeout: float = 900.0, gzip_ok: bool = False,
              pycache: str | None = None) -> dict[str, Any]:
    """One server start of ``tree`` on the log (see the module docstring)."""
    log_path = os.path.join(logdir, name, "metrics.jsonl")
    side = os.path.join(logdir, name, ".metrics.jsonl.gmidx")
    if cold:
        shutil.rmtree(side, ignore_errors=True)
    out: dict[str, Any] = {"tree": tree, "cold": cold}
    t0 = time.perf_counter()
    with _server(tree, logdir, os.path.join(out_dir, "bigruns-server.log"), pycache) as srv:
        deadline = time.monotonic() + timeout
        while True:
            if srv["proc"].poll() is not None:
                raise RuntimeError(f"the server of {tree} exited with {srv['proc'].returncode}")
            with contextlib.suppress(OSError):
                runs = {r["name"]: r for r in _get_json(srv["url"] + "/api/runs", 10)["runs"]}
                info = runs.get(name)
                if info and info.get("last_step") == steps and not info.get("indexing", False):
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("not indexed in time")
            # Finely at first (a warm restart takes ~0.1-0.3 s), then every 50 ms: a request every
            # 5 ms throughout (~200/s) took the server ~1 s of CPU over a 2M-step cold index and
            # its client more, on the same pinned core: indexed 9.3 -> 7.7 s (medians, 6 pairs).
            time.sleep(0.005 if time.perf_counter() - t0 < 1.0 else 0.05)
        out["index_s"] = time.perf_counter() - t0
        out["index_cpu_s"] = _cpu_s(srv["pid"])  # (the start's imports included: ~0.3 s)
        doc, took = _fetch(f"{srv['url']}/api/runs/{name}/history?points=2000", gzip_ok=gzip_ok)
        out["first_answer_ms"] = took * 1e3
        out["to_first_full_answer_s"] = out["index_s"] + took
        out["cursor_is_the_file"] = doc["cursor"]["offset"] == os.path.getsize(log_path)
        out["system_points"] = sum(len(s["step"]) for s in doc.get("system", {}).values())
        full, zoom = [], []
        for k in range(fetches):
            full.append(_fetch(f"{srv['url']}/api/runs/{name}/history?points=2000", gzip_ok=gzip_ok)[1])
            a = windows[k % len(windows)]
            z, took = _fetch(f"{srv['url']}/api/runs/{name}/history?points=2000&start={a}"
                             f"&end={a + steps // 100 - 1}", gzip_ok=gzip_ok)
            zoom.append(took)
        out["zoom_points"] = len(z["series"].get("loss", {}).get("step", []))
        out["zoom_exact"] = z.get("exact")
        for key, ts in (("full", full), ("zoom", zoom)):
            out[f"{key}_p50_ms"] = percentile(ts, 50) * 1e3
            out[f"{key}_p99_ms"] = percentile(ts, 99) * 1e3
            out[f"{key}_ms"] = [round(t * 1e3, 1) for t in ts]  # (in order: where the slow ones fall)
        out["rss_mb"], out["worker_rss_mb"] = _rss_mb(srv["pid"])
    out["sidecar_mb"] = _du(side) / 1e6 if os.path.isdir(side) else 0.0
    return out


def run(steps: int, prev: str | None, rounds: int, fetches: int, out_dir: str, log: Any = print,
        seed: int = 0, log_dir: str | None = None, other: str | None = None, other_log_dir: str | None = None,
        warm_only: bool = False, gzip_ok: bool = False, bytecode: bool = True,
        system_every: int = 0, numbers: str = "fixed", diverge_at: int = 0) -> dict[str, Any]:
    """``rounds`` rounds of: previous tree (cold), [the other tree, warm,] this tree cold, this tree warm
    (``warm_only``: the warm starts alone). ``bytecode``: each tree's modules compiled once first
    and used by every start (see :func:`_bytecode_env`). ``system_every``, ``numbers``,
    ``diverge_at``: the generated log's system records, floats and non-finite steps (not with
    ``log_dir``: that log is served as it is)."""
    name = f"r{steps}"
    generated = name + (f"-sys{system_every}" if system_every else "")
    generated += "" if numbers == "fixed" else f"-{numbers}"
    generated += f"-div{diverge_at}" if diverge_at else ""
    logdir = log_dir or os.path.join(out_dir, "bigruns26", generated)
    path = os.path.join(logdir, name, "metrics.jsonl")
    if log_dir is None:
        gen = ensure_run_log(path, steps, system_every, numbers, diverge_at)
    elif not os.path.isfile(path):
        raise FileNotFoundError(f"--log-dir: no {path}")
    else:
        gen = {"reused": True}
    rng = random.Random(seed)
    windows = [rng.randrange(1, steps - steps // 100) for _ in range(fetches)]
    out: dict[str, Any] = {"steps": steps, "file_mb": os.path.getsize(path) / 1e6,
                           "generated": not gen["reused"], "rounds": rounds, "fetches": fetches,
                           "bytecode": bytecode, "system_every": None if log_dir else system_every,
                           "numbers": None if log_dir else numbers,
                           "diverge_at": None if log_dir else diverge_at,
                           "gzip": gzip_ok, "starts": []}
    plan = [("prev", prev, True, logdir)] if prev and not warm_only else []
    if other:
        plan.append(("other", other, False, other_log_dir or logdir))
    plan += [("this", HERE, False, logdir)] if warm_only else [("this", HERE, True, logdir),
                                                                ("this", HERE, False, logdir)]
    pycache = os.path.join(out_dir, "pycache") if bytecode else None
    if pycache is not None:
        for tree in {tree for _label, tree, _cold, _where in plan}:
            compile_tree(tree, pycache)
    for r in range(rounds):
        for label, tree, cold, where in plan:
            res = one_start(tree, where, name, steps, windows, fetches, cold, out_dir, gzip_ok=gzip_ok,
                            pycache=pycache)
            res["round"] = r
            res["label"] = label
            out["starts"].append(res)
            log(f"  {label} {'cold' if cold else 'warm'}: "
                f"indexed {res['index_s']:.2f} s (server CPU {res['index_cpu_s']:.2f} s), "
                f"first answer {res['first_answer_ms']:.0f} ms, full p50/p99 {res['full_p50_ms']:.0f}/"
                f"{res['full_p99_ms']:.0f} ms, 1% zoom {res['zoom_p50_ms']:.0f}/{res['zoom_p99_ms']:.0f} ms, "
                f"RSS {res['rss_mb']:.0f}+{res['worker_rss_mb']:.0f} MB, sidecar {res['sidecar_mb']:.0f} MB")
    return out


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=2_000_000)
    p.add_argument("--prev", help="a checkout of the previous release, served for comparison")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--fetches", type=int, default=20)
    p.add_argument("--out-dir", default=os.path.join(HERE, "benchmarks", "out"))
    p.add_argument("--log-dir", help="an existing log: DIR/r<steps>/metrics.jsonl (not generated)")
    p.add_argument("--other", help="a second tree (e.g. main's checkout), served warm beside this one")
    p.add_argument("--other-log-dir", help="the second tree's copy of the log (default: --log-dir)")
    p.add_argument("--warm-only", action="store_true", help="no cold starts (the sidecars exist)")
    p.add_argument("--gzip", action="store_true", help="ask for gzip-compressed answers, as the page does")
    p.add_argument("--no-bytecode", action="store_true",
                   help="let each start compile the modules (the environment may forbid writing .pyc files)")
    p.add_argument("--system-every", type=int, default=0, metavar="K",
                   help="generate the log with a system record after every K-th step")
    p.add_argument("--numbers", choices=NUMBERS, default="fixed",
                   help="generate the log with its floats written so (runlogs.py; default: fixed)")
    p.add_argument("--diverge-at", type=int, default=0, metavar="K",
                   help="generate the log with every step from the K-th on non-finite (a diverged run)")
    a = p.parse_args()
    if (a.system_every or a.numbers != "fixed" or a.diverge_at) and a.log_dir:
        p.error("--system-every, --numbers and --diverge-at generate a log; --log-dir serves one as it is")
    os.makedirs(a.out_dir, exist_ok=True)
    result = run(a.steps, a.prev, a.rounds, a.fetches, a.out_dir,
                 lambda m: print(m, file=sys.stderr, flush=True), log_dir=a.log_dir, other=a.other,
                 other_log_dir=a.other_log_dir, warm_only=a.warm_only, gzip_ok=a.gzip,
                 bytecode=not a.no_bytecode, system_every=a.system_every, numbers=a.numbers,
                 diverge_at=a.diverge_at)
    print(json.dumps(result, indent=1))
