"""Run a script under ``msrun`` with 2 CPU workers, for the data-parallel tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MSRUN = Path(sys.executable).parent / "msrun"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env() -> dict[str, str]:
    """This interpreter first on PATH (msrun starts workers with the `python` it finds) and the
    checkout importable."""
    return dict(os.environ, PYTHONPATH=str(ROOT),
                PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")


def run_msrun(script: Path, args: list[str], cwd: Path, timeout: float = 300, workers: int = 2) -> str:
    """Run ``script args`` on ``workers`` workers; fail the test with their logs if it fails or hangs."""
    if not MSRUN.exists():
        pytest.skip("msrun not installed next to the interpreter")
    log_dir = cwd / "msrun_logs"
    cmd = [str(MSRUN), f"--worker_num={workers}", f"--local_worker_num={workers}",
           f"--master_port={free_port()}", "--join=True", f"--log_dir={log_dir}", str(script), *args]
    # Own process group, so a hung job's workers are killed with it.
    proc = subprocess.Popen(cmd, cwd=cwd, env=worker_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"msrun timed out:\n{out[-3000:]}")
    logs = "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted(log_dir.glob("*.log")))
    assert proc.returncode == 0, f"msrun failed:\n{out[-3000:]}\n{logs}"
    return out
