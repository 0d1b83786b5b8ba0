"""parse_step_outputs over the shapes train cells return, with real MindSpore tensors; LiveMonitor
on real loss-scale cells (MindSpore's, and one returning mindformers' layout)."""

from __future__ import annotations

import math
import warnings

import mindspore as ms
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mindspore import dataset as ds
from mindspore import nn, ops
from mindspore.train import Callback, Model

from gradmon.logformat.reader import read_records
from gradmon.monitor.callback import LiveMonitor
from gradmon.monitor.outputs import parse_step_outputs, to_float


def t(value, dtype=ms.float32):
    return ms.Tensor(np.array(value), dtype)


@pytest.mark.parametrize(
    "outputs, loss",
    [(t(2.5), 2.5), (np.float32(2.5), 2.5), (2.5, 2.5), (3, 3.0), (np.array([[2.5]]), 2.5),
     (t([1.0, 3.0]), 2.0)],
)
def test_scalar_shapes(outputs, loss):
    parsed = parse_step_outputs(outputs)
    assert parsed.loss == pytest.approx(loss)
    assert parsed.grad_norm is None and parsed.overflow is None and parsed.loss_scale is None


def test_loss_and_grad_norm():
    parsed = parse_step_outputs((t(1.5), t(4.0)))
    assert (parsed.loss, parsed.grad_norm, parsed.overflow) == (1.5, 4.0, None)
    assert parse_step_outputs([1.5, np.float64(4.0)]).grad_norm == 4.0


def test_loss_scale_cell_shape():
    # mindspore.nn.TrainOneStepWithLossScaleCell returns (loss, overflow, scaling_sens)
    parsed = parse_step_outputs((t(0.7), t(True, ms.bool_), t(1024.0)))
    assert parsed.loss == pytest.approx(0.7)
    assert parsed.overflow is True and parsed.loss_scale == 1024.0 and parsed.grad_norm is None
    parsed = parse_step_outputs((t(0.7), t(False, ms.bool_), t(1024.0)))
    assert parsed.overflow is False
    # A longer tuple: norm, then the overflow flag and the scale.
    parsed = parse_step_outputs((t(0.7), t(3.0), np.bool_(True), 256.0, "ignored"))
    assert (parsed.grad_norm, parsed.overflow, parsed.loss_scale) == (3.0, True, 256.0)


def test_nonfinite_values():
    parsed = parse_step_outputs((t(float("nan")), t(float("inf"))))
    assert math.isnan(parsed.loss) and parsed.grad_norm == math.inf and parsed.nonfinite
    assert not parse_step_outputs((1.0, 2.0)).nonfinite


def test_mapping_and_nested():
    parsed = parse_step_outputs({"loss": t(1.0), "grad_norm": 2.0, "overflow": False, "loss_scale": 8.0,
                                 "accuracy": t(0.5), "name": "text"})
    assert (parsed.loss, parsed.grad_norm, parsed.overflow, parsed.loss_scale) == (1.0, 2.0, False, 8.0)
    assert parsed.extra == {"accuracy": 0.5}
    assert parse_step_outputs(((t(1.0), t(9.0)), t(2.0))).loss == 1.0  # network with several outputs


def test_empty_and_odd():
    assert parse_step_outputs(None).loss is None
    assert parse_step_outputs(()).loss is None
    assert to_float("text") is None and to_float(np.array([])) is None and to_float(True) == 1.0
    # (never an exception in the training loop: an integer too big for a float is infinite)
    assert to_float(10**400) == math.inf and to_float(-(10**400)) == -math.inf
    assert to_float(np.array([10**400, 1], dtype=object)) is None
    assert parse_step_outputs((1.0, 10**400)).grad_norm == math.inf
    assert parse_step_outputs({"loss": -(10**400)}).nonfinite


_ODD = st.sampled_from([
    None, 1.5, 2, True, np.float32(1.0), np.float16("nan"), np.array(3.0), np.array([1.0, 2.0]),
    np.array([]), np.array([[1, 2], [3, 4]], np.int64), np.array([True]), np.array(["x"]), np.array([1 + 2j]),
    np.bool_(False), "1.0", b"x", 10**400, -(10**400), math.inf, np.array([10**400], dtype=object),
    np.datetime64("2020"), np.uint64(2**64 - 1), np.array([1e308, 1e308]), object()])
_OUTPUTS = st.recursive(_ODD, lambda inner: st.one_of(
    st.lists(inner, max_size=7).map(tuple), st.lists(inner, max_size=7),
    st.dictionaries(st.sampled_from(["loss", "grad_norm", "overflow", "loss_scale", "lr", "acc"]), inner,
                    max_size=5)), max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(_OUTPUTS)
def test_no_step_output_raises_in_the_training_loop(outputs):
    """Whatever a train cell returns, parsing it gives fields or nothing, never an exception (which
    would stop training: LiveMonitor parses it at the step's end)."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # (numpy's casts of complex or overflowing values say so)
        fields = parse_step_outputs(outputs).record_fields()
    assert all(type(v) in (bool, float) for v in fields.values())


# -- other writers' step cells: MindSpore's loss-scale cell and mindformers' cells -----------------
# mindformers' MFTrainOneStepCell / MFPipelineWithLossScaleCell (1.3.2, 1.6.0, 1.8.0, 2.1.0 on PyPI,
# mindformers/wrapper/wrapper.py) end with
#     return loss, overflow, scaling_sens, learning_rate, global_norm[, local_norm, size]
# mindformers is not installed here (and its overflow check has no CPU kernel), so these are tuples
# recorded in that layout with the dtypes the cell returns: float32 loss, bool overflow, float32
# scale, float32 lr (a 0-d schedule value), float32 norm or None (use_clip_grad=False).


def test_mindformers_layout():
    outputs = (t(2.25), t(False, ms.bool_), t(1024.0), t(3e-4), t(0.75))
    parsed = parse_step_outputs(outputs)
    assert parsed.loss == 2.25 and parsed.overflow is False and parsed.loss_scale == 1024.0
    assert parsed.lr == pytest.approx(3e-4) and parsed.grad_norm == 0.75
    assert parsed.record_fields() == {"loss": 2.25, "grad_norm": 0.75, "loss_scale": 1024.0,
                                      "lr": pytest.approx(3e-4)}


def test_mindformers_layout_without_clipping_has_no_norm():
    parsed = parse_step_outputs((t(2.25), t(False, ms.bool_), t(1.0), t(3e-4), None))
    assert parsed.grad_norm is None and parsed.lr == pytest.approx(3e-4) and parsed.loss_scale == 1.0
    assert "grad_norm" not in parsed.record_fields()


def test_mindformers_layout_with_local_norms():
    local_norm = t([0.1, 0.2, 0.3])  # per-group squared norms, then their sizes: not step fields
    outputs = (t(2.0), t(True, ms.bool_), t(512.0), t(1e-4), t(9.5), local_norm, (4, 8, 2))
    fields = parse_step_outputs(outputs).record_fields()
    assert fields == {"loss": 2.0, "grad_norm": 9.5, "loss_scale": 512.0, "lr": pytest.approx(1e-4),
                      "skipped": True}


def test_four_tuple_is_read_as_mfloss_monitor_reads_it():
    parsed = parse_step_outputs((t(2.0), t(False, ms.bool_), t(8.0), t(5e-3)))
    assert (parsed.loss_scale, parsed.lr, parsed.grad_norm) == (8.0, pytest.approx(5e-3), None)


def test_per_group_learning_rates_are_not_reported():
    parsed = parse_step_outputs((t(2.0), t(False, ms.bool_), t(8.0), (t(1e-3), t(1e-4)), t(1.5)))
    assert parsed.lr is None and parsed.grad_norm == 1.5


def test_gradmon_mindformers_output_layout():
    # gradmon's cells with output_layout="mindformers": (loss, overflow, scale, lr, grad_norm); a
    # non-finite step is skipped by the cell (overflow True) and flagged.
    parsed = parse_step_outputs((t(float("nan")), t(True, ms.bool_), t(1.0), t(0.01), t(float("inf"))))
    fields = parsed.record_fields()
    assert math.isnan(fields.pop("loss"))
    assert fields == {"grad_norm": math.inf, "loss_scale": 1.0, "lr": pytest.approx(0.01), "skipped": True,
                      "nonfinite": True}


def test_record_fields_of_plain_outputs():
    assert parse_step_outputs(t(1.5)).record_fields() == {"loss": 1.5}
    assert parse_step_outputs((t(1.5), t(4.0))).record_fields() == {"loss": 1.5, "grad_norm": 4.0}
    assert parse_step_outputs({"loss": 1.0, "lr": 0.1, "acc": 0.5}).record_fields() == {
        "loss": 1.0, "lr": 0.1, "acc": 0.5}
    assert parse_step_outputs(None).record_fields() == {}


# -- real cells under Model.train with LiveMonitor ---------------------------------------------------


class CpuOverflowCheck:
    """The loss-scale cells' overflow check with CPU kernels (theirs uses Ascend/GPU status ops)."""

    def get_overflow_status(self, status, compute_output):
        finite = ops.stack([ops.isfinite(g).all() for g in compute_output]).all()
        return ops.logical_not(finite)


class LossScaleStep(CpuOverflowCheck, nn.TrainOneStepWithLossScaleCell):
    """MindSpore's own cell and construct: returns ``(loss, overflow, scale)``."""


class MindformersLayoutStep(CpuOverflowCheck, nn.TrainOneStepWithLossScaleCell):
    """MindSpore's loss-scale step returning what mindformers' MFTrainOneStepCell returns, computed
    as it computes it: the schedule's rate at ``optimizer.global_step`` and the global norm of the
    unscaled, reduced gradients."""

    def construct(self, *inputs):
        loss = self.network(*inputs)
        scaling_sens = self.scale_sense
        status = ms.Tensor([0] * 8, ms.int32)
        filled = ops.ones_like(loss) * ops.cast(scaling_sens, ops.dtype(loss))
        grads = self.grad(self.network, self.weights)(*inputs, filled)
        grads = self.hyper_map(ops.partial(ops.div), grads, (scaling_sens,) * len(grads))
        grads = self.grad_reducer(grads)
        overflow = self.process_loss_scale(self.get_overflow_status(status, grads))
        global_norm = ops.sqrt(ops.addn([ops.reduce_sum(ops.square(g)) for g in grads]))
        learning_rate = self.optimizer.learning_rate(self.optimizer.global_step).reshape(())
        if not overflow:
            loss = ops.depend(loss, self.optimizer(grads))
        return loss, overflow, scaling_sens, learning_rate, global_norm


class OutputsSpy(Callback):
    """Keeps each step's outputs as numpy (placed before the monitor)."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[tuple] = []

    def on_train_step_end(self, run_context):
        outputs = run_context.original_args().net_outputs
        self.steps.append(tuple(None if o is None else o.asnumpy() for o in outputs))


def train_logged(cell, path, steps: int, nan_step: int) -> tuple[list[dict], list[tuple]]:
    rng = np.random.default_rng(0)
    x = rng.random((steps * 8, 6), dtype=np.float32)
    x[(nan_step - 1) * 8] = np.nan
    y = rng.integers(0, 3, steps * 8).astype(np.int32)
    data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(8)
    spy = OutputsSpy()
    Model(cell).train(1, data, callbacks=[spy, LiveMonitor(path)], dataset_sink_mode=False)
    return [r for r in read_records(path) if r["type"] == "step"], spy.steps


class NanAwareLoss(nn.Cell):
    """Cross-entropy of a small MLP plus ``0 * mean(x)``: a NaN input gives NaN gradients."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.SequentialCell(nn.Dense(6, 16), nn.ReLU(), nn.Dense(16, 3))
        self.loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    def construct(self, x, y):
        return self.loss(self.net(x), y) + ops.reduce_mean(x) * 0.0


def test_live_monitor_logs_norm_and_lr_of_a_mindformers_layout_cell(tmp_path):
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    loss = NanAwareLoss()
    rates = [0.1, 0.08, 0.06, 0.04, 0.02]
    opt = nn.SGD(loss.trainable_params(), learning_rate=rates)
    scale = nn.DynamicLossScaleUpdateCell(loss_scale_value=2.0**10, scale_factor=2, scale_window=1000)
    cell = MindformersLayoutStep(loss, opt, scale_sense=scale)
    steps, outputs = train_logged(cell, tmp_path / "m.jsonl", 5, 3)
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5]
    for rec, (_loss, overflow, scale_v, _lr, norm) in zip(steps, outputs):
        assert rec["grad_norm"] == pytest.approx(float(norm), rel=1e-6) or not math.isfinite(float(norm))
        assert rec["loss_scale"] == float(scale_v)
        assert bool(rec.get("skipped")) == bool(overflow)
    assert [s.get("skipped", False) for s in steps] == [False, False, True, False, False]
    assert steps[2]["nonfinite"] is True and steps[3]["loss_scale"] == 2.0**9  # overflow halved the scale
    assert all(math.isfinite(s["grad_norm"]) and s["grad_norm"] > 0 for s in steps if s is not steps[2])
    # the skipped step did not advance global_step: step 4 used the rate step 3 would have used
    assert [s["lr"] for s in steps] == pytest.approx([0.1, 0.08, 0.06, 0.06, 0.04])


def test_live_monitor_reads_mindspores_loss_scale_cell(tmp_path):
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    loss = NanAwareLoss()
    opt = nn.SGD(loss.trainable_params(), learning_rate=0.05)
    scale = nn.DynamicLossScaleUpdateCell(loss_scale_value=2.0**12, scale_factor=2, scale_window=1000)
    steps, outputs = train_logged(LossScaleStep(loss, opt, scale_sense=scale), tmp_path / "m.jsonl", 4, 2)
    assert [len(o) for o in outputs] == [3] * 4  # MindSpore's own construct: (loss, overflow, scale)
    assert [s.get("skipped", False) for s in steps] == [False, True, False, False]
    # the cell returns its scale Parameter: read after the step, the overflow step shows it halved
    assert [s["loss_scale"] for s in steps] == [2.0**12, 2.0**11, 2.0**11, 2.0**11]
    assert [s["loss_scale"] for s in steps] == [float(o[2]) for o in outputs]
    assert all("grad_norm" not in s for s in steps)


def test_gradmon_loss_scale_layout_with_network_extras_reads_no_lr():
    # (loss, grad_norm, overflow, scale, *extra outputs of the network): the extras are not an lr/norm.
    parsed = parse_step_outputs((np.float32(0.5), np.float32(2.0), np.bool_(False), np.float32(1024.0),
                                 np.float32(7.0), np.float32(9.0)))
    assert parsed.grad_norm == 2.0 and parsed.loss_scale == 1024.0 and parsed.lr is None
    assert parsed.overflow is False
