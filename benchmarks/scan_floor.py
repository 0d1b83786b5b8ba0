"""How far the cold index is from a compiled floor (issue #26): ``python -m benchmarks.scan_floor
[--steps N | --log PATH] [--rounds R] [--smoke]``.

``scan_floor.c`` reads a run log as the server does (its slices, lines split) and takes every
numeric value into a float64 column per key, and nothing else: no validation, no Python objects, no
buckets, alarm rule or sidecar. It is built here with the compiler the server's scanner uses
(``gradmon.server.native``). Beside it, in the same rounds (interleaved), the server's own cold
index of the same log in this process (``index_alarms.index_once``: ``Run.poll`` slices of
``POLL_IDLE_MAX_BYTES``, as a server with no page connected reads a backlog, the sidecar written,
the derived alarm rule on). The ratio says how much of the index's time is reading numbers at all,
and so what a fully compiled index could reach.
``--smoke``: 20,000 steps, one round.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
from typing import Any

from benchmarks.index_alarms import index_once
from benchmarks.runlogs import ensure_run_log
from benchmarks.stats import summarize
from gradmon.server.app import POLL_IDLE_MAX_BYTES
from gradmon.server.sidecar import sidecar_dir

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scan_floor.c")


def build(out_dir: str) -> str:
    """Compile ``scan_floor.c`` into ``out_dir``; returns the program's path (raises
    ``gradmon.server.native.NativeBuildError`` without a C compiler)."""
    from gradmon.server.native import _compiler

    program = os.path.join(out_dir, "scan_floor")
    subprocess.run([_compiler(dict(os.environ)), "-O2", "-o", program, SOURCE], check=True,
                   capture_output=True, timeout=120)
    return program


def scan(program: str, path: str, slice_bytes: int = POLL_IDLE_MAX_BYTES) -> dict[str, Any]:
    """One run of the probe on ``path``: ``{seconds, lines, slice, columns: {key: [count, sum]}}``."""
    proc = subprocess.run([program, path, str(slice_bytes)], check=True, capture_output=True, text=True,
                          timeout=600)
    return json.loads(proc.stdout)


def measure(program: str, path: str, rounds: int) -> dict[str, Any]:
    floor, index = [], []
    for _ in range(rounds):
        floor.append(scan(program, path)["seconds"])
        shutil.rmtree(sidecar_dir(path), ignore_errors=True)  # (a cold index: no sidecar to restore)
        index.append(index_once(path, rule=True)["seconds"])
    floor_s, index_s = summarize(floor)["median"], summarize(index)["median"]
    return {"floor_s": floor_s, "index_s": index_s, "floor_share": floor_s / index_s,
            "floor_each": floor, "index_each": index, "rounds": rounds}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=2_000_000, help="steps of the synthetic log (default 2M)")
    ap.add_argument("--log", help="an existing log instead (its sidecar is removed before each index)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="20,000 steps, one round")
    ap.add_argument("--out-dir", default=os.path.join("benchmarks", "out"))
    args = ap.parse_args(argv)
    steps, rounds = (20_000, 1) if args.smoke else (args.steps, args.rounds)
    path = args.log or os.path.join(args.out_dir, "bigruns", f"run{steps}", "metrics.jsonl")
    if not args.log:
        ensure_run_log(path, steps)
    os.makedirs(args.out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        result = {"log": path, "file_mb": os.path.getsize(path) / 1e6, **measure(build(tmp), path, rounds)}
    out = os.path.join(args.out_dir, "scan_floor.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    print(f"{result['file_mb']:.0f} MB: numbers into float64 columns in {result['floor_s']:.2f} s (compiled "
          f"floor), the server's cold index {result['index_s']:.2f} s: the floor is "
          f"{100 * result['floor_share']:.0f} % of it (medians of {rounds})")
    print(f"-> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
