"""semi_auto_parallel: the norm the parallel compiler completes equals the single-device reference.

Runs on a GPU/Ascend machine with >= 2 devices (``GRADMON_DEVICES``, default 2; even for the
pipeline case): ``pytest tests/test_cells_parallel_semi.py``. On CPU MindSpore refuses
semi_auto_parallel at compile time; the device test is skipped with that reason, and a CPU test
checks that the refusal is still MindSpore's behaviour (so the skip stays honest). In stand-alone
mode the per_tensor form's numbers are compared with the flat form's in test_cells_parallel.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

from tests.msrun_util import ROOT, run_msrun, worker_env

SCRIPT = ROOT / "tests" / "semi_auto_train.py"
DEVICE = str(ms.get_context("device_target"))
CPU_REASON = ("semi_auto_parallel runs on Ascend/GPU only: MindSpore refuses it on CPU at compile time "
              "('Invalid communication backend: CPU for semi_auto_parallel/auto_parallel mode'); run "
              "tests/test_cells_parallel_semi.py on a GPU/Ascend machine with >= 2 devices")


@pytest.mark.skipif(DEVICE not in ("CPU",), reason="the CPU refusal only matters on CPU")
def test_cpu_refuses_semi_auto_parallel_so_the_device_test_is_skipped():
    old = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_auto_parallel_context(parallel_mode="semi_auto_parallel")
    try:
        net = nn.WithLossCell(nn.Dense(4, 3), nn.MSELoss())
        step = nn.TrainOneStepCell(net, nn.SGD(net.trainable_params(), 0.1))
        with pytest.raises(RuntimeError, match="Invalid communication backend: CPU"):
            step(Tensor(np.ones((2, 4), np.float32)), Tensor(np.ones((2, 3), np.float32)))
    finally:
        ms.reset_auto_parallel_context()
        ms.set_context(mode=old)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.skipif(DEVICE == "CPU", reason=CPU_REASON)
@pytest.mark.parametrize("config", ["tensor", "optimizer", "pipeline"])
def test_semi_auto_norm_equals_single_device_reference(tmp_path, config):
    devices = int(os.environ.get("GRADMON_DEVICES", "2"))
    out = tmp_path / "semi"
    ref = subprocess.run([sys.executable, str(SCRIPT), str(out), "--reference"], cwd=tmp_path,
                         env=worker_env(), capture_output=True, text=True, timeout=600)
    assert ref.returncode == 0, ref.stdout[-3000:] + ref.stderr[-3000:]
    run_msrun(SCRIPT, [str(out), "--config", config], tmp_path, timeout=900, workers=devices)
    reference = json.loads((tmp_path / "semi.reference.json").read_text())
    ranks = [json.loads((tmp_path / f"semi.{config}.rank{r}.json").read_text()) for r in range(devices)]
    for run in ranks:
        assert run["config"]["parallel_mode"] == "semi_auto_parallel"
        assert run["config"]["norm_strategy"] == "per_tensor"
        assert run["config"]["device_num"] == devices
        # Every rank reports the same norm and takes the same clip decision.
        np.testing.assert_allclose(run["norms"], ranks[0]["norms"], rtol=1e-6)
        np.testing.assert_allclose(run["clip_coef"], ranks[0]["clip_coef"], rtol=1e-6)
    if config == "pipeline":
        # Micro-batch gradients accumulate (sum or mean, MindSpore's convention): before any update
        # the norm is the reference's times that constant factor; the tied embedding counts once.
        ratio = ranks[0]["norms"][0] / reference["norms"][0]
        assert min(abs(ratio - 1.0), abs(ratio - 2.0)) < 1e-4, ratio
    else:
        np.testing.assert_allclose(ranks[0]["norms"], reference["norms"], rtol=1e-5)
        np.testing.assert_allclose(ranks[0]["clip_coef"], reference["clip_coef"], rtol=1e-5)
