"""Data parallel with msrun (2 CPU workers): the reported norm is the all-reduced one."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.msrun_util import ROOT, run_msrun, worker_env

SCRIPT = ROOT / "tests" / "dp_train.py"


@pytest.mark.slow
@pytest.mark.distributed
def test_two_rank_norms_identical_and_equal_full_batch_reference(tmp_path):
    out = tmp_path / "norms"
    steps = 4
    ref = subprocess.run([sys.executable, str(SCRIPT), str(out), "--steps", str(steps), "--reference"],
                         cwd=tmp_path, env=worker_env(), capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stdout[-3000:] + ref.stderr[-3000:]
    run_msrun(SCRIPT, [str(out), "--steps", str(steps)], tmp_path, timeout=600)
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
    # the detector's loss test sees the ranks' mean loss (the same on both ranks), not each rank's own
    assert ranks[0]["rank_losses"] != ranks[1]["rank_losses"]
    assert ranks[0]["loss_ring"] == ranks[1]["loss_ring"]
    np.testing.assert_allclose(ranks[0]["loss_ring"],
                               0.5 * (np.array(ranks[0]["rank_losses"]) + ranks[1]["rank_losses"]), rtol=1e-6)
    # each rank's pre-reduction norm is its own shard's: different across ranks and from the global one
    assert ranks[0]["local_norms"] != ranks[1]["local_norms"]
    np.testing.assert_allclose(reference["local_norms"], reference["norms"], rtol=1e-6)
