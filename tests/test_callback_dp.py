"""Two data-parallel CPU workers under msrun: one global log, written by rank 0 only."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gradmon.runlog import ReadStats, read_records

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "dp_monitor_train.py"
MSRUN = Path(sys.executable).parent / "msrun"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_msrun(tmp_path: Path, *extra: str) -> Path:
    if not MSRUN.exists():
        pytest.skip("msrun not installed next to the interpreter")
    run_dir = tmp_path / "run"
    env = dict(os.environ, PATH=f"{MSRUN.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    cmd = [str(MSRUN), "--worker_num=2", "--local_worker_num=2", f"--master_port={free_port()}",
           "--join=True", f"--log_dir={tmp_path / 'msrun_logs'}", str(SCRIPT), str(run_dir / "metrics.jsonl"),
           *extra]
    # Own process group, so a hung job's workers are killed with it.
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"msrun timed out:\n{out[-3000:]}")
    logs = "\n".join(p.read_text(errors="replace")[-3000:]
                     for p in sorted((tmp_path / "msrun_logs").glob("*.log")))
    assert proc.returncode == 0, f"msrun failed:\n{out[-3000:]}\n{logs}"
    return run_dir


def segment(path: Path) -> list[dict]:
    stats = ReadStats()
    recs = list(read_records(path, stats=stats))
    assert stats.malformed == 0 and stats.partial_tail_bytes == 0
    return recs


def check_log(recs: list[dict], rank: int) -> None:
    assert [r["type"] for r in recs if r["type"] == "header"] == ["header"]  # one writer, one segment
    header = recs[0]
    assert (header["world_size"], header["rank"]) == (2, rank)
    steps = [r for r in recs if r["type"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, 9))  # every step, from the device history
    assert all(r["grad_norm"] > 0 for r in steps)
    assert recs[-1]["type"] == "end" and recs[-1]["status"] == "finished"


def test_only_rank0_writes_the_global_log(tmp_path):
    run_dir = run_msrun(tmp_path)
    assert sorted(p.name for p in run_dir.iterdir()) == ["metrics.jsonl"]
    check_log(segment(run_dir / "metrics.jsonl"), rank=0)


def test_per_rank_files(tmp_path):
    run_dir = run_msrun(tmp_path, "--per-rank")
    assert sorted(p.name for p in run_dir.iterdir()) == ["metrics.jsonl", "metrics.rank0.jsonl",
                                                          "metrics.rank1.jsonl"]
    check_log(segment(run_dir / "metrics.jsonl"), rank=0)
    for rank in (0, 1):
        recs = segment(run_dir / f"metrics.rank{rank}.jsonl")
        check_log(recs, rank=rank)
    per_rank = [segment(run_dir / f"metrics.rank{r}.jsonl") for r in (0, 1)]
    assert per_rank[0][0]["pid"] != per_rank[1][0]["pid"]  # written by the two workers
    norms = [[r["grad_norm"] for r in recs if r["type"] == "step"] for recs in per_rank]
    assert norms[0] == pytest.approx(norms[1], rel=1e-5)  # the all-reduced norm: the same on both ranks
