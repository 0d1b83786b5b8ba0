"""Data parallel with msrun (2 CPU workers): the reported norm is the all-reduced one."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "dp_train.py"
MSRUN = Path(sys.executable).parent / "msrun"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    # msrun starts workers with the `python` on PATH: make that this interpreter's.
    env = dict(os.environ, PYTHONPATH=str(ROOT),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
@pytest.mark.distributed
def test_two_rank_norms_identical_and_equal_full_batch_reference(tmp_path):
    if not MSRUN.exists():
        pytest.skip("msrun not installed next to the interpreter")
    out = tmp_path / "norms"
    steps = 4
    ref = _run([sys.executable, str(SCRIPT), str(out), "--steps", str(steps), "--reference"], tmp_path, 300)
    assert ref.returncode == 0, ref.stdout[-3000:] + ref.stderr[-3000:]
    proc = _run([str(MSRUN), "--worker_num=2", "--local_worker_num=2", f"--master_port={_free_port()}",
                 "--join=True", f"--log_dir={tmp_path / 'msrun_logs'}", str(SCRIPT), str(out),
                 "--steps", str(steps)], tmp_path, 600)
    logs = "".join(p.read_text(errors="replace")[-3000:] for p in (tmp_path / "msrun_logs").glob("*.log"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:] + logs
    ranks = [json.loads((tmp_path / f"norms.rank{r}.json").read_text()) for r in (0, 1)]
    reference = json.loads((tmp_path / "norms.reference.json").read_text())
    assert [r["world"] for r in ranks] == [2, 2]
    # identical across ranks: the norm is computed after the all-reduce
    assert ranks[0]["norms"] == ranks[1]["norms"]
    assert ranks[0]["history_norms"] == ranks[1]["history_norms"]
    np.testing.assert_allclose(ranks[0]["norms"], ranks[0]["history_norms"], rtol=1e-6)
    # and equal to the norm of the full-batch gradient (the mean of the shard gradients)
    np.testing.assert_allclose(ranks[0]["norms"], reference["norms"], rtol=1e-5)
    assert ranks[0]["clipped"] == ranks[1]["clipped"] == reference["clipped"]
    assert ranks[0]["clipped"][-1] == 1.0
    for a, b in zip(ranks[0]["weights"], reference["weights"]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    # each rank's pre-reduction norm is its own shard's: different across ranks and from the global one
    assert ranks[0]["local_norms"] != ranks[1]["local_norms"]
    np.testing.assert_allclose(reference["local_norms"], reference["norms"], rtol=1e-6)
