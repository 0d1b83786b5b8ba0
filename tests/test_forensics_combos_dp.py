"""Forensics in combination under 2 msrun CPU ranks: with gradient accumulation, and with
hand-sharded parameters (one msrun job: tests/dp_forensics_combos_train.py).

- ``grad_accum_steps=2`` under data parallel: the alarm of the optimizer step whose 2nd micro-batch
  on rank 1 holds a x1000 sample names rank 1, the first layer and the sample among the ids of all
  the step's micro-batches; its per-layer norms are those of the accumulated (mean over micro-batches
  and ranks) gradient and its rank norms those of each rank's own accumulated gradient, against a
  float64 torch reference.
- Hand-written tensor parallelism (``layerwise_parallel=True``, ``shard_group``): the per-layer
  norms of a sharded layer are the whole layer's (summed over its shards), equal on both ranks and
  equal to the unsharded model's, in stand-alone mode and inside data parallel with
  ``grad_accum_steps=2`` (the mean over the micro-batches); there a rank's norm is its own (its
  shards and the replicated layers).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.msrun_util import ROOT, run_msrun

SCRIPT = ROOT / "tests" / "dp_forensics_combos_train.py"
WORLD = 2

pytestmark = [pytest.mark.slow, pytest.mark.distributed]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("forensics_combos")
    run_msrun(SCRIPT, [str(out)], out, timeout=300)
    return out


def test_an_accumulated_alarm_names_the_rank_the_layer_and_the_micro_batch_sample(run: Path):
    from tests import dp_forensics_combos_train as script
    from tests.forensics_reference import mlp_grads, norm_of, ranked_layer_norms, the_alarm

    path = run / "accum" / "metrics.jsonl"
    records, alarm = the_alarm(path)
    assert alarm["step"] == script.FAULT_STEP and alarm["reason"] == "grad_norm_spike"
    steps = [r["step"] for r in records if r.get("type") == "step"]
    assert steps and max(steps) == script.STEPS  # the monitor counts optimizer steps
    f = alarm["forensics"]
    assert f["step"] == script.FAULT_STEP and f["layer_count"] == 6 and f["grouped"] is False
    # The rank: rank 1's own accumulated norm is the spike.
    assert f["top_rank"] == script.FAULT_RANK == 1 and f["rank_norms"][1] > 1000 * f["rank_norms"][0]
    # The samples: each rank's ids of both micro-batches of the step, in order; the poisoned one is
    # rank 1's, in its 2nd micro-batch.
    n, b = script.ACCUM, script.BATCH
    ids = f["sample_ids"]
    first = (script.FAULT_STEP - 1) * n * b  # the step's first row of each rank's own slice
    assert ids == [[WORLD * j + r for j in range(first, first + n * b)] for r in range(WORLD)]
    bad = script.fault_id(WORLD)
    assert ids[1][script.FAULT_MICRO * b + script.FAULT_POS] == bad and bad not in ids[0]
    # The layers: the accumulated gradient's, against float64 torch from the weights before the step.
    weights = dict(np.load(run / "accum" / "weights_before_fault.npz"))
    x, y = script.global_data(WORLD)
    local = []  # each rank's own accumulated gradient: the mean over its micro-batches
    for rank_ids in ids:
        micro = [mlp_grads(weights, x[rank_ids[m * b:(m + 1) * b]], y[rank_ids[m * b:(m + 1) * b]], "mse")
                 for m in range(n)]
        local.append({k: sum(g[k] for g in micro) / n for k in weights})
    np.testing.assert_allclose(f["rank_norms"], [norm_of(g) for g in local], rtol=1e-4)
    mean = {k: sum(g[k] for g in local) / WORLD for k in weights}  # gradients_mean=True
    ref = ranked_layer_norms(mean)
    assert [row["name"] for row in f["layers"]] == [k for k, _ in ref]  # the same order, top layer first
    np.testing.assert_allclose([row["grad_norm"] for row in f["layers"]], [v for _, v in ref], rtol=1e-4)
    np.testing.assert_allclose(alarm["value"], norm_of(mean), rtol=1e-4)
    assert f["layers"][0]["name"].endswith("body.0.weight")  # the poisoned inputs feed the first layer


# The split dimension of each sharded weight of tests/tp_train.py (the others are replicated).
SPLIT_AXIS = {"w_col": 1, "b_col": 0, "w_row": 0}


def _unsharded(ranks: list[dict]) -> list[dict[str, np.ndarray]]:
    """The whole weights before each step, from the ranks' slices (replicated ones equal on both)."""
    out = []
    for per_rank in zip(*(r["weights_before"] for r in ranks)):
        full = {}
        for name in per_rank[0]:
            parts = [np.asarray(w[name]) for w in per_rank]
            if name in SPLIT_AXIS:
                full[name] = np.concatenate(parts, axis=SPLIT_AXIS[name])
            else:
                assert all((p == parts[0]).all() for p in parts), name
                full[name] = parts[0]
        out.append(full)
    return out


@pytest.mark.parametrize("mode", ["standalone", "data_parallel"])
def test_a_sharded_layers_norm_is_the_whole_layers(run: Path, mode: str):
    from tests import dp_forensics_combos_train as script
    from tests.forensics_reference import tp_mlp_grads

    ranks = [json.loads((run / f"tp.rank{r}.json").read_text())[mode] for r in range(WORLD)]
    assert {r["strategy"] for r in ranks} == ({"flat"} if mode == "standalone" else {ranks[0]["strategy"]})
    n = ranks[0]["accum"]
    assert n == (1 if mode == "standalone" else script.ACCUM)
    batches = script.tp_batches(script.TP_STEPS * n)
    for step, full in enumerate(_unsharded(ranks)):
        micro = [tp_mlp_grads(full, x, y) for x, y in batches[step * n:(step + 1) * n]]
        grads = {k: sum(g[k] for g in micro) / n for k in full}  # the step's mean over its micro-batches
        ref = {k: float(np.linalg.norm(g)) for k, g in grads.items()}
        back = script.TP_STEPS - 1 - step
        views = [r["forensics"][back] for r in ranks]
        assert views[0]["layers"] == views[1]["layers"]  # the same on every rank
        got = {row["name"]: row["grad_norm"] for row in views[0]["layers"]}
        assert set(got) == set(ref)
        np.testing.assert_allclose([got[k] for k in ref], list(ref.values()), rtol=1e-5,
                                   err_msg=f"step {step}")
        whole = np.sqrt(sum(v * v for v in ref.values()))
        np.testing.assert_allclose(ranks[0]["norms"][step], whole, rtol=1e-5)
        # Not one rank's shard: each sharded layer's shards are well below the whole.
        for name, axis in SPLIT_AXIS.items():
            for part in np.array_split(grads[name], WORLD, axis=axis):
                assert float(np.linalg.norm(part)) < 0.95 * got[name], (name, step)
        if mode == "standalone":
            assert all("rank_norms" not in v for v in views)  # no data-parallel ranks to compare
            continue
        # Under data parallel a rank's norm is its own (of its accumulated gradients): the replicated
        # layers and its own shards.
        expected = []
        for rank in range(WORLD):
            sq = sum(float(np.sum(g * g)) for k, g in grads.items() if k not in SPLIT_AXIS)
            sq += sum(float(np.sum(np.array_split(grads[k], WORLD, axis=a)[rank] ** 2))
                      for k, a in SPLIT_AXIS.items())
            expected.append(np.sqrt(sq))
        np.testing.assert_allclose(views[0]["rank_norms"], expected, rtol=1e-5)
        assert views[0]["rank_norms"] == views[1]["rank_norms"]
