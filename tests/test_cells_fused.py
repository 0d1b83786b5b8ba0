"""The fused global-norm kernel through MindSpore: accuracy against numpy float64 on real gradients of
the demo models (float32, float16, bfloat16, 0- and 1-element tensors), in GRAPH and PYNATIVE mode,
inside a Cell's construct, inside ``@ms.jit`` and inside a real training step; plus its errors and
the fallback switch. (Building the library and the kernel alone: ``test_cells_fused_build.py``.)"""

from __future__ import annotations

import copy

import mindspore as ms
import numpy as np
import pytest
from gradmon.cells import fused_norm as F
from gradmon.cells.norm_ops import global_norm, unscaled_global_norm
from gradmon.cells.norm_strategies import fused_available
from mindspore import Tensor, nn, ops

from examples.models import MLP, TinyTransformer, synthetic_batch, with_loss
from tests import parity_util

pytestmark = pytest.mark.skipif(parity_util.compiler_missing(),
                                reason="no C++ compiler here (the fallback: test_cells_fused_build.py)")


mode = parity_util.mode  # the GRAPH / PYNATIVE fixture


def _real_grads(net: nn.Cell, dtype=ms.float32) -> list[np.ndarray]:
    """Gradients of one real batch (PYNATIVE), as numpy arrays of the parameters' dtype."""
    if dtype != ms.float32:
        for p in net.trainable_params():
            p.set_dtype(dtype)
    loss_net = with_loss(net)
    x, y = synthetic_batch(16)
    _, grads = ms.value_and_grad(loss_net, None, loss_net.trainable_params())(x.astype(dtype), y)
    return [g.asnumpy() for g in grads]


@pytest.fixture(scope="module")
def demo_grads() -> dict[str, list]:
    """Real gradients: the demo TinyTransformer (1.8M) and the MLP in float32, both models in float16
    (a smaller TinyTransformer: fp16 kernels are slow on CPU), and bfloat16 casts; each list gets a
    0-element and a 1-element tensor appended."""
    old = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        ms.set_seed(0)
        out = {"tiny_fp32": _real_grads(TinyTransformer()), "mlp_fp32": _real_grads(MLP())}
        ms.set_seed(1)
        out["mlp_fp16"] = _real_grads(MLP(), ms.float16)
        out["tiny_fp16"] = _real_grads(TinyTransformer(d_model=32, heads=2, layers=2, ff=64), ms.float16)
    finally:
        ms.set_context(mode=old)
    for name in list(out):
        dtype = out[name][0].dtype
        out[name] = [*out[name], np.zeros((0, 3), dtype), np.array([0.75], dtype)]
    assert {g.dtype for g in out["tiny_fp16"]} == {np.dtype(np.float16)}, "fp16 weights give fp16 grads"
    return out


def _exact(arrays, scale: float = 1.0) -> float:
    """scale**2 * sum of squares in float64 (each float32/float16 square is exact in float64)."""
    return scale * scale * sum(float(np.sum(a.astype(np.float64) ** 2)) for a in arrays)


def _tensors(arrays, dtype=None) -> tuple:
    ts = tuple(Tensor(a) for a in arrays)
    return ts if dtype is None else tuple(t.astype(dtype) for t in ts)


class _Norms(nn.Cell):
    """The three primitives as cell attributes; the outputs also feed further ops (sqrt, add)."""

    def __init__(self) -> None:
        super().__init__()
        self.squared = F.FusedSquaredNorm()
        self.root = F.FusedGlobalNorm()
        self.per_tensor = F.FusedSquaredNorms()

    def construct(self, scale, grads):
        sq = self.squared(scale, *grads)
        return sq, ops.sqrt(sq), self.root(scale, *grads), self.per_tensor(scale, *grads) + 0.0


def test_available_here():
    assert F.fused_norm_available(), F.fused_norm_unavailable_reason()
    path = F.library_path()
    assert path is not None and path.is_file()
    assert "site-packages" not in str(path) and F.SOURCE.parent not in path.parents


@pytest.mark.parametrize("model", ["tiny_fp32", "mlp_fp32", "mlp_fp16", "tiny_fp16"])
def test_closer_to_float64_than_the_flat_path(mode, demo_grads, model):
    arrays = demo_grads[model]
    grads = _tensors(arrays)
    one = Tensor(1.0, ms.float32)
    sq, sq_root, root, per = (o.asnumpy() for o in _Norms()(one, grads))
    exact = _exact(arrays)
    flat = float(global_norm(grads).asnumpy())
    assert sq.dtype == np.float32 and sq.shape == () and root.shape == () and per.shape == (len(arrays),)
    # The kernel's sum is float64: its float32 result is the float32 nearest the exact value.
    assert float(sq) == np.float32(exact)
    assert abs(float(root) - exact ** 0.5) <= abs(flat - exact ** 0.5)
    assert abs(float(sq_root) - exact ** 0.5) <= abs(flat - exact ** 0.5) + np.spacing(np.float32(flat))
    np.testing.assert_allclose(root, np.float32(exact ** 0.5), rtol=0)
    expected = [np.float32(_exact([a])) for a in arrays]
    np.testing.assert_array_equal(per, expected)
    assert per[-2] == 0.0 and per[-1] == np.float32(0.5625)


def test_bfloat16_gradients(demo_grads):
    arrays = demo_grads["tiny_fp32"][:20]
    grads = _tensors(arrays, ms.bfloat16)
    exact = _exact([g.astype(ms.float32).asnumpy() for g in grads])  # bf16 -> f32 is exact
    out = F.FusedSquaredNorm()(Tensor(1.0, ms.float32), *grads)
    assert float(out.asnumpy()) == np.float32(exact)


def test_inside_ms_jit(demo_grads):
    arrays = demo_grads["mlp_fp32"]
    squared, per_tensor = F.FusedSquaredNorm(), F.FusedSquaredNorms()

    @ms.jit
    def norms(scale, grads):
        return ops.sqrt(squared(scale, *grads)), per_tensor(scale, *grads)

    root, per = norms(Tensor(0.5, ms.float32), _tensors(arrays))
    np.testing.assert_allclose(float(root.asnumpy()), _exact(arrays, 0.5) ** 0.5, rtol=1e-7)
    np.testing.assert_allclose(per.asnumpy(), [_exact([a], 0.5) for a in arrays], rtol=1e-7)


def test_scale_unscales_before_overflow(mode):
    # Squares of 1e20 overflow float32; the kernel squares in float64, so scale = 1e-20 gives a finite norm.
    big = [np.full((3, 4), 1e20, np.float32), np.full((5,), -2e20, np.float32)]
    exact = _exact(big, 1e-20)
    out = F.FusedSquaredNorm()(Tensor(1e-20, ms.float32), *_tensors(big))
    np.testing.assert_allclose(float(out.asnumpy()), exact, rtol=1e-6)
    unscaled = F.FusedSquaredNorm()(Tensor(1.0, ms.float32), *_tensors(big))
    assert np.isinf(float(unscaled.asnumpy())), "a sum beyond float32 range reads as inf (as the flat path)"


@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_non_finite_gradients_give_a_non_finite_norm(bad):
    arrays = [np.ones((4, 4), np.float32), np.array([1.0, bad], np.float16)]
    out = float(F.FusedGlobalNorm()(Tensor(1.0, ms.float32), *_tensors(arrays)).asnumpy())
    assert np.isinf(out) if np.isinf(bad) else np.isnan(out)


def test_primitives_and_cell_deep_copy():
    grads = (Tensor(np.full((2, 3), 2.0, np.float32)),)
    op = copy.deepcopy(F.FusedSquaredNorms())
    np.testing.assert_array_equal(op(Tensor(1.0, ms.float32), *grads).asnumpy(), [24.0])
    root = copy.deepcopy(F.FusedGlobalNorm())
    assert float(root(Tensor(1.0, ms.float32), *grads).asnumpy()) == np.float32(np.sqrt(24.0))


def test_zero_gradients_and_scalar_scale_shapes():
    op = F.FusedSquaredNorm()
    assert float(op(Tensor(1.0, ms.float32)).asnumpy()) == 0.0  # no gradient at all
    out = op(Tensor(np.array([2.0], np.float32)), Tensor(np.array(3.0, np.float32)))  # (1,)-shaped scale
    assert float(out.asnumpy()) == 36.0


def test_bad_inputs_raise_clear_errors():
    op = F.FusedSquaredNorm()
    with pytest.raises(TypeError, match="dtype"):
        op(Tensor(1.0, ms.float32), Tensor(np.ones(3, np.int32)))
    with pytest.raises(TypeError, match=r"shape \(\) or \(1,\)"):
        op(Tensor(np.ones(3, np.float32)), Tensor(np.ones(3, np.float32)))
    with pytest.raises(TypeError, match="float32 scalar"):
        op(Tensor(1.0, ms.float16), Tensor(np.ones(3, np.float32)))


class _FusedNormStep(nn.TrainOneStepCell):
    """A real training step that reports the fused norm of its gradients (what norm_strategy wires)."""

    def __init__(self, network, optimizer):
        super().__init__(network, optimizer)
        self.squared = F.FusedSquaredNorm()
        self.one = Tensor(1.0, ms.float32)

    def construct(self, *inputs):
        loss = self.network(*inputs)
        grads = self.grad(self.network, self.weights)(*inputs, ops.ones_like(loss))
        norm = ops.sqrt(self.squared(self.one, *grads))
        return ops.depend(loss, self.optimizer(grads)), norm


def test_inside_a_training_step(mode):
    ms.set_seed(0)
    net, twin = MLP(hidden=24), MLP(hidden=24)
    for a, b in zip(net.trainable_params(), twin.trainable_params()):
        b.set_data(Tensor(a.asnumpy()))
    step = _FusedNormStep(with_loss(net), nn.SGD(net.trainable_params(), learning_rate=0.1))
    x, y = synthetic_batch(8)
    for _ in range(2):
        ref_net = with_loss(twin)
        _, ref = ms.value_and_grad(ref_net, None, ref_net.trainable_params())(x, y)
        exact = _exact([g.asnumpy() for g in ref]) ** 0.5
        _, norm = step(x, y)
        np.testing.assert_allclose(float(norm.asnumpy()), exact, rtol=1e-6)
        for p, g in zip(twin.trainable_params(), ref):  # the same SGD update on the twin
            p.set_data(p - 0.1 * g)


def test_fused_norm_and_the_flat_path_agree(demo_grads):
    arrays = demo_grads["mlp_fp32"]
    grads = _tensors(arrays)
    root = F.FusedGlobalNorm()
    exact = _exact(arrays) ** 0.5
    np.testing.assert_allclose(float(root(Tensor(1.0, ms.float32), *grads).asnumpy()), exact, rtol=1e-7)
    np.testing.assert_allclose(float(global_norm(grads).asnumpy()), exact, rtol=1e-6)
    half = Tensor(0.5, ms.float32)
    np.testing.assert_allclose(float(root(half, *grads).asnumpy()), exact / 2, rtol=1e-7)
    np.testing.assert_allclose(float(unscaled_global_norm(grads, half).asnumpy()), exact / 2, rtol=1e-6)


def test_switch_off_by_env(monkeypatch):
    monkeypatch.setenv(F.ENV_SWITCH, "0")
    assert not F.fused_norm_available()
    assert "GRADMON_FUSED_NORM=0" in F.fused_norm_unavailable_reason()
    assert F.library_path() is None
    with pytest.raises(F.FusedNormUnavailableError, match="GRADMON_FUSED_NORM=0"):
        F.FusedSquaredNorm()
    assert not fused_available()  # what the step cells' norm_strategy='auto' asks
