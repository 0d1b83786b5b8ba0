"""The detector's learning-rate test (``SpikeConfig.lr_ratio``): the numpy reference's rule, and a real
``MonitoredTrainStep`` whose optimizer's rate is set x100 for one step (as ``benchmarks/alarms_train.py``
injects it), in GRAPH mode. (Kernel = op path = reference on rate series: test_cells_spike_kernel.py
and test_cells_zclip.py.)"""

from __future__ import annotations

import json
import math

import mindspore as ms
import numpy as np
import pytest
from gradmon.cells import MonitoredTrainStep, SpikeConfig
from gradmon.cells.zclip_reference import LrRule, ZClipState, lr_verdict, zclip_run
from mindspore import Tensor, nn, ops

from examples.models import MLP, with_loss
from gradmon import LiveMonitor
from tests import parity_util

graph_mode = parity_util.graph_mode  # the fixture

LR = 1e-3
FAULT_STEP = 30  # 1-based: the step whose rate is x100


def _flags(lrs: list[float], finite: list[bool] | None = None, rule: LrRule | None = None) -> list[int]:
    state, rule = ZClipState(), rule or LrRule()
    finite = [True] * len(lrs) if finite is None else finite
    return [i for i, (lr, ok) in enumerate(zip(lrs, finite)) if lr_verdict(state, lr, ok, rule)]


def test_reference_flags_a_x100_rate_once_and_never_a_ramp_or_a_restart():
    ramp = [LR * (i + 1) / 50 for i in range(50)]  # warm-up: x2, x1.5, ... per step
    cosine = [LR * (0.05 + 0.475 * (1 + math.cos(math.pi * i / 100))) for i in range(100)]
    schedule = ramp + cosine + ramp[::5] + cosine  # a warm restart (a faster ramp back to the peak)
    assert _flags(schedule) == []
    spiked = list(schedule)
    spiked[120] *= 100.0
    assert _flags(spiked) == [120]  # once: the largest rate is now that one
    assert _flags(spiked[:121] + [r * 100.0 for r in spiked[121:]]) == [120]  # a deliberate change: once
    # from the 5th finite rate > 0 on: NaN, inf, 0 and negative rates neither count nor move the top
    assert _flags([LR, LR, LR, 100 * LR]) == []
    assert _flags([LR, math.nan, 0.0, -LR, math.inf, LR, LR, 100 * LR]) == []
    assert _flags([LR, math.nan, 0.0, -LR, math.inf, LR, LR, LR, 100 * LR]) == [8]
    assert _flags([LR] * 6 + [10 * LR]) == []  # x10 is not more than 10x
    # a non-finite step is not flagged, but its rate becomes the top
    assert _flags([LR] * 6 + [100 * LR, 100 * LR], finite=[True] * 6 + [False, True]) == []
    assert _flags([LR] * 6 + [100 * LR], rule=LrRule(ratio=0.0)) == []  # off


def test_reference_lr_spike_is_not_a_norm_spike():
    """The norm tests and the EMA do not see the rate: the same verdicts with and without it."""
    norms = [1.0 + 0.01 * i for i in range(20)]
    lrs = [LR] * 20
    lrs[10] = 100 * LR
    with_lr, state = zclip_run(norms, warmup=8, alpha=0.9, z_threshold=3.0, lrs=lrs)
    without, _ = zclip_run(norms, warmup=8, alpha=0.9, z_threshold=3.0)
    assert [s.lr_spike for s in with_lr] == [i == 10 for i in range(20)]
    verdicts = [[(s.zscore, s.spike, s.target) for s in run] for run in (with_lr, without)]
    assert verdicts[0] == verdicts[1]
    assert state.lr_count == 20 and state.lr_top == np.float32(100 * LR)


def test_lr_ratio_validates():
    for bad in (1.0, 0.5, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="spike_lr_ratio"):
            SpikeConfig(lr_ratio=bad)
    assert SpikeConfig(lr_ratio=0).lr_rule() == () and SpikeConfig().lr_rule() == (4, 10.0)
    with pytest.raises(ValueError, match="spike_lr_min"):
        SpikeConfig(lr_min=0)


def _batch(i: int) -> tuple[Tensor, Tensor]:
    rng = np.random.default_rng(i)
    return Tensor(rng.random((8, 64)).astype(np.float32)), Tensor(rng.integers(0, 10, 8).astype(np.int32))


def _run(spike_mode: str, lr, steps: int, fault_step: int | None, log=None):
    """``steps`` steps of an MLP under Adam with ``lr``; the rate x100 at ``fault_step`` (through the
    optimizer's learning-rate Parameter, restored after). Returns the cell and the weights before and
    after the fault step."""
    ms.set_seed(0)
    net = MLP(hidden=24)
    opt = nn.Adam(net.trainable_params(), learning_rate=lr)
    step = MonitoredTrainStep(with_loss(net), opt, spike_mode=spike_mode)
    monitor = LiveMonitor(str(log), log_interval=16).attach(step) if log else None
    lr_param = getattr(opt.learning_rate, "learning_rate", opt.learning_rate)
    around = []
    for i in range(1, steps + 1):
        if i == fault_step:
            saved = lr_param.asnumpy().copy()
            ops.assign(lr_param, Tensor(saved * np.float32(100.0)))
            around.append([p.asnumpy().copy() for p in net.trainable_params()])
        out = step(*_batch(i))
        if monitor is not None:
            monitor.after_step(out[:2])
        if i == fault_step:
            ops.assign(lr_param, Tensor(saved))
            around.append([p.asnumpy().copy() for p in net.trainable_params()])
    if monitor is not None:
        monitor.close()
    return step, around


def test_a_x100_rate_is_skipped_and_nothing_else_is_flagged(graph_mode, tmp_path):
    log = tmp_path / "metrics.jsonl"
    step, (before, after) = _run("skip", LR, FAULT_STEP + 6, FAULT_STEP, log)
    assert all(np.array_equal(a, b) for a, b in zip(before, after))  # skipped: bit-identical
    snap = step.gradmon_read_history()
    assert np.flatnonzero(snap.column("spike")).tolist() == [FAULT_STEP - 1]
    assert snap.column("spike")[FAULT_STEP - 1] == 3.0  # the ring's code for the learning-rate test
    assert np.flatnonzero(snap.column("skipped")).tolist() == [FAULT_STEP - 1]
    assert snap.counters["spikes"] == 1 and snap.counters["skipped"] == 1
    assert step.spike_state.asnumpy()[-2:].tolist() == [FAULT_STEP + 6, np.float32(LR) * np.float32(100.0)]
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    flagged = [(r["step"], r.get("spike_reason"), r.get("skip_reason"))
               for r in lines if r.get("type") == "step" and r.get("spike")]
    assert flagged == [(FAULT_STEP, "lr", "spike")]
    events = [e for e in lines if e.get("kind") == "spike"]
    assert [(e["step"], e["spike_reason"]) for e in events] == [(FAULT_STEP, "lr")]
    assert events[0]["message"].startswith("learning-rate spike")


def test_clip_only_flags_a_x100_rate(graph_mode):
    """clip cannot bound an Adam step at lr x100 (its size does not follow the gradient's): flagged,
    not clipped, applied (and the step after it, whose gradient the bad update moved, is the norm or
    loss tests' to judge)."""
    step, (before, after) = _run("clip", LR, FAULT_STEP + 2, FAULT_STEP)
    assert not all(np.array_equal(a, b) for a, b in zip(before, after))
    snap = step.gradmon_read_history()
    spike = snap.column("spike")
    assert np.flatnonzero(spike[:FAULT_STEP]).tolist() == [FAULT_STEP - 1] and spike[FAULT_STEP - 1] == 3.0
    assert snap.column("clipped")[:FAULT_STEP].sum() == 0 and snap.column("clip_coef")[FAULT_STEP - 1] == 1.0


def test_warm_up_and_cosine_with_a_restart_flag_nothing(graph_mode):
    ramp = [LR * (i + 1) / 10 for i in range(10)]
    cosine = [LR * (0.1 + 0.45 * (1 + math.cos(math.pi * i / 20))) for i in range(20)]
    schedule = ramp + cosine + ramp[::2] + cosine  # a warm restart at step 31
    step, _ = _run("skip", schedule, len(schedule), None)
    snap = step.gradmon_read_history()
    assert snap.counters["spikes"] == 0 and snap.counters["skipped"] == 0
    assert step.spike_state.asnumpy()[-2:].tolist() == [len(schedule), np.float32(LR)]


def test_without_a_readable_rate_the_test_is_off(monkeypatch):
    import gradmon.cells.train_step as train_step

    monkeypatch.setattr(train_step, "has_learning_rate", lambda optimizer: False)
    net = MLP(hidden=8)
    step = MonitoredTrainStep(with_loss(net), nn.Adam(net.trainable_params(), LR), spike_mode="skip")
    assert step.spike.lr_ratio == 0.0 and not step.spike_lr
    assert step.spike_state.shape == (38,)  # [count, mean, var, scale, ring 16, loss part 18]: no lr part
    step(*_batch(1))
