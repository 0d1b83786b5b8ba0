"""Hand-written tensor parallelism with msrun (2 CPU workers): the norm is the unsharded model's.

One msrun job (tests/tp_train.py) trains the column/row-split MLP in stand-alone mode with explicit
communication and inside DATA_PARALLEL; a single process trains the unsharded model as the
reference.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from gradmon.cells.norm_strategies import fused_available

from tests.msrun_util import ROOT, run_msrun, worker_env

SCRIPT = ROOT / "tests" / "tp_train.py"
SPLIT = {"w_col": (slice(None), "cols"), "b_col": ("cols",), "w_row": ("cols", slice(None))}


def _shard(name: str, full: np.ndarray, rank: int) -> np.ndarray:
    """This rank's slice of a reference weight (the split halves the 32-wide dimension)."""
    if name not in SPLIT:
        return full
    cols = slice(rank * 16, (rank + 1) * 16)
    return full[tuple(cols if s == "cols" else s for s in SPLIT[name])]


@pytest.mark.slow
@pytest.mark.distributed
def test_sharded_norm_equals_unsharded_reference_on_every_rank(tmp_path):
    out = tmp_path / "tp"
    ref = subprocess.run([sys.executable, str(SCRIPT), str(out), "--reference"], cwd=tmp_path,
                         env=worker_env(), capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stdout[-3000:] + ref.stderr[-3000:]
    run_msrun(SCRIPT, [str(out)], tmp_path, timeout=600)
    reference = json.loads((tmp_path / "tp.reference.json").read_text())["standalone"]
    ranks = [json.loads((tmp_path / f"tp.rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2]
    ref_norms = reference["norms"]
    assert all(math.isfinite(n) for n in ref_norms[:3]) and math.isnan(ref_norms[3])

    auto = "fused" if fused_available() else "flat"  # what "auto" picks on this machine
    for mode, strategy in (("standalone", "flat"), ("data_parallel", auto)):
        runs = [r[mode] for r in ranks]
        for rank, run in enumerate(runs):
            parallel_mode = "stand_alone" if mode == "standalone" else "data_parallel"
            assert run["config"] == {"parallel_mode": parallel_mode, "device_num": 2,
                                     "norm_strategy": strategy, "shard_group": "tp",
                                     "sharded_params": 3}, (mode, rank)
            # The reported norm is the unsharded model's, on every rank, to 1e-6.
            np.testing.assert_allclose(run["norms"][:3], ref_norms[:3], rtol=1e-6, err_msg=f"{mode} {rank}")
            np.testing.assert_allclose(run["grad_norm"][:3], ref_norms[:3], rtol=1e-6)
            functional = [run["functional"], run["functional_jit"]]
            np.testing.assert_allclose(functional, [ref_norms[0]] * 2, rtol=1e-6)
            # Clipping engages on step 3 only, with the reference's coefficient.
            np.testing.assert_allclose(run["clip_coef"], reference["clip_coef"], rtol=1e-6)
            assert run["clipped"] == reference["clipped"] == [0.0, 0.0, 1.0, 0.0]
            # The NaN in rank 1's shard of one gradient: every rank sees a NaN norm and skips.
            assert math.isnan(run["norms"][3])
            assert run["skipped"] == run["nonfinite"] == [0.0, 0.0, 0.0, 1.0]
            # The weights follow the reference (each rank its slices) and stay put on the skipped step.
            for step in range(4):
                for name, value in run["weights"][step].items():
                    expected = _shard(name, np.asarray(reference["weights"][step][name]), rank)
                    np.testing.assert_allclose(value, expected, rtol=1e-5, atol=1e-6, err_msg=name)
            assert run["weights"][3] == run["weights"][2]
            # Per-parameter norms of sharded weights are the whole weights' (finite ones compared).
            for name, value in run["layers"].items():
                if math.isfinite(reference["layers"][name]):
                    np.testing.assert_allclose(value, reference["layers"][name], rtol=1e-5, err_msg=name)
        # Identical on both ranks: the decisions cannot diverge.
        assert runs[0]["norms"][:3] == runs[1]["norms"][:3]
        assert runs[0]["clip_coef"] == runs[1]["clip_coef"]
        # local_norm: each rank's own partial norm, smaller than the global one and different per rank;
        # the fault shows only in rank 1's.
        local0, local1 = runs[0]["grad_norm_local"], runs[1]["grad_norm_local"]
        assert all(a < n and b < n for a, b, n in zip(local0[:3], local1[:3], ref_norms[:3]))
        assert local0[:3] != local1[:3]
        assert math.isfinite(local0[3]) and math.isnan(local1[3])

    refused = ranks[0]["refused"]
    assert refused["data_parallel_no_group"].startswith("UnsupportedParallelError")
    assert "layerwise_parallel=True" in refused["data_parallel_no_group"]
    assert "pass shard_group=" in refused["data_parallel_no_group"]
    assert "parallel_mode='hybrid_parallel'" in refused["hybrid_parallel"]
    assert "supported: stand_alone and data_parallel" in refused["hybrid_parallel"]
