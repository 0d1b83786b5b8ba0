"""Forensics under data parallel (2 msrun CPU ranks): one poisoned sample in rank 1's micro-batch.

One short run (tests/dp_forensics_train.py): the alarm event at the faulty step names rank 1, the
poisoned sample's id among rank 1's ids, and per-layer and per-rank norms that equal a float64
torch reference computed from the weights before the step and the batches the event names.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.msrun_util import ROOT, run_msrun

SCRIPT = ROOT / "tests" / "dp_forensics_train.py"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("forensics_dp")
    run_msrun(SCRIPT, [str(out)], out, timeout=300)
    return out


def test_the_alarm_names_the_rank_the_layer_and_the_sample(run: Path):
    from tests import dp_forensics_train as script
    from tests.forensics_reference import mlp_grads, norm_of, ranked_layer_norms, the_alarm

    records, alarm = the_alarm(run / "metrics.jsonl")
    assert alarm["step"] == script.FAULT_STEP and alarm["reason"] == "grad_norm_spike"
    f = alarm["forensics"]
    assert f["step"] == script.FAULT_STEP and f["layer_count"] == 6 and f["grouped"] is False
    # (b) the rank: rank 1's own norm is the spike, rank 0's is ordinary.
    assert f["top_rank"] == script.FAULT_RANK == 1
    assert f["rank_norms"][1] > 1000 * f["rank_norms"][0]
    # (c) the samples: each rank's ids of that step; the poisoned one is rank 1's, at its place.
    world = 2
    bad = script.fault_id(world)
    ids = f["sample_ids"]
    assert len(ids) == world and all(len(r) == script.BATCH for r in ids)
    assert ids[1][script.FAULT_POS] == bad and bad not in ids[0]
    assert all(i % world == r for r, rank_ids in enumerate(ids) for i in rank_ids)  # rank r's own rows
    # (a) the layers, against a float64 reference from the weights before the step and those batches.
    weights = dict(np.load(run / "weights_before_fault.npz"))
    x, y = script.global_data(world)
    local = [mlp_grads(weights, x[rank_ids], y[rank_ids], "mse") for rank_ids in ids]
    np.testing.assert_allclose(f["rank_norms"], [norm_of(g) for g in local], rtol=1e-4)
    mean = {k: (local[0][k] + local[1][k]) / 2 for k in weights}  # gradients_mean=True
    ref = ranked_layer_norms(mean)
    assert [row["name"] for row in f["layers"]] == [k for k, _ in ref]  # the same order, top layer first
    np.testing.assert_allclose([row["grad_norm"] for row in f["layers"]], [v for _, v in ref], rtol=1e-4)
    np.testing.assert_allclose(alarm["value"], norm_of(mean), rtol=1e-4)
    # The poisoned sample's inputs feed the first layer: its weight gradient blows up most.
    assert f["layers"][0]["name"].endswith("body.0.weight")
    # Only the alarm carries forensics; the step records are as without it.
    assert not any("forensics" in r for r in records if r is not alarm)
