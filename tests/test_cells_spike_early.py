"""The detector's early rule in the real step cell (issue 22): a x1000 batch in the first ten steps,
long before the EMA's 50-step warm-up ends, is clipped or skipped, in GRAPH and PYNATIVE, and the
cell's flags and z-scores are the numpy reference's."""

from __future__ import annotations

import numpy as np
from gradmon.cells import MonitoredTrainStep, SpikeConfig
from gradmon.cells.zclip_reference import zclip_run
from mindspore import Tensor, nn
from train_util import MaskedLoss

from examples.models import MLP, with_loss
from tests import parity_util

mode = parity_util.mode  # the GRAPH / PYNATIVE fixture

FAULT_STEP = 8  # <= 10: inside the EMA's warm-up (default spike_warmup=100)
LR = 0.01


def _batch(seed: int, scale: float = 1.0) -> tuple[Tensor, Tensor]:
    rng = np.random.default_rng(seed)
    x = (rng.random((8, 64)) * scale).astype(np.float32)
    return Tensor(x), Tensor(rng.integers(0, 10, 8).astype(np.int32))


def _weights(net: nn.Cell) -> list[np.ndarray]:
    return [p.asnumpy().astype(np.float64) for p in net.trainable_params()]


def _early_fault(spike_mode: str):
    """Default detector settings; steps 1..7 normal, step 8 with inputs x1000. Returns the cell,
    the fault step's raw norm and the norm of the update it applied (plain SGD: delta / lr)."""
    import mindspore as ms

    ms.set_seed(0)
    net = MLP(hidden=24)
    step = MonitoredTrainStep(with_loss(net), nn.SGD(net.trainable_params(), LR), spike_mode=spike_mode)
    for seed in range(FAULT_STEP - 1):
        step(*_batch(seed))
    before = _weights(net)
    _, norm = step(*_batch(99, scale=1000.0))
    delta = np.sqrt(sum(((a - b) ** 2).sum() for a, b in zip(_weights(net), before)))
    return step, float(norm.asnumpy()), float(delta) / LR


def _check_against_reference(step: MonitoredTrainStep) -> np.ndarray:
    snap = step.gradmon_read_history()
    norms = snap.column("grad_norm").tolist()
    config = step.options.spike
    ref, _ = zclip_run(norms, warmup=config.warmup, alpha=config.alpha, z_threshold=config.z_threshold,
                       early=config.reference_rule())
    assert snap.column("spike").tolist() == [float(s.spike) for s in ref] == [0.0] * (FAULT_STEP - 1) + [1.0]
    np.testing.assert_allclose(snap.column("zscore"), [s.zscore for s in ref], rtol=1e-3, atol=1e-4)
    return np.asarray(norms)


def test_early_fault_is_clipped(mode):
    step, norm, applied = _early_fault("clip")
    norms = _check_against_reference(step)
    median = float(np.median(norms[:-1]))
    assert norm > 100 * median  # the fault really is a x100+ norm
    # the applied update is bounded: below early_max_ratio x the recent median (not the raw x1000 norm)
    assert applied < SpikeConfig().early_max_ratio * median
    snap = step.gradmon_read_history()
    assert snap.column("clipped")[-1] == 1.0 and snap.counters["spikes"] == 1
    np.testing.assert_allclose(applied, norm * snap.column("clip_coef")[-1], rtol=1e-3)


def test_early_fault_is_skipped(mode):
    step, _, applied = _early_fault("skip")
    _check_against_reference(step)
    assert applied == 0.0  # weights unchanged
    snap = step.gradmon_read_history()
    assert snap.column("skipped").tolist() == [0.0] * (FAULT_STEP - 1) + [1.0]


def test_early_rule_off_lets_the_early_fault_through(mode):
    # spike_early_window=0 (and no loss or learning-rate test) is the old detector: undefended during the
    # warm-up (what issue 22 measured).
    import mindspore as ms

    ms.set_seed(0)
    net = MLP(hidden=24)
    step = MonitoredTrainStep(with_loss(net), nn.SGD(net.trainable_params(), LR), spike_mode="skip",
                              spike_early_window=0, spike_loss_window=0, spike_lr_ratio=0)
    for seed in range(FAULT_STEP - 1):
        step(*_batch(seed))
    step(*_batch(99, scale=1000.0))
    snap = step.gradmon_read_history()
    assert snap.column("spike").sum() == 0 and snap.column("skipped").sum() == 0
    assert step.spike_state.shape == (3,)


def test_masked_batches_at_the_start_are_not_learnt(mode):
    # Five zero norms learnt at a run's start put the early ring's median at log(1e-30): every later
    # norm was then an early spike clipped to ~1e-30, and after the warm-up a ZClip spike, for good;
    # their zero losses made the first real losses loss spikes.
    import mindspore as ms

    zeros, steps = 6, 20
    ms.set_seed(0)
    net = MLP(hidden=24)
    step = MonitoredTrainStep(MaskedLoss(with_loss(net)), nn.SGD(net.trainable_params(), LR),
                              spike_mode="clip")
    applied = []
    for seed in range(steps):
        before = _weights(net)
        x, y = _batch(seed)
        step(x, y, Tensor(np.float32(0.0 if seed < zeros else 1.0)))
        applied.append(np.sqrt(sum(((a - b) ** 2).sum() for a, b in zip(_weights(net), before))) / LR)
    snap = step.gradmon_read_history()
    norms = snap.column("grad_norm")
    assert norms[:zeros].tolist() == [0.0] * zeros and (norms[zeros:] > 0.1).all()
    assert snap.column("loss")[:zeros].tolist() == [0.0] * zeros
    config = step.options.spike
    ref, state = zclip_run(norms.tolist(), warmup=config.warmup, alpha=config.alpha,
                           z_threshold=config.z_threshold, early=config.reference_rule(),
                           losses=snap.column("loss").tolist(), loss_rule=config.reference_loss_rule())
    assert snap.column("spike").tolist() == [float(s.spike) for s in ref] == [0.0] * steps
    assert state.count == steps - zeros
    assert snap.column("clipped").sum() == 0.0
    # every step after the zeros applied its whole gradient (plain SGD: the update is lr x the norm)
    np.testing.assert_allclose(applied[zeros:], norms[zeros:], rtol=1e-3)
