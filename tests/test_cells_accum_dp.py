"""Gradient accumulation under data parallel (msrun, 2 CPU workers): the accumulated global norm of
each optimizer step is the one of a single process accumulating the full global micro-batches."""

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
def test_two_rank_accumulated_norms_equal_the_single_process_reference(tmp_path):
    out, steps, accum = tmp_path / "norms", 3, 2
    args = [str(out), "--steps", str(steps), "--accum", str(accum)]
    ref = subprocess.run([sys.executable, str(SCRIPT), *args, "--reference"], cwd=tmp_path, env=worker_env(),
                         capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stdout[-3000:] + ref.stderr[-3000:]
    run_msrun(SCRIPT, args, tmp_path, timeout=600)
    ranks = [json.loads((tmp_path / f"norms.rank{r}.json").read_text()) for r in (0, 1)]
    reference = json.loads((tmp_path / "norms.reference.json").read_text())
    assert [r["world"] for r in ranks] == [2, 2]
    assert len(reference["norms"]) == steps and len(reference["history_norms"]) == steps  # optimizer steps
    assert ranks[0]["norms"] == ranks[1]["norms"]  # reduced once, then the same norm everywhere
    np.testing.assert_allclose(ranks[0]["norms"], ranks[0]["history_norms"], rtol=1e-6)
    np.testing.assert_allclose(ranks[0]["norms"], reference["norms"], rtol=1e-5)
    assert ranks[0]["clipped"] == ranks[1]["clipped"] == reference["clipped"]
    assert reference["clipped"][-1] == 1.0
    for a, b in zip(ranks[0]["weights"], reference["weights"]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    # each rank's local (accumulated, unreduced) norm is its own shard's
    assert ranks[0]["local_norms"] != ranks[1]["local_norms"]
