"""Gradient accumulation in the monitored step cells (``grad_accum_steps=N``), on real MindSpore training:
the accumulated step against a float64 reference, N = 1 against today's cell, a NaN micro-batch,
loss scaling, the options, and what LiveMonitor logs."""

from __future__ import annotations

import math

import mindspore as ms
import numpy as np
import pytest
from gradmon.cells import MonitoredTrainStep, MonitoredTrainStepWithLossScale
from mindspore import Tensor, nn

from examples.models import MLP, with_loss
from tests import parity_util

mode = parity_util.mode  # the GRAPH / PYNATIVE fixture

LR, MAX_NORM = 0.1, 0.5


def _net() -> nn.Cell:
    ms.set_seed(0)
    return MLP(hidden=24)


def _batch(seed: int, scale: float = 1.0, n: int = 8) -> tuple[Tensor, Tensor]:
    rng = np.random.default_rng(seed)
    x = (rng.random((n, 64)) * scale).astype(np.float32)
    return Tensor(x), Tensor(rng.integers(0, 10, n).astype(np.int32))


def _nan_batch(n: int = 8) -> tuple[Tensor, Tensor]:
    _, y = _batch(99, n=n)
    return Tensor(np.full((n, 64), np.nan, np.float32)), y


def _micro_batches(steps: int, n: int) -> list[list[tuple[Tensor, Tensor]]]:
    """``steps`` optimizer steps of ``n`` micro-batches; the second step's are large (it clips)."""
    return [[_batch(10 * s + i, scale=8.0 if s == 1 else 1.0) for i in range(n)] for s in range(steps)]


def _state(cell: nn.Cell) -> dict[str, bytes]:
    """Weights and optimizer state (not gradmon's own Parameters), as raw bytes."""
    return {p.name: p.asnumpy().tobytes() for p in cell.get_parameters() if not p.name.startswith("gradmon_")}


def _grads64(ref: nn.Cell, weights: list[np.ndarray], x: Tensor, y: Tensor) -> tuple[float, list[np.ndarray]]:
    """Loss and gradients of ``ref`` at ``weights`` (float32 MindSpore, returned as float64)."""
    for p, w in zip(ref.trainable_params(), weights):
        p.set_data(Tensor(w.astype(np.float32)))
    loss_net = with_loss(ref)
    loss, grads = ms.value_and_grad(loss_net, None, loss_net.trainable_params())(x, y)
    return float(loss.asnumpy()), [g.asnumpy().astype(np.float64) for g in grads]


def accumulation_errors(n: int, steps: int = 3) -> list[dict[str, float]]:
    """Train ``steps`` optimizer steps of ``n`` micro-batches with ``grad_accum_steps=n`` (SGD, clip
    at MAX_NORM) and compare each step with a float64 numpy reference started from the cell's
    weights before it: the mean gradient over the micro-batches, its norm, the clip coefficient,
    ``w - lr * coef * mean``. Returns per step the reference norm and coefficient and the
    relative errors of the norm, the coefficient, the mean loss and the largest weight error."""
    net, ref = _net(), _net()
    step = MonitoredTrainStep(with_loss(net), nn.SGD(net.trainable_params(), LR), max_norm=MAX_NORM,
                              grad_accum_steps=n)
    rows = []
    for micro in _micro_batches(steps, n):
        before = [p.asnumpy().astype(np.float64) for p in net.trainable_params()]
        results = [_grads64(ref, before, x, y) for x, y in micro]
        mean = [sum(g[i] for _, g in results) / n for i in range(len(before))]
        norm64 = math.sqrt(sum(float((g**2).sum()) for g in mean))
        coef64 = min(1.0, MAX_NORM / (norm64 + 1e-6))
        expected = [w - LR * coef64 * g for w, g in zip(before, mean)]
        outputs = [step(x, y) for x, y in micro]
        assert all(float(out[1].asnumpy()) == 0.0 for out in outputs[:-1])  # micro-steps: no norm yet
        loss, norm = (float(t.asnumpy()) for t in outputs[-1][:2])
        row = step.gradmon_read_history().rows[-1]
        coef = float(row[list(step.fields).index("clip_coef")])
        after = [p.asnumpy().astype(np.float64) for p in net.trainable_params()]
        loss64 = sum(v for v, _ in results) / n
        rows.append({
            "norm64": norm64, "coef64": coef64,
            "norm_err": abs(norm - norm64) / norm64, "coef_err": abs(coef - coef64) / coef64,
            "loss_err": abs(loss - loss64) / abs(loss64),
            "weight_err": max(float(np.abs(a - e).max() / np.abs(e).max()) for a, e in zip(after, expected)),
        })
    snap = step.gradmon_read_history()
    assert snap.total_steps == steps  # the ring counts optimizer steps
    assert snap.column("clipped").tolist() == [0.0, 1.0, 0.0]
    return rows


# ---------------------------------------------------------------------- against float64


@pytest.mark.parametrize("n", [3])
def test_accumulated_norm_clip_and_weights_match_float64_reference(mode, n):
    rows = accumulation_errors(n)
    assert rows[1]["coef64"] < 0.5 and rows[0]["coef64"] == 1.0  # the large step clips, the first does not
    for row in rows:
        assert row["norm_err"] < 2e-6 and row["coef_err"] < 2e-6 and row["loss_err"] < 2e-6, row
        assert row["weight_err"] < 1e-6, row


def test_one_micro_step_is_todays_cell_bit_for_bit(mode):
    cells = []
    for options in ({}, {"grad_accum_steps": 1}):
        net = _net()
        cell = MonitoredTrainStep(with_loss(net), nn.Adam(net.trainable_params(), 1e-2), max_norm=MAX_NORM,
                                  **options)
        batches = (_batch(1), _batch(2, 8.0), _nan_batch(), _batch(3))
        norms = [cell(*b)[1].asnumpy().tobytes() for b in batches]
        cells.append((norms, _state(cell), cell.gradmon_read_history().rows.tobytes()))
    assert cells[0] == cells[1]
    assert not hasattr(MonitoredTrainStep(with_loss(_net()), nn.SGD(_net().trainable_params(), LR)),
                       "accum_grads")  # N = 1 builds no accumulator


def test_two_copies_of_a_batch_step_as_that_batch_bit_for_bit(mode):
    """N = 2 on a repeated micro-batch: the sum is 2g and the mean 2g * 0.5 = g exactly, so norm,
    clip and Adam's update equal one step on the batch, bit for bit."""
    results = []
    for n in (1, 2):
        net = _net()
        cell = MonitoredTrainStep(with_loss(net), nn.Adam(net.trainable_params(), 1e-2), max_norm=MAX_NORM,
                                  grad_accum_steps=n)
        norms = []
        for batch in (_batch(1), _batch(2, 8.0)):
            for _ in range(n):
                out = cell(*batch)
            norms.append(out[1].asnumpy().tobytes())
        results.append((norms, _state(cell), cell.gradmon_read_history().rows.tobytes()))
    assert results[0] == results[1]


# ---------------------------------------------------------------------- skipping


def test_nan_micro_batch_skips_the_optimizer_step_bit_exactly(mode):
    net = _net()
    cell = MonitoredTrainStep(with_loss(net), nn.Adam(net.trainable_params(), 1e-2), max_norm=MAX_NORM,
                              grad_accum_steps=3)
    for b in (_batch(1), _batch(2), _batch(3)):
        cell(*b)
    before = _state(cell)
    for b in (_batch(4), _nan_batch(), _batch(5)):
        _, norm = cell(*b)
    assert not math.isfinite(float(norm.asnumpy()))  # (ReLU turns the NaN input into a finite loss)
    assert _state(cell) == before  # weights and Adam's moments untouched
    # The accumulator was cleared: the next step sees only its own micro-batches.
    ref = _net()
    weights = [p.asnumpy().astype(np.float64) for p in net.trainable_params()]
    grads = [_grads64(ref, weights, *b)[1] for b in (_batch(6), _batch(7), _batch(8))]
    norm64 = math.sqrt(sum(float((((a + b + c) / 3) ** 2).sum()) for a, b, c in zip(*grads)))
    for b in (_batch(6), _batch(7), _batch(8)):
        _, norm = cell(*b)
    assert abs(float(norm.asnumpy()) - norm64) / norm64 < 2e-6
    assert _state(cell) != before
    snap = cell.gradmon_read_history()
    assert snap.total_steps == 3
    assert snap.column("skipped").tolist() == [0.0, 1.0, 0.0]
    assert snap.column("nonfinite").tolist() == [0.0, 1.0, 0.0]
    assert snap.counters["skipped"] == 1 and snap.counters["nonfinite"] == 1


def test_loss_scale_accumulates_and_overflow_skips_one_step(mode):
    net, ref = _net(), _net()
    manager = nn.DynamicLossScaleUpdateCell(loss_scale_value=2.0**10, scale_factor=2, scale_window=1000)
    cell = MonitoredTrainStepWithLossScale(with_loss(net), nn.SGD(net.trainable_params(), LR), manager,
                                           grad_accum_steps=2)
    weights = [p.asnumpy().astype(np.float64) for p in net.trainable_params()]
    grads = [_grads64(ref, weights, *b)[1] for b in (_batch(1), _batch(2))]
    norm64 = math.sqrt(sum(float((((a + b) / 2) ** 2).sum()) for a, b in zip(*grads)))
    outputs = [cell(*b) for b in (_batch(1), _batch(2))]
    assert not bool(outputs[0][2].asnumpy())  # a micro-step is no overflow
    assert abs(float(outputs[1][1].asnumpy()) - norm64) / norm64 < 2e-6  # the unscaled norm of the mean
    before = _state(cell)
    for b in (_nan_batch(), _batch(3)):
        out = cell(*b)
    assert bool(out[2].asnumpy()) and float(out[3].asnumpy()) == 2.0**9  # overflow: skipped, scale halved
    # Weights and optimizer untouched; only the scale and the update cell's step counters moved,
    # once per optimizer step.
    moved = {k for k, v in _state(cell).items() if before[k] != v}
    assert moved == {"scale_sense", "current_iterator_step", "last_overflow_iterator_step"}
    snap = cell.gradmon_read_history()
    assert snap.column("loss_scale").tolist() == [2.0**10, 2.0**10]
    assert snap.column("skipped").tolist() == [0.0, 1.0]


# ---------------------------------------------------------------------- options


def test_grad_accum_steps_is_validated():
    net = _net()
    for bad in (0, -2, 2.5, "4", True):
        with pytest.raises(ValueError, match="grad_accum_steps"):
            MonitoredTrainStep(with_loss(net), nn.SGD(net.trainable_params(), LR), grad_accum_steps=bad)
    with pytest.raises(ValueError, match="return_grad"):
        MonitoredTrainStep(with_loss(net), nn.SGD(net.trainable_params(), LR), return_grad=True,
                           grad_accum_steps=2)
    cell = MonitoredTrainStep(with_loss(net), nn.SGD(net.trainable_params(), LR),
                              grad_accum_steps=np.int64(4))
    assert cell.grad_accum_steps == 4 and cell.gradmon_config()["grad_accum_steps"] == 4
    # one accumulator the size of the gradients, not trained
    assert [a.shape for a in cell.accum_grads] == [w.shape for w in cell.weights]
    assert not any(a.requires_grad for a in cell.accum_grads)


# ---------------------------------------------------------------------- LiveMonitor


def test_live_monitor_logs_one_row_per_optimizer_step(tmp_path):
    from mindspore.dataset import GeneratorDataset
    from mindspore.train import Model

    from gradmon import LiveMonitor
    from tests.train_util import records

    old = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        net = _net()
        cell = MonitoredTrainStep(with_loss(net), nn.SGD(net.trainable_params(), LR), grad_accum_steps=4)
        batches = [_batch(i) for i in range(8)]
        data = GeneratorDataset([(x.asnumpy(), y.asnumpy()) for x, y in batches], column_names=["x", "y"],
                                shuffle=False)
        path = tmp_path / "m.jsonl"
        Model(cell).train(1, data, callbacks=[LiveMonitor(path, log_interval=1)])
        # Micro-batch losses at the weights each optimizer step started from (a twin network).
        twin = _net()
        steps = records(path, "step")
        header = records(path, "header")[0]
    finally:
        ms.set_context(mode=old)
    snap = cell.gradmon_read_history()
    assert [r["step"] for r in steps] == [1, 2] and snap.total_steps == 2
    assert header["steps_per_epoch"] == 2 and header["cell_config"]["grad_accum_steps"] == 4
    np.testing.assert_allclose([r["loss"] for r in steps], snap.column("loss"), rtol=1e-6)
    np.testing.assert_allclose([r["grad_norm"] for r in steps], snap.column("grad_norm"), rtol=1e-6)
    # The first row's loss is the mean over its four micro-batches, at the initial weights.
    first = [float(with_loss(twin)(*b).asnumpy()) for b in batches[:4]]
    assert abs(steps[0]["loss"] - sum(first) / 4) < 1e-6


def test_after_step_counts_optimizer_steps(tmp_path):
    from gradmon import LiveMonitor
    from tests.train_util import records

    net = _net()
    cell = MonitoredTrainStep(with_loss(net), nn.SGD(net.trainable_params(), LR), grad_accum_steps=3)
    monitor = LiveMonitor(tmp_path / "m.jsonl", log_interval=1).attach(cell)
    with monitor:
        for i in range(7):  # two optimizer steps and a third under way
            monitor.after_step(cell(*_batch(i)))
    steps = records(tmp_path / "m.jsonl", "step")
    assert [r["step"] for r in steps] == [1, 2]
    history = cell.gradmon_read_history()
    np.testing.assert_allclose([r["grad_norm"] for r in steps], history.column("grad_norm"), rtol=1e-6)


def test_forensics_and_recovery_refuse_accumulation(tmp_path):
    from gradmon import LiveMonitor

    net = _net()
    with pytest.raises(ValueError, match="grad_accum_steps"):
        MonitoredTrainStep(with_loss(net), nn.SGD(net.trainable_params(), LR), forensics=4,
                           grad_accum_steps=2)
    cell = MonitoredTrainStep(with_loss(net), nn.SGD(net.trainable_params(), LR), grad_accum_steps=2)
    monitor = LiveMonitor(tmp_path / "m.jsonl", recovery={"every": 5}).attach(cell)
    with pytest.raises(ValueError, match="grad_accum_steps"):
        monitor.after_step(cell(*_batch(0)))
