"""Forensics in the step cell (``forensics=K``, ``forensics_ids=B``) on real MindSpore, one process.

The per-layer norms the ring keeps equal a float64 torch reference step by step; sample ids are
kept and never reach the network; ``forensics=0`` compiles the same graph as a cell without the
option (no Parameter, no kernel).
"""

from __future__ import annotations

import collections
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from gradmon.cells import MonitoredTrainStep, MonitoredTrainStepWithLossScale
from gradmon.cells.forensics import LayerRing
from mindspore import Tensor, nn

from examples.models import MLP, with_loss
from tests import parity_util
from tests.forensics_reference import mlp_grads

mode = parity_util.mode  # the GRAPH / PYNATIVE fixture
graph_mode = parity_util.graph_mode
context_mode = parity_util.context_mode  # a mode by name, for tests parametrized on more than it
ROOT = Path(__file__).resolve().parent.parent


def _batches(steps: int, n: int = 8, in_dim: int = 16):
    rng = np.random.default_rng(1)
    return [(rng.random((n, in_dim), dtype=np.float32), rng.integers(0, 10, n).astype(np.int32))
            for _ in range(steps)]


@pytest.mark.parametrize(("mode_name", "strategy"), [("GRAPH", "auto"), ("PYNATIVE", "auto"),
                                                     ("GRAPH", "flat"), ("GRAPH", "per_tensor")])
def test_per_layer_norms_of_each_kept_step_equal_a_torch_reference(context_mode, mode_name, strategy):
    context_mode(mode_name)  # auto is the fused kernel's per-tensor pass where it is built
    ms.set_seed(0)
    net = MLP(in_dim=16, hidden=24)
    cell = MonitoredTrainStep(with_loss(net), nn.SGD(net.trainable_params(), 0.1), norm_strategy=strategy,
                              forensics=3)
    names = [p.name for p in cell.weights]
    expected = []
    for x, y in _batches(5):
        before = {p.name: p.asnumpy() for p in cell.weights}
        grads = mlp_grads(before, x, y, "ce")
        expected.append({k: float(np.linalg.norm(g)) for k, g in grads.items()})
        cell(Tensor(x), Tensor(y))
    for back in range(3):  # the last three steps are kept, newest first
        f = cell.gradmon_forensics(back)
        ref = expected[-1 - back]
        assert f["layer_count"] == len(names) and "rank_norms" not in f and "sample_ids" not in f
        got = {row["name"]: row["grad_norm"] for row in f["layers"]}
        assert set(got) == set(names)
        np.testing.assert_allclose([got[k] for k in names], [ref[k] for k in names], rtol=2e-5, atol=1e-7)
        norms = [row["grad_norm"] for row in f["layers"]]
        assert norms == sorted(norms, reverse=True)
    assert "forensics=3 kept" in cell.gradmon_forensics(3)["missing"]  # left the ring
    assert cell.gradmon_forensics(0, top_k=2)["layers"] == cell.gradmon_forensics(0)["layers"][:2]


def test_loss_scaled_forensics_are_unscaled_and_sample_ids_skip_the_network(mode):
    ms.set_seed(0)
    net = MLP(in_dim=16, hidden=24)
    cell = MonitoredTrainStepWithLossScale(with_loss(net), nn.SGD(net.trainable_params(), 0.1),
                                           Tensor(1024.0, ms.float32), forensics=2, forensics_ids=8)
    expected = []
    for step, (x, y) in enumerate(_batches(3)):
        before = {p.name: p.asnumpy() for p in cell.weights}
        expected.append(mlp_grads(before, x, y, "ce"))
        # The network takes (x, y) only: the third input is the batch's ids, which the cell keeps.
        cell(Tensor(x), Tensor(y), Tensor(np.arange(8, dtype=np.int32) + 1000 * step))
    for back in (0, 1):
        f = cell.gradmon_forensics(back)
        assert f["sample_ids"] == [list(range(1000 * (2 - back), 1000 * (2 - back) + 8))]
        got = {row["name"]: row["grad_norm"] for row in f["layers"]}
        ref = {k: float(np.linalg.norm(g)) for k, g in expected[-1 - back].items()}
        np.testing.assert_allclose([got[k] for k in ref], list(ref.values()), rtol=2e-5, atol=1e-7)


def test_accumulated_loss_scaled_forensics_are_the_mean_gradients_and_every_micro_batchs_ids(mode):
    """grad_accum_steps=3 with loss scaling: each kept optimizer step's per-layer norms are those of
    the unscaled mean gradient over its 3 micro-batches (float64 torch), the norm combines from them,
    and its sample ids are the 3 micro-batches' in order; the step under way is not reported."""
    n, b, steps = 3, 8, 3
    ms.set_seed(0)
    net = MLP(in_dim=16, hidden=24)
    cell = MonitoredTrainStepWithLossScale(with_loss(net), nn.SGD(net.trainable_params(), 0.1),
                                           Tensor(1024.0, ms.float32), grad_accum_steps=n, forensics=2,
                                           forensics_ids=b)
    batches = _batches(steps * n + 1)
    expected, norms = [], []
    for step in range(steps):
        before = {p.name: p.asnumpy() for p in cell.weights}
        micro = [mlp_grads(before, x, y, "ce") for x, y in batches[step * n:(step + 1) * n]]
        expected.append({k: float(np.linalg.norm(sum(g[k] for g in micro) / n)) for k in before})
        for m, (x, y) in enumerate(batches[step * n:(step + 1) * n]):
            ids = np.arange(b, dtype=np.int32) + 100 * (step * n + m)
            out = cell(Tensor(x), Tensor(y), Tensor(ids))
        norms.append(float(out[1].asnumpy()))
    x, y = batches[-1]
    cell(Tensor(x), Tensor(y), Tensor(np.full(b, -1, np.int32)))  # a 4th step's first micro-batch
    for back in (0, 1):
        f = cell.gradmon_forensics(back)
        step = steps - 1 - back
        assert f["sample_ids"] == [[100 * (step * n + m) + i for m in range(n) for i in range(b)]]
        got = {row["name"]: row["grad_norm"] for row in f["layers"]}
        ref = expected[step]
        np.testing.assert_allclose([got[k] for k in ref], list(ref.values()), rtol=2e-5, atol=1e-7)
        combined = float(np.sqrt(sum(v * v for v in got.values())))
        np.testing.assert_allclose(combined, norms[step], rtol=1e-5)
    assert "missing" in cell.gradmon_forensics(2)  # forensics=2: the first step has left the ring


def test_many_parameters_are_kept_as_groups(mode):
    names = [f"blocks.{i // 2}.w{i % 2}" for i in range(6)]
    ring = LayerRing(2, names, max_columns=3)
    assert ring.columns == ["blocks.0", "blocks.1", "blocks.2"] and ring.grouped
    sq = np.arange(1, 7, dtype=np.float32)
    ring(Tensor(sq))
    np.testing.assert_array_equal(ring.read(0), [1 + 2, 3 + 4, 5 + 6])
    assert ring.read(1) is None


def test_bad_options_are_refused():
    net = MLP(in_dim=16, hidden=8)
    opt = nn.SGD(net.trainable_params(), 0.1)
    with pytest.raises(ValueError, match="forensics must be an int >= 0"):
        MonitoredTrainStep(with_loss(net), opt, forensics=-1)
    with pytest.raises(ValueError, match="forensics_ids needs forensics"):
        MonitoredTrainStep(with_loss(net), opt, forensics_ids=8)


def test_forensics_on_trains_the_same_weights_and_off_adds_nothing(graph_mode):
    runs = {}
    for kw in ({}, {"forensics": 0}, {"forensics": 4}):
        ms.set_seed(0)
        net = MLP(in_dim=16, hidden=24)
        cell = MonitoredTrainStep(with_loss(net), nn.SGD(net.trainable_params(), 0.1), **kw)
        outs = [tuple(t.asnumpy().item() for t in cell(Tensor(x), Tensor(y))) for x, y in _batches(4)]
        runs[kw.get("forensics")] = (outs, [p.asnumpy() for p in net.trainable_params()],
                                     [p.name for p in cell.get_parameters()], cell)
    default, off, on = runs[None], runs[0], runs[4]
    assert off[0] == default[0] and off[2] == default[2]  # outputs bit for bit, the same Parameters
    assert not hasattr(off[3], "forensics_layers") and off[3].grad_norm.per_tensor is False
    assert off[3].gradmon_forensics(0) is None  # LiveMonitor then attaches nothing
    for a, b, c in zip(default[1], off[1], on[1]):
        assert (a == b).all() and (a == c).all()  # SGD on the gradients: forensics changes no weight
    # With forensics the norm is the sum of the per-tensor sums (as with layer_stats): the last bit may move.
    np.testing.assert_allclose([o[1] for o in on[0]], [o[1] for o in default[0]], rtol=1e-6)
    assert [o[0] for o in on[0]] == [o[0] for o in default[0]]
    assert set(on[2]) - set(default[2]) == {"gradmon_forensics_layers", "gradmon_forensics_layers_steps"}


_IR_SCRIPT = textwrap.dedent("""
    import sys
    import mindspore as ms, numpy as np
    from mindspore import Tensor, nn
    from examples.models import MLP, with_loss
    from gradmon.cells import MonitoredTrainStep
    for path, kw in zip(sys.argv[1:], ({}, {"forensics": 0}, {"forensics": 4}, {})):
        ms.set_context(mode=ms.GRAPH_MODE, save_graphs=1, save_graphs_path=path)
        ms.set_seed(0)
        net = MLP(in_dim=16, hidden=24)
        cell = MonitoredTrainStep(with_loss(net), nn.SGD(net.trainable_params(), 0.1), **kw)
        if path.endswith("stock_record"):
            cell.fused_record = False  # the row from stock ops, as every cell with forensics writes it
        cell(Tensor(np.ones((8, 16), np.float32)), Tensor(np.zeros(8, np.int32)))
""")


def _primitives(ir_dir: Path) -> collections.Counter:
    (validated,) = ir_dir.glob("*_validate_*.ir")
    return collections.Counter(re.findall(r"= (PrimFunc_\w+|Prim\w*::\w+|[A-Z]\w+)\(", validated.read_text()))


def test_forensics_off_compiles_the_same_graph(tmp_path):
    dirs = [tmp_path / name for name in ("default", "off", "on", "stock_record")]
    subprocess.run([sys.executable, "-c", _IR_SCRIPT, *map(str, dirs)], cwd=ROOT, check=True, timeout=300,
                   capture_output=True)
    default, off, on, stock_record = (_primitives(d) for d in dirs)
    assert default and off == default
    extra = on - stock_record  # forensics' per-tensor sums leave the defaults' fused record (train_step.py)
    assert extra["ScatterUpdate"] == 1 and extra["PrimFunc_AssignAdd"] == 1  # one row and the counter
