"""LiveMonitor under real MindSpore training (small MLP, synthetic data, a few steps)."""

from __future__ import annotations

import collections
import json
import math
import os
import time
import types
import warnings

import mindspore as ms
import numpy as np
import pytest
from mindspore import dataset as ds
from mindspore import nn, ops
from mindspore.train import Callback, Model

from examples.models import MLP, with_loss
from gradmon.callback import LiveMonitor, rank_log_path
from gradmon.runlog import ReadStats, read_records

BATCH = 16
IN_DIM = 16


@pytest.fixture(autouse=True)
def graph_mode():
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)


# -- helpers ------------------------------------------------------------------------------------


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


def real_monitored_step(net_with_loss, optimizer, history_size=16):
    cells = pytest.importorskip("gradmon.cells")
    cls = getattr(cells, "MonitoredTrainStep", None)
    if cls is None:
        cls = getattr(pytest.importorskip("gradmon.cells.train_step"), "MonitoredTrainStep", None)
    if cls is None:
        pytest.skip("gradmon.cells.MonitoredTrainStep not built yet")
    return cls(net_with_loss, optimizer, history_size=history_size)


def history_cell(kind: str, lr=0.05, history_size: int = 16):
    net = mlp()
    opt = nn.SGD(net.trainable_params(), learning_rate=lr)
    if kind == "real":
        return real_monitored_step(NanAwareLoss(net), opt, history_size), net
    return HistoryStep(NormStep(NanAwareLoss(net), opt), history_size), net


def strict_records(path) -> list[dict]:
    def reject(token):
        raise AssertionError(f"bare {token} in the log")

    with open(path, encoding="utf-8") as f:
        text = f.read()
    assert text.endswith("\n")
    return [json.loads(line, parse_constant=reject) for line in text.splitlines()]


def records(path, kind=None) -> list[dict]:
    stats = ReadStats()
    out = [r for r in read_records(path, stats=stats) if kind is None or r["type"] == kind]
    assert stats.malformed == 0 and stats.partial_tail_bytes == 0
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


# -- tests --------------------------------------------------------------------------------------


def test_nan_step_lines_are_strict_json(tmp_path):
    path = tmp_path / "run" / "metrics.jsonl"
    net = mlp()
    cell = NormStep(NanAwareLoss(net), nn.SGD(net.trainable_params(), learning_rate=0.05))
    with LiveMonitor(path, config={"lr": 0.05, "note": float("nan")}) as monitor:
        Model(cell).train(1, dataset(5, nan_steps=[3]), callbacks=[monitor])
    lines = strict_records(path)  # raises on any bare NaN/Infinity token
    assert lines[0]["type"] == "header" and lines[0]["config"] == {"lr": 0.05, "note": "NaN"}
    steps = {r["step"]: r for r in lines if r["type"] == "step"}
    assert sorted(steps) == [1, 2, 3, 4, 5]
    assert steps[3]["loss"] == "NaN" and steps[3]["grad_norm"] in ("NaN", "Infinity")
    assert steps[3]["nonfinite"] is True
    assert all(isinstance(steps[s]["loss"], float) for s in (1, 2, 4, 5))  # update skipped, run recovered
    assert [r["step"] for r in lines if r["type"] == "event" and r["kind"] == "nonfinite"] == [3]
    assert lines[-1]["type"] == "end" and lines[-1]["status"] == "finished" and lines[-1]["steps"] == 5


def test_header_fields_steps_and_restart_appends(tmp_path):
    path = tmp_path / "metrics.jsonl"
    cell, _ = history_cell("fake")
    for _ in range(2):  # a restarted run: a new monitor on the same file
        monitor = LiveMonitor(path, config={"seed": 0})
        Model(cell).train(1, dataset(4), callbacks=[monitor])
    recs = records(path)
    headers = [i for i, r in enumerate(recs) if r["type"] == "header"]
    assert len(headers) == 2 and headers[0] == 0
    h = recs[0]
    assert h["mode"] == "GRAPH" and h["device"] == "CPU" and (h["world_size"], h["rank"]) == (1, 0)
    assert h["versions"]["mindspore"] == ms.__version__ and h["log_interval"] == 1
    assert (h["max_norm"], h["spike_mode"]) == (1.5, "detect")  # from cell.gradmon_config()
    assert h["batch_size"] == BATCH and h["config"] == {"seed": 0}
    for seg in (recs[: headers[1]], recs[headers[1]:]):
        steps = [r["step"] for r in seg if r["type"] == "step"]
        assert steps == [1, 2, 3, 4]
        assert seg[-1]["type"] == "end"
        for r in seg:
            if r["type"] == "step":
                assert r["throughput"] > 0 and r["step_time"] > 0 and r["data_time"] >= 0 and r["epoch"] == 1


@pytest.mark.parametrize("interval", [1, 3])
def test_dynamic_lr_logged_equals_schedule(tmp_path, interval):
    steps = 7
    table = nn.piecewise_constant_lr([2, 5, 100], [0.1, 0.05, 0.01])
    cosine = nn.CosineDecayLR(min_lr=0.001, max_lr=0.1, decay_steps=6)
    # CosineDecayLR's documented formula, step k (from 1) uses global_step k - 1.
    expected_cos = [0.001 + 0.5 * 0.099 * (1 + math.cos(math.pi * min(k, 6) / 6)) for k in range(steps)]
    for lr, expected in ((table, table[:steps]), (cosine, expected_cos)):
        path = tmp_path / f"{type(lr).__name__}-{interval}.jsonl"
        net = mlp()
        cell = HistoryStep(NormStep(NanAwareLoss(net), nn.SGD(net.trainable_params(), learning_rate=lr)))
        Model(cell).train(1, dataset(steps), callbacks=[LiveMonitor(path, log_interval=interval)])
        logged = [(r["step"], r["lr"]) for r in records(path, "step")]
        assert [s for s, _ in logged] == list(range(1, steps + 1))
        assert [v for _, v in logged] == pytest.approx(expected, rel=1e-5)


def test_plain_cell_logs_every_nth_step_history_cell_logs_every_step(tmp_path):
    net = mlp()
    plain = nn.TrainOneStepCell(NanAwareLoss(net), nn.SGD(net.trainable_params(), learning_rate=0.05))
    Model(plain).train(1, dataset(10), callbacks=[LiveMonitor(tmp_path / "plain.jsonl", log_interval=4)])
    plain_steps = records(tmp_path / "plain.jsonl", "step")
    assert [r["step"] for r in plain_steps] == [4, 8, 10]  # the last partial interval is flushed at the end
    assert all("grad_norm" not in r and isinstance(r["loss"], float) for r in plain_steps)
    assert plain_steps[0]["step_time"] > 0

    cell, _ = history_cell("fake")
    Model(cell).train(1, dataset(10), callbacks=[LiveMonitor(tmp_path / "hist.jsonl", log_interval=4)])
    hist = records(tmp_path / "hist.jsonl", "step")
    assert [r["step"] for r in hist] == list(range(1, 11))
    assert all(isinstance(r["grad_norm"], float) and r["clip_coef"] == 1.0 for r in hist)
    assert cell.reads == 3  # one device read per interval: steps 4, 8 and the end


def test_real_monitored_train_step_every_step(tmp_path):
    cell, _ = history_cell("real", history_size=8)
    path = tmp_path / "metrics.jsonl"
    Model(cell).train(1, dataset(10, nan_steps=[6]), callbacks=[LiveMonitor(path, log_interval=4)])
    recs = records(path)
    steps = [r for r in recs if r["type"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, 11))
    assert all(isinstance(r["grad_norm"], float) for r in steps)
    bad = [r for r in steps if r.get("nonfinite")]
    assert [r["step"] for r in bad] == [6] and bad[0].get("skipped") is True
    assert any(r["type"] == "event" and r["kind"] == "nonfinite" and r["step"] == 6 for r in recs)


def test_history_overflow_event(tmp_path):
    cell, _ = history_cell("fake", history_size=2)
    path = tmp_path / "metrics.jsonl"
    Model(cell).train(1, dataset(8), callbacks=[LiveMonitor(path, log_interval=4)])
    recs = records(path)
    assert [r["step"] for r in recs if r["type"] == "step"] == [3, 4, 7, 8]
    overflow = [r for r in recs if r["type"] == "event" and r["kind"] == "history_overflow"]
    assert [(r["step"], r["count"]) for r in overflow] == [(1, 2), (5, 2)]


class Poison:
    """Step outputs that fail on any read: proves the monitor leaves them alone."""

    def __init__(self) -> None:
        self.armed = True

    def __getattr__(self, name):
        if self.__dict__.get("armed", True):
            raise AssertionError(f"step outputs read on a non-log step ({name})")
        return getattr(np.float32(1.5), name)

    def __float__(self):
        if self.armed:
            raise AssertionError("step outputs read on a non-log step (float)")
        return 1.5


def test_no_reads_on_non_log_steps_direct(tmp_path):
    from mindspore.train.callback._callback import InternalCallbackParam, RunContext

    cb = InternalCallbackParam()
    cb.cur_step_num, cb.cur_epoch_num, cb.batch_num = 0, 1, 100
    cb.train_network, cb.optimizer, cb.train_dataset = None, None, None
    run_context = RunContext(cb)
    monitor = LiveMonitor(tmp_path / "m.jsonl", log_interval=5)
    monitor.on_train_begin(run_context)
    for step in range(1, 11):
        outputs = Poison()
        outputs.armed = step % 5 != 0  # readable on log steps only
        cb.cur_step_num, cb.net_outputs = step, outputs
        monitor.on_train_step_begin(run_context)
        monitor.on_train_step_end(run_context)
    monitor.on_train_end(run_context)
    assert [(r["step"], r["loss"]) for r in records(tmp_path / "m.jsonl", "step")] == [(5, 1.5), (10, 1.5)]


def test_no_tensor_reads_on_non_log_steps_in_model_train(tmp_path, monkeypatch):
    """Count every way a Tensor reaches the host while the monitor's hooks run."""
    reads = {"n": 0}
    for name in ("asnumpy", "item", "tolist", "__float__", "__int__", "__bool__", "__array__", "__index__"):
        original = getattr(ms.Tensor, name, None)
        if original is None:
            continue

        def counting(self, *a, _orig=original, **k):
            reads["n"] += 1
            return _orig(self, *a, **k)

        monkeypatch.setattr(ms.Tensor, name, counting)

    per_step: dict[int, int] = {}

    class Counted(LiveMonitor):
        def on_train_step_begin(self, run_context):
            before = reads["n"]
            super().on_train_step_begin(run_context)
            self._begin_reads = reads["n"] - before

        def on_train_step_end(self, run_context):
            before = reads["n"]
            super().on_train_step_end(run_context)
            per_step[run_context.original_args().cur_step_num] = reads["n"] - before + self._begin_reads

    for kind in ("plain", "history", "real"):
        per_step.clear()
        net = mlp()
        opt = nn.SGD(net.trainable_params(), learning_rate=nn.piecewise_constant_lr([3, 100], [0.1, 0.01]))
        if kind == "plain":
            cell = nn.TrainOneStepCell(NanAwareLoss(net), opt)
        elif kind == "history":
            cell = HistoryStep(NormStep(NanAwareLoss(net), opt))
        else:
            cell = real_monitored_step(NanAwareLoss(net), opt)
        Model(cell).train(1, dataset(9), callbacks=[Counted(tmp_path / f"{kind}.jsonl", log_interval=3)])
        assert per_step[3] > 0 and per_step[6] > 0  # the counter does see reads on log steps
        assert {s: n for s, n in per_step.items() if s % 3} == {s: 0 for s in range(1, 10) if s % 3}


def test_io_failure_training_completes_warns_once_and_resumes(tmp_path):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    run = tmp_path / "run"
    run.mkdir()
    path = run / "metrics.jsonl"
    os.symlink("/dev/full", path)  # disk full: every write fails with ENOSPC

    def make_writable(step):
        if step == 5:
            os.unlink(path)

    cell, _ = history_cell("fake")
    monitor = LiveMonitor(path, retry_initial=0.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Model(cell).train(1, dataset(8), callbacks=[AtStep(make_writable), monitor])
    ours = [w for w in caught if "gradmon" in str(w.message)]
    assert len(ours) == 1 and "No space left" in str(ours[0].message)
    assert cell.total == 8  # training completed
    assert monitor.dropped_records == 5  # header + steps 1-4
    recs = records(path)
    assert recs[0]["type"] == "event" and recs[0]["kind"] == "io_error" and recs[0]["dropped"] == 5
    assert [r["step"] for r in recs if r["type"] == "step"] == [5, 6, 7, 8]
    assert recs[-1]["type"] == "end" and recs[-1]["dropped_records"] == 5


def test_unwritable_directory_training_completes(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory")
    cell, _ = history_cell("fake")
    monitor = LiveMonitor(blocker / "run" / "metrics.jsonl")
    with pytest.warns(RuntimeWarning, match="gradmon"):
        Model(cell).train(1, dataset(4), callbacks=[monitor])
    assert cell.total == 4 and monitor.dropped_records == 6  # header, 4 steps, end


@pytest.mark.parametrize("kind", ["fake", "real"])
def test_abort_after_consecutive_bad_steps_saves_last_good_weights(tmp_path, kind):
    cell, net = history_cell(kind)
    snapshot = {}

    def remember(step):
        if step == 2:
            snapshot.update(params_of(net))

    ckpt = tmp_path / "ckpt" / "abort.ckpt"
    path = tmp_path / "metrics.jsonl"
    executed = []
    monitor = LiveMonitor(path, abort_after=3, abort_checkpoint=ckpt)
    Model(cell).train(1, dataset(10, nan_steps=[3, 4, 5, 6, 7]),
                      callbacks=[AtStep(remember), AtStep(executed.append), monitor])
    assert executed == [1, 2, 3, 4, 5]  # stopped right after the 3rd bad step
    recs = records(path)
    abort = [r for r in recs if r["type"] == "event" and r["kind"] == "abort"]
    assert len(abort) == 1 and abort[0]["step"] == 5 and abort[0]["consecutive"] == 3
    assert abort[0]["checkpoint"] == str(ckpt) and "abort_after=3" in abort[0]["message"]
    assert recs[-1]["type"] == "end" and recs[-1]["status"] == "aborted" and recs[-1]["steps"] == 5
    saved = ms.load_checkpoint(str(ckpt))
    for name, value in snapshot.items():
        np.testing.assert_array_equal(saved[name].asnumpy(), value)
    assert monitor.should_stop


def test_abort_inside_one_history_read_is_placed_at_the_step_that_reached_the_limit(tmp_path):
    # log_interval=10: steps 3..9 are all bad and are read back in one go at step 10.
    cell, _ = history_cell("real")
    path = tmp_path / "metrics.jsonl"
    Model(cell).train(1, dataset(12, nan_steps=list(range(3, 10))),
                      callbacks=[LiveMonitor(path, log_interval=10, abort_after=3)])
    recs = records(path)
    abort = [r for r in recs if r["type"] == "event" and r["kind"] == "abort"]
    assert len(abort) == 1 and abort[0]["step"] == 5 and abort[0]["consecutive"] == 3
    # The abort event follows step 5's record and events, before step 6's record.
    i = recs.index(abort[0])
    assert [r["step"] for r in recs[:i] if r["type"] == "step"][-1] == 5
    assert next(r["step"] for r in recs[i:] if r["type"] == "step") == 6
    assert recs[-1]["type"] == "end" and recs[-1]["status"] == "aborted"


def test_abort_with_a_cell_that_does_not_skip_saves_no_nan_checkpoint(tmp_path):
    net = mlp()
    plain = nn.TrainOneStepCell(NanAwareLoss(net), nn.SGD(net.trainable_params(), learning_rate=0.05))
    ckpt = tmp_path / "abort.ckpt"
    monitor = LiveMonitor(tmp_path / "m.jsonl", abort_after=2, abort_checkpoint=ckpt)
    Model(plain).train(1, dataset(8, nan_steps=[3, 4]), callbacks=[monitor])
    abort = [r for r in records(tmp_path / "m.jsonl") if r.get("kind") == "abort"]
    assert abort[0]["step"] == 4 and "NOT saved" in abort[0]["message"] and "checkpoint" not in abort[0]
    assert not ckpt.exists()


def test_exception_in_training_writes_failed_end(tmp_path):
    def boom(step):
        if step == 3:
            raise RuntimeError("boom")

    cell, _ = history_cell("fake")
    path = tmp_path / "metrics.jsonl"
    with pytest.raises(RuntimeError, match="boom"):
        Model(cell).train(1, dataset(6), callbacks=[LiveMonitor(path, log_interval=2), AtStep(boom)])
    recs = records(path)
    assert [r["step"] for r in recs if r["type"] == "step"] == [1, 2, 3]
    assert recs[-1]["type"] == "end" and recs[-1]["status"] == "failed"


def test_fit_with_valid_dataset_writes_eval_records(tmp_path):
    net = mlp()
    model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                  nn.SGD(net.trainable_params(), learning_rate=0.05), metrics={"accuracy"})
    path = tmp_path / "metrics.jsonl"
    model.fit(2, dataset(4), dataset(2, seed=1), valid_frequency=1,
              callbacks=[LiveMonitor(path, log_interval=3)], valid_dataset_sink_mode=False)
    recs = records(path)
    evals = [r for r in recs if r["type"] == "eval"]
    assert [(r["step"], r["epoch"]) for r in evals] == [(4, 1), (8, 2)]
    for r in evals:
        assert 0.0 <= r["accuracy"] <= 1.0 and isinstance(r["loss"], float) and r["loss"] > 0
    # Each eval follows the training steps it evaluates.
    order = [(r["type"], r.get("step")) for r in recs if r["type"] in ("step", "eval")]
    assert order == [("step", 3), ("step", 4), ("eval", 4), ("step", 6), ("step", 8), ("eval", 8)]


def test_eval_loss_is_the_mean_over_all_eval_batches(tmp_path):
    # MindSpore's own "eval_loss" (Model.fit, 2.7-2.10) is the last eval batch's loss only.
    net = mlp()
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    model = Model(net, loss_fn, nn.SGD(net.trainable_params(), learning_rate=0.05), metrics={"accuracy"})
    path = tmp_path / "metrics.jsonl"
    model.fit(1, dataset(4), dataset(3, seed=1), valid_frequency=1, callbacks=[LiveMonitor(path)],
              valid_dataset_sink_mode=False)
    (last,) = [r for r in records(path) if r["type"] == "eval"]
    with_loss = nn.WithLossCell(net, loss_fn)
    batch_losses = [float(with_loss(b["x"], b["y"]).asnumpy())
                    for b in dataset(3, seed=1).create_dict_iterator()]
    assert "eval_loss" not in last
    np.testing.assert_allclose(last["loss"], np.mean(batch_losses), rtol=1e-5)
    assert abs(last["loss"] - batch_losses[-1]) > 1e-4


def test_mindspore_loss_and_time_monitors_keep_working_beside_it(tmp_path, capsys):
    # MonitoredTrainStep returns (loss, grad_norm), loss first, for exactly these callbacks.
    from mindspore.train import LossMonitor, TimeMonitor

    cell, _ = history_cell("real")
    path = tmp_path / "metrics.jsonl"
    Model(cell).train(1, dataset(4), callbacks=[LossMonitor(1), TimeMonitor(), LiveMonitor(path)],
                      dataset_sink_mode=False)
    printed = [float(line.rsplit("loss is ", 1)[1]) for line in capsys.readouterr().out.splitlines()
               if "loss is " in line]
    logged = [r["loss"] for r in records(path, "step")]
    assert len(logged) == 4
    np.testing.assert_allclose(printed, logged, rtol=1e-6)


def test_log_in_a_custom_loop(tmp_path):
    net = mlp()
    loss_net = NanAwareLoss(net)
    opt = nn.SGD(net.trainable_params(), learning_rate=0.05)
    grad_fn = ms.value_and_grad(loss_net, None, opt.parameters)
    path = tmp_path / "metrics.jsonl"
    with LiveMonitor(path, config={"loop": "custom"}) as monitor:
        for step, (x, y) in enumerate(dataset(4).create_tuple_iterator(), start=1):
            loss, grads = grad_fn(x, y)
            opt(grads)
            monitor.log(step, loss=loss, grad_norm=ops.sqrt(ops.addn([ops.reduce_sum(g * g) for g in grads])),
                        my_metric=step * 2)
        monitor.log_eval(accuracy=0.5, loss=1.25)
    recs = records(path)
    assert [r["type"] for r in recs] == ["header"] + ["step"] * 4 + ["eval", "end"]
    assert recs[0]["config"] == {"loop": "custom"}
    assert all(isinstance(r["loss"], float) and r["grad_norm"] > 0 for r in recs[1:5])
    assert [r["my_metric"] for r in recs[1:5]] == [2.0, 4.0, 6.0, 8.0]
    assert recs[5] == {**recs[5], "step": 4, "accuracy": 0.5, "loss": 1.25}
    assert recs[6]["steps"] == 4


def test_attach_and_after_step_in_a_custom_loop(tmp_path):
    cell, _ = history_cell("fake")
    path = tmp_path / "metrics.jsonl"
    monitor = LiveMonitor(path, log_interval=3).attach(cell)
    for x, y in dataset(7).create_tuple_iterator():
        monitor.after_step(cell(x, y))
    monitor.close()
    assert [r["step"] for r in records(path, "step")] == list(range(1, 8))
    assert cell.reads == 3 and records(path, "header")[0]["spike_mode"] == "detect"


def test_layer_stats_and_system_metrics(tmp_path):
    cell, _ = history_cell("fake")
    path = tmp_path / "metrics.jsonl"

    def wait_for_system_record(step):
        if step != 1:
            return
        deadline = time.monotonic() + 20
        while not any(r["type"] == "system" for r in read_records(path)):
            assert time.monotonic() < deadline, "no system record within 20 s"
            time.sleep(0.02)

    monitor = LiveMonitor(path, layer_stats_every=3, system_metrics=True, system_interval=0.05)
    Model(cell).train(1, dataset(7), callbacks=[monitor, AtStep(wait_for_system_record)])
    recs = records(path)
    layers = [r for r in recs if r["type"] == "layers"]
    assert [r["step"] for r in layers] == [3, 6] and layers[0]["groups"] == {"body.*": 1.0}
    system = [r for r in recs if r["type"] == "system"]
    assert system and system[0]["rss_bytes"] > 0 and 0 <= system[0]["cpu_percent"] <= 100
    assert "device_mem_bytes" not in system[0]  # CPU: no device memory
    assert recs[-1]["type"] == "end"  # the sampler stops before the end record


def test_rank_log_path():
    assert rank_log_path("logs/a/metrics.jsonl", 1) == "logs/a/metrics.rank1.jsonl"
    assert rank_log_path("m", 0) == "m.rank0.jsonl"


def test_invalid_arguments(tmp_path):
    with pytest.raises(ValueError):
        LiveMonitor(tmp_path / "m.jsonl", log_interval=0)
    with pytest.raises(ValueError):
        LiveMonitor(tmp_path / "m.jsonl", abort_after=0)


class CpuLossScaleStep(nn.TrainOneStepWithLossScaleCell):
    """MindSpore's loss-scale step (update skipped on overflow, returns ``(loss, overflow, scale)``)
    with an overflow check that has CPU kernels (its own uses Ascend/GPU status ops)."""

    def get_overflow_status(self, status, compute_output):
        finite = ops.stack([ops.isfinite(g).all() for g in compute_output]).all()
        return ops.logical_not(finite)


def test_mindspore_loss_scale_cell_overflow_is_a_skipped_step(tmp_path):
    net = mlp()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.05)
    manager = nn.DynamicLossScaleUpdateCell(loss_scale_value=2.0**12, scale_factor=2, scale_window=1000)
    cell = CpuLossScaleStep(NanAwareLoss(net), opt, scale_sense=manager)
    path = tmp_path / "metrics.jsonl"
    Model(cell).train(1, dataset(5, nan_steps=[3]), callbacks=[LiveMonitor(path)])
    recs = records(path)
    steps = {r["step"]: r for r in recs if r["type"] == "step"}
    assert steps[2]["loss_scale"] == 2.0**12 and "skipped" not in steps[2]
    assert steps[3]["skipped"] is True and steps[3]["nonfinite"] is True  # the NaN batch overflowed
    assert steps[4]["loss_scale"] == 2.0**11 and "skipped" not in steps[4]  # scale halved, training goes on
    assert [r["kind"] for r in recs if r["type"] == "event"] == ["nonfinite"]


def test_pynative_mode(tmp_path):
    ms.set_context(mode=ms.PYNATIVE_MODE)
    cell, _ = history_cell("fake")
    path = tmp_path / "metrics.jsonl"
    Model(cell).train(1, dataset(4), callbacks=[LiveMonitor(path, log_interval=2)])
    recs = records(path)
    assert recs[0]["mode"] == "PYNATIVE"
    assert [r["step"] for r in recs if r["type"] == "step"] == [1, 2, 3, 4]


def test_per_rank_single_process_writes_both_files(tmp_path):
    path = tmp_path / "metrics.jsonl"
    cell, _ = history_cell("fake")
    Model(cell).train(1, dataset(3), callbacks=[LiveMonitor(path, per_rank=True)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl", "metrics.rank0.jsonl"]
    for p in (path, tmp_path / "metrics.rank0.jsonl"):
        assert [r["step"] for r in records(p, "step")] == [1, 2, 3]


def test_failing_history_read_falls_back_to_outputs(tmp_path, caplog):
    class Broken(HistoryStep):
        def gradmon_read_history(self):
            self.reads += 1
            raise RuntimeError("device ring unreadable")

    net = mlp()
    cell = Broken(NormStep(NanAwareLoss(net), nn.SGD(net.trainable_params(), learning_rate=0.05)))
    path = tmp_path / "metrics.jsonl"
    Model(cell).train(1, dataset(6), callbacks=[LiveMonitor(path, log_interval=2)])
    steps = records(path, "step")
    assert [r["step"] for r in steps] == [2, 4, 6] and all(r["grad_norm"] > 0 for r in steps)
    assert cell.reads == 1 and sum("history failed" in r.message for r in caplog.records) == 1


def test_non_writing_rank_reads_only_for_the_abort_policy(tmp_path, monkeypatch):
    import gradmon.callback as callback_module

    monkeypatch.setattr(callback_module, "_distributed", lambda: (1, 2))  # rank 1 of 2
    cell, _ = history_cell("fake")
    Model(cell).train(1, dataset(4), callbacks=[LiveMonitor(tmp_path / "m.jsonl", log_interval=2)])
    assert cell.reads == 0 and not any(tmp_path.iterdir())

    cell, _ = history_cell("fake")
    executed = []
    monitor = LiveMonitor(tmp_path / "m.jsonl", abort_after=2, abort_checkpoint=tmp_path / "a.ckpt")
    Model(cell).train(1, dataset(6, nan_steps=[2, 3, 4]), callbacks=[AtStep(executed.append), monitor])
    assert executed == [1, 2, 3] and monitor.should_stop  # stops with rank 0
    assert not any(tmp_path.iterdir())  # writes nothing, saves nothing (rank 0 saves)


@pytest.mark.parametrize("kind", ["fake", "real"])
def test_dynamic_lr_after_a_skipped_step(tmp_path, kind):
    # A skipped step does not run the optimizer, so the schedule does not advance for it.
    table = [0.1, 0.09, 0.08, 0.07, 0.06, 0.05, 0.04]
    cell, _ = history_cell(kind, lr=table)
    path = tmp_path / "metrics.jsonl"
    Model(cell).train(1, dataset(6, nan_steps=[3]), callbacks=[LiveMonitor(path, log_interval=3)])
    steps = records(path, "step")
    assert [r.get("skipped", False) for r in steps] == [False, False, True, False, False, False]
    assert [r["lr"] for r in steps] == pytest.approx([0.1, 0.09, 0.08, 0.08, 0.07, 0.06])


def test_real_cell_clip_spike_layers_and_loss_scale(tmp_path):
    cells = pytest.importorskip("gradmon.cells")
    if not hasattr(cells, "MonitoredTrainStep"):
        pytest.skip("gradmon.cells.MonitoredTrainStep not built yet")
    net = mlp()
    cell = cells.MonitoredTrainStep(NanAwareLoss(net), nn.SGD(net.trainable_params(), learning_rate=0.05),
                                    max_norm=0.01, spike_mode="detect", history_size=8, layer_stats=True)
    path = tmp_path / "clip.jsonl"
    Model(cell).train(1, dataset(6), callbacks=[LiveMonitor(path, log_interval=3, layer_stats_every=3)])
    recs = records(path)
    header = recs[0]
    assert (header["max_norm"], header["spike_mode"]) == (0.01, "detect")
    assert header["cell_config"]["history_size"] == 8
    steps = [r for r in recs if r["type"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, 7))
    for r in steps:  # every step's norm is far above 0.01: clipped, with the factor applied
        assert r["clipped"] is True and r["clip_coef"] == pytest.approx(0.01 / r["grad_norm"], rel=1e-3)
        assert r["zscore"] == 0.0  # detector warm-up
    layers = [r for r in recs if r["type"] == "layers"]
    assert [r["step"] for r in layers] == [3, 6]
    assert {row["name"] for row in layers[0]["top"]} <= {p.name for p in net.trainable_params()}
    assert all(row["grad_norm"] > 0 for row in layers[0]["top"])

    net = mlp()
    scale = nn.DynamicLossScaleUpdateCell(loss_scale_value=2.0**10, scale_factor=2, scale_window=1000)
    cell = cells.MonitoredTrainStepWithLossScale(NanAwareLoss(net), nn.SGD(net.trainable_params(),
                                                                           learning_rate=0.05), scale)
    path = tmp_path / "scale.jsonl"
    Model(cell).train(1, dataset(5, nan_steps=[3]), callbacks=[LiveMonitor(path, log_interval=5)])
    steps = {r["step"]: r for r in records(path, "step")}
    assert sorted(steps) == [1, 2, 3, 4, 5]
    assert steps[3]["skipped"] is True and steps[3]["nonfinite"] is True
    assert steps[2]["loss_scale"] == 2.0**10 and steps[4]["loss_scale"] == 2.0**9
