"""The defaults' fused launch (``GradmonNormRecord``): norm, finite flag, history row and counters.

The kernel alone (through ctypes, as MindSpore's CPU runtime calls it), which cells use it, and a
cell using it against its twin on the stock-op record path (``fused_record`` forced off): the same
outputs, history rows, counters, weights and optimizer state, bit for bit, in GRAPH and PYNATIVE,
over runs with non-finite steps, without the skip, with gradient accumulation, and under
``Model.train``'s dataset sink."""

from __future__ import annotations

import collections
import math
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from gradmon.cells import MonitoredTrainStep, MonitoredTrainStepWithLossScale
from gradmon.cells import fused_norm as F
from gradmon.cells.fused_build import KernelBuildError, call_aot, find_compiler
from mindspore import Tensor, nn

from examples.models import MLP, with_loss
from tests import parity_util

try:
    find_compiler()
    _NO_COMPILER = False
except KernelBuildError:
    _NO_COMPILER = True

pytestmark = pytest.mark.skipif(_NO_COMPILER, reason="no C++ compiler: the fused kernel is not built here")

mode = parity_util.mode  # the GRAPH / PYNATIVE fixture


def _record(grads, scale=1.0, loss=2.5, rows=3, skips=1, counts=(7, 0, 0, 1, 1), width=8):
    """One call of the kernel on numpy arrays: ``(rc, norm, finite, row, slot, counts_after)``."""
    outs = [np.zeros((), np.float32), np.zeros((), np.bool_), np.full((1, width), -1, np.float32),
            np.full(1, -1, np.int32), np.full(5, -1, np.int32)]
    inputs = [np.array(scale, np.float32), np.array(loss, np.float32), np.array([rows, skips], np.int32),
              np.array(counts, np.int32), *grads]
    rc = call_aot(F.library_path(), "GradmonNormRecord", inputs, outs)
    return (rc, *outs)


def test_kernel_writes_the_defaults_row_and_counters():
    assert F.fused_norm_available(), F.fused_norm_unavailable_reason()
    grads = [np.arange(-3, 5, dtype=np.float32).reshape(2, 4), np.array([0.3], np.float32)]
    rc, norm, finite, row, slot, after = _record(grads, scale=0.5)
    squared = np.float32(0.25 * sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads))
    assert rc == 0
    assert norm == np.sqrt(squared) and norm.dtype == np.float32  # a float32 sqrt of the float32 sum
    assert bool(finite)
    np.testing.assert_array_equal(row, [[2.5, norm, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    assert slot.tolist() == [7 % 3] and after.tolist() == [8, 0, 0, 1, 1]


@pytest.mark.parametrize("skips", [1, 0])
def test_kernel_on_a_non_finite_step(skips):
    grads = [np.array([1.0, np.inf], np.float32), np.array([np.nan], np.float32)]
    rc, norm, finite, row, slot, after = _record(grads, rows=4, skips=skips, counts=(4, 2, 0, 1, 1), width=9)
    assert rc == 0 and math.isnan(float(norm)) and not bool(finite)
    assert row[0, 0] == 2.5 and math.isnan(row[0, 1])
    # clip_coef .. nonfinite, then the ninth column's 0
    np.testing.assert_array_equal(row[0, 2:], [1.0, 0.0, 0.0, 0.0, float(skips), 1.0, 0.0])
    assert slot.tolist() == [0] and after.tolist() == [5, 2, 0, 1 + skips, 2]


def test_kernel_refuses_wrong_shapes():
    grads = [np.ones(3, np.float32)]
    rc, *_ = _record(grads, width=7)
    assert rc != 0


def test_op_checks_its_inputs():
    op = F.FusedNormRecord(8)
    one, grad = Tensor(1.0, ms.float32), Tensor(np.ones(3, np.float32))
    with pytest.raises(TypeError, match="int32"):
        op(one, one, Tensor(np.ones(2, np.float32)), Tensor(np.zeros(5, np.int32)), grad)
    with pytest.raises(TypeError, match=r"shape \(5,\)"):
        op(one, one, Tensor(np.ones(2, np.int32)), Tensor(np.zeros(4, np.int32)), grad)
    with pytest.raises(ValueError, match="at least 8"):
        F.FusedNormRecord(5)


# -------------------------------------------------------------------------------------- cells
def _net():
    ms.set_seed(0)
    return with_loss(MLP(hidden=24))


def _step(cls=MonitoredTrainStep, fused=True, **options):
    net = _net()
    step = cls(net, nn.Adam(net.trainable_params(), 1e-2), **options)
    if not fused:
        step.fused_record = False  # read when construct compiles: the stock-op path of the same cell
    return step


def test_which_cells_use_it(monkeypatch):
    assert _step().fused_record
    assert _step(skip_nonfinite=False).fused_record
    assert _step(grad_accum_steps=2).fused_record
    for options in ({"max_norm": 1.0}, {"spike_mode": "detect"}, {"history_size": 0}, {"layer_stats": True},
                    {"local_norm": True}, {"forensics": 2}, {"norm_strategy": "flat"}):
        assert not _step(**options).fused_record, options
    assert not _step(MonitoredTrainStepWithLossScale, scale_sense=Tensor(4.0, ms.float32)).fused_record
    monkeypatch.setenv("GRADMON_FUSED_NORM", "0")  # the fallback: the stock-op record, as before
    assert not _step().fused_record


def _batches(n=7, nan_at=(2, 5)):
    rng = np.random.default_rng(3)
    out = []
    for i in range(n):
        x = rng.random((8, 64)).astype(np.float32)
        if i in nan_at:
            x[0, 0] = np.nan
        out.append((Tensor(x), Tensor(rng.integers(0, 10, 8).astype(np.int32))))
    return out


def _run(step, batches):
    outputs = [tuple(o.asnumpy().tobytes() for o in step(*b)[:2]) for b in batches]
    state = {p.name: p.asnumpy().tobytes() for p in step.get_parameters()}  # gradmon_* included
    return outputs, state, step.gradmon_read_history()


@pytest.mark.parametrize("options", [{}, {"skip_nonfinite": False}, {"history_size": 3}],
                         ids=["defaults", "no_skip", "ring_wraps"])
def test_bit_identical_to_the_stock_op_record(mode, options):
    batches = _batches()
    fused, stock = _step(**options), _step(fused=False, **options)
    assert fused.fused_record and not stock.fused_record
    out_f, state_f, snap_f = _run(fused, batches)
    out_s, state_s, snap_s = _run(stock, batches)
    assert out_f == out_s
    assert state_f.keys() == state_s.keys() and state_f == state_s
    np.testing.assert_array_equal(snap_f.rows, snap_s.rows)
    assert snap_f.counters == snap_s.counters and snap_f.total_steps == snap_s.total_steps == 7
    skips = options.get("skip_nonfinite", True)
    kept = snap_f.rows[-len(snap_f.rows):]
    assert snap_f.counters == {"clipped": 0, "spikes": 0, "skipped": 2 if skips else 0, "nonfinite": 2}
    assert set(kept[:, snap_f.fields.index("clip_coef")]) == {1.0}


def test_bit_identical_under_gradient_accumulation():
    batches = _batches(8, nan_at=(5,))
    old = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        out_f, state_f, snap_f = _run(_step(grad_accum_steps=2), batches)
        out_s, state_s, snap_s = _run(_step(fused=False, grad_accum_steps=2), batches)
    finally:
        ms.set_context(mode=old)
    assert out_f == out_s and state_f == state_s
    np.testing.assert_array_equal(snap_f.rows, snap_s.rows)
    assert snap_f.total_steps == 4 and snap_f.column("skipped").tolist() == [0.0, 0.0, 1.0, 0.0]


def test_model_train_with_dataset_sink():
    from mindspore.dataset import GeneratorDataset
    from mindspore.train import Model

    data = [(x.asnumpy(), y.asnumpy()) for x, y in _batches(6, nan_at=(4,))]
    old = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        runs = []
        for fused in (True, False):
            step = _step(fused=fused, history_size=8)
            Model(step).train(1, GeneratorDataset(data, column_names=["x", "y"], shuffle=False),
                              dataset_sink_mode=True)
            state = {p.name: p.asnumpy().tobytes() for p in step.get_parameters()}
            runs.append((step.gradmon_read_history(), state))
    finally:
        ms.set_context(mode=old)
    (snap_f, state_f), (snap_s, state_s) = runs
    assert snap_f.total_steps == 6 and snap_f.column("skipped").tolist() == [0, 0, 0, 0, 1, 0]
    np.testing.assert_array_equal(snap_f.rows, snap_s.rows)
    assert state_f == state_s


_IR_SCRIPT = textwrap.dedent("""
    import sys
    import mindspore as ms, numpy as np
    from mindspore import Tensor, nn
    from examples.models import MLP, with_loss
    from gradmon.cells import MonitoredTrainStep
    for path in sys.argv[1:]:
        ms.set_context(mode=ms.GRAPH_MODE, save_graphs=1, save_graphs_path=path)
        ms.set_seed(0)
        net = MLP(in_dim=16, hidden=24)
        cell = MonitoredTrainStep(with_loss(net), nn.Adam(net.trainable_params(), 1e-3))
        cell.fused_record = path.endswith("fused")
        cell(Tensor(np.ones((8, 16), np.float32)), Tensor(np.zeros(8, np.int32)))
""")


def _primitives(ir_dir: Path) -> collections.Counter:
    (validated,) = ir_dir.glob("*_validate_*.ir")
    return collections.Counter(re.findall(r"= (PrimFunc_\w+|Prim\w*::\w+|[A-Z]\w+)\(", validated.read_text()))


def test_the_defaults_graph_loses_the_record_kernels(tmp_path):
    dirs = [tmp_path / "fused", tmp_path / "stock"]
    root = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-c", _IR_SCRIPT, *map(str, dirs)], cwd=root, check=True, timeout=300,
                   capture_output=True)
    fused, stock = (_primitives(d) for d in dirs)
    gone, added = stock - fused, fused - stock
    # One Custom launch replaces the norm's Custom + Sqrt, IsFinite and the row's stack/cast/concat/mod/add.
    assert fused["Custom"] == stock["Custom"] == 1
    assert gone["PrimFunc_Sqrt"] == 1 and gone["PrimFunc_IsFinite"] == 1 and gone["PrimFunc_AssignAdd"] == 1
    assert fused["ScatterUpdate"] == stock["ScatterUpdate"] == 1
    assert sum(gone.values()) - sum(added.values()) >= 10, (gone, added)
