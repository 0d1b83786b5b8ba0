"""Helpers shared by the LiveMonitor tests (no tests here): tiny MLP training on synthetic data,
step cells with the host contract of ``MonitoredTrainStep``, and run-log readers."""

from __future__ import annotations

import collections
import json
import math
import types

import mindspore as ms
import numpy as np
from mindspore import dataset as ds
from mindspore import nn, ops
from mindspore.train import Callback

from examples.models import MLP, with_loss
from gradmon.logformat.reader import ReadStats, read_records

BATCH = 16
IN_DIM = 16


def use_graph_mode() -> None:
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)


def dataset(steps: int, nan_steps=(), seed: int = 0):
    """``steps`` batches of random (x, y); the batches of ``nan_steps`` (1-based) hold a NaN."""
    rng = np.random.default_rng(seed)
    x = rng.random((steps * BATCH, IN_DIM), dtype=np.float32)
    y = rng.integers(0, 10, steps * BATCH).astype(np.int32)
    for s in nan_steps:
        x[(s - 1) * BATCH, 0] = np.nan
    return ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(BATCH)


def mlp() -> nn.Cell:
    return MLP(in_dim=IN_DIM, hidden=32)


class MaskedLoss(nn.Cell):
    """The loss of the batch's labels that ``keep`` keeps (1: all, 0: none): a batch whose every
    label is masked has a loss of 0 and gradients all zero."""

    def __init__(self, net_with_loss: nn.Cell) -> None:
        super().__init__(auto_prefix=False)
        self.net_with_loss = net_with_loss

    def construct(self, x, y, keep):
        return self.net_with_loss(x, y) * keep


class NanAwareLoss(nn.Cell):
    """Cross-entropy plus ``0 * mean(x)``: a NaN input makes the loss NaN (ReLU would hide it)."""

    def __init__(self, net: nn.Cell) -> None:
        super().__init__(auto_prefix=False)
        self.inner = with_loss(net)

    def construct(self, x, y):
        return self.inner(x, y) + ops.reduce_mean(x) * 0.0


class NormStep(nn.Cell):
    """A train step returning ``(loss, grad_norm)`` that skips the update when the norm is not
    finite (GRAPH mode, real gradients): the shape of gradmon's MonitoredTrainStep outputs."""

    def __init__(self, net_with_loss: nn.Cell, optimizer: nn.Optimizer) -> None:
        super().__init__(auto_prefix=False)
        self.network = net_with_loss
        self.network.set_grad()
        self.optimizer = optimizer
        self.weights = optimizer.parameters
        self.grad = ops.GradOperation(get_by_list=True)

    def construct(self, *inputs):
        loss = self.network(*inputs)
        grads = self.grad(self.network, self.weights)(*inputs)
        norm = ops.sqrt(ops.addn([ops.reduce_sum(g * g) for g in grads]))
        if ops.isfinite(norm):
            self.optimizer(grads)
        return loss, norm


class HistoryStep(nn.Cell):
    """The host contract of ``MonitoredTrainStep`` (docs/design.md) around :class:`NormStep`,
    keeping the ring on the host as tensor references (never read until asked)."""

    def __init__(self, step: NormStep, history_size: int = 16) -> None:
        super().__init__(auto_prefix=False)
        self.step_cell = step
        self.optimizer = step.optimizer
        self.history_size = history_size
        self.ring: collections.deque = collections.deque(maxlen=history_size)
        self.total = 0
        self.reads = 0
        self.layer_calls = 0

    def __call__(self, *inputs):
        loss, norm = self.step_cell(*inputs)
        self.ring.append((loss, norm))
        self.total += 1
        return loss, norm

    def gradmon_config(self) -> dict:
        return {"max_norm": 1.5, "spike_mode": "detect", "history_size": self.history_size}

    def gradmon_read_history(self):
        self.reads += 1
        rows = []
        for loss, norm in self.ring:
            lv, nv = float(loss.asnumpy()), float(norm.asnumpy())
            bad = float(not (math.isfinite(lv) and math.isfinite(nv)))
            rows.append([lv, nv, 1.0, 0.0, bad, bad])
        fields = ("loss", "grad_norm", "clip_coef", "spike", "skipped", "nonfinite")
        return types.SimpleNamespace(total_steps=self.total, fields=fields,
                                     rows=np.array(rows, dtype=np.float64).reshape(-1, len(fields)),
                                     counters={})

    def gradmon_layer_stats(self, top_k: int = 10):
        self.layer_calls += 1
        return {"top": [{"name": "body.0.weight", "grad_norm": 1.0}][:top_k], "groups": {"body.*": 1.0}}


def monitored_step(net_with_loss, optimizer, history_size=16, **options):
    from gradmon.cells import MonitoredTrainStep

    return MonitoredTrainStep(net_with_loss, optimizer, history_size=history_size, **options)


def history_cell(kind: str, lr=0.05, history_size: int = 16):
    """``(step cell, net)``: ``kind`` ``"real"`` is a MonitoredTrainStep, ``"fake"`` a HistoryStep."""
    net = mlp()
    opt = nn.SGD(net.trainable_params(), learning_rate=lr)
    if kind == "real":
        return monitored_step(NanAwareLoss(net), opt, history_size), net
    return HistoryStep(NormStep(NanAwareLoss(net), opt), history_size), net


class CpuLossScaleStep(nn.TrainOneStepWithLossScaleCell):
    """MindSpore's loss-scale step (update skipped on overflow, returns ``(loss, overflow, scale)``)
    with an overflow check that has CPU kernels (its own uses Ascend/GPU status ops)."""

    def get_overflow_status(self, status, compute_output):
        finite = ops.stack([ops.isfinite(g).all() for g in compute_output]).all()
        return ops.logical_not(finite)


def strict_records(path) -> list[dict]:
    """Every line, parsed as strict JSON (a bare NaN/Infinity token fails the test)."""
    def reject(token):
        raise AssertionError(f"bare {token} in the log")

    with open(path, encoding="utf-8") as f:
        text = f.read()
    assert text.endswith("\n")
    return [json.loads(line, parse_constant=reject) for line in text.splitlines()]


def records(path, kind=None) -> list[dict]:
    """The log's records (of type ``kind``); the log must hold no malformed or partial line."""
    stats = ReadStats()
    out = [r for r in read_records(path, stats=stats) if kind is None or r["type"] == kind]
    assert stats.malformed == 0 and stats.partial_tail_bytes == 0
    return out


def segments(path) -> list[list[dict]]:
    """The log's records split at each header."""
    out: list[list[dict]] = []
    for r in records(path):
        if r["type"] == "header":
            out.append([])
        out[-1].append(r)
    return out


class AtStep(Callback):
    """Runs ``fn(step)`` at the end of every training step (placed before the monitor)."""

    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def on_train_step_end(self, run_context):
        self.fn(run_context.original_args().cur_step_num)


def params_of(net) -> dict[str, np.ndarray]:
    return {p.name: p.asnumpy().copy() for p in net.trainable_params()}
