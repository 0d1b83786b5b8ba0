"""Run one measurement in a child Python process and read back the JSON it writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any


def run_child(
    module: str, args: Sequence[str], out_file: str, timeout_s: float, log: Callable[[str], None]
) -> dict[str, Any]:
    """``python -m module *args --out out_file``; return the JSON object it wrote, or a dict with
    ``error`` (exit status or timeout, and the last lines of its stderr). Adds ``wall_s``."""
    env = {**os.environ, "GLOG_v": "3"}  # MindSpore's C++ log: errors only
    cmd = [sys.executable, "-m", module, *args, "--out", out_file]
    t0 = time.perf_counter()
    if os.path.exists(out_file):
        os.remove(out_file)
    try:
        proc = subprocess.run(cmd, timeout=timeout_s, capture_output=True, text=True, env=env)
        for line in (proc.stdout or "").splitlines():
            log(line)
        if proc.returncode != 0 or not os.path.exists(out_file):
            result: dict[str, Any] = {
                "error": f"child exited with status {proc.returncode}",
                "stderr_tail": (proc.stderr or "").strip().splitlines()[-8:],
            }
        else:
            with open(out_file, encoding="utf-8") as f:
                result = json.load(f)
    except subprocess.TimeoutExpired:
        result = {"error": f"timed out after {timeout_s:.0f} s"}
    result["wall_s"] = time.perf_counter() - t0
    return result
