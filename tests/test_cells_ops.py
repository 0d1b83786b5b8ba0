"""global_norm / clip_by_global_norm against numpy and PyTorch, eagerly and under @ms.jit."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from gradmon.cells import clip_by_global_norm, global_norm
from gradmon.cells.norm_ops import segment_ids_for, squared_norms
from mindspore import Tensor

SHAPES = [(7, 5), (5,), (2, 3, 4), (1,)]


def _arrays(seed: int = 0, scale: float = 1.0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=s) * scale).astype(np.float32) for s in SHAPES]


def _ref_norm(arrays) -> float:
    return float(np.sqrt(sum((a.astype(np.float64) ** 2).sum() for a in arrays)))


@ms.jit
def _jit_clip(grads, max_norm):
    return clip_by_global_norm(grads, max_norm)


@ms.jit
def _jit_norm(grads):
    return global_norm(grads)


@pytest.mark.parametrize("scale", [1e-3, 1.0, 50.0])
def test_global_norm_matches_numpy_eager_and_jit(scale):
    arrays = _arrays(1, scale)
    grads = tuple(Tensor(a) for a in arrays)
    ref = _ref_norm(arrays)
    eager = global_norm(grads)
    assert eager.dtype == ms.float32 and eager.shape == ()
    np.testing.assert_allclose(float(eager.asnumpy()), ref, rtol=1e-6)
    np.testing.assert_allclose(float(_jit_norm(grads).asnumpy()), ref, rtol=1e-6)


def test_global_norm_casts_half_precision_before_squaring():
    # 300 in fp16 squares to 90000 > fp16 max (65504): squaring in fp16 would give inf.
    arrays = [np.full((4, 4), 300.0, np.float16), np.full((3,), -2.0, np.float16)]
    grads = tuple(Tensor(a) for a in arrays)
    norm = global_norm(grads)
    assert norm.dtype == ms.float32
    np.testing.assert_allclose(float(norm.asnumpy()), _ref_norm(arrays), rtol=1e-6)


def test_global_norm_non_finite_and_empty():
    arrays = _arrays(2)
    arrays[1][0] = np.inf
    assert np.isinf(float(global_norm(tuple(Tensor(a) for a in arrays)).asnumpy()))
    arrays[1][0] = np.nan
    assert np.isnan(float(global_norm(tuple(Tensor(a) for a in arrays)).asnumpy()))
    with pytest.raises(ValueError):
        global_norm(())


@pytest.mark.parametrize("max_norm", [0.5, 1e6])
def test_clip_by_global_norm_scales_like_reference(max_norm):
    arrays = _arrays(3)
    ref = _ref_norm(arrays)
    coef = min(1.0, max_norm / (ref + 1e-6))
    for clipped, norm in (clip_by_global_norm(tuple(Tensor(a) for a in arrays), max_norm),
                          _jit_clip(tuple(Tensor(a) for a in arrays), Tensor(max_norm, ms.float32))):
        np.testing.assert_allclose(float(norm.asnumpy()), ref, rtol=1e-6)
        for c, a in zip(clipped, arrays):
            assert c.dtype == ms.float32 and tuple(c.shape) == a.shape
            np.testing.assert_allclose(c.asnumpy(), a * coef, rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(_ref_norm([c.asnumpy() for c in clipped]), min(ref, max_norm), rtol=1e-5)


def test_clip_keeps_each_gradients_dtype_eager_and_jit():
    # Mixed dtypes: the multiply is mapped over the tuple (HyperMap), each gradient in its own dtype.
    arrays = [np.full((3,), 4.0, np.float16), np.full((2,), 3.0, np.float32), np.full((2,), 1.0, np.float16)]
    coef = 1.0 / (_ref_norm(arrays) + 1e-6)
    for clipped, _ in (clip_by_global_norm(tuple(Tensor(a) for a in arrays), 1.0),
                       _jit_clip(tuple(Tensor(a) for a in arrays), Tensor(1.0, ms.float32))):
        assert [c.dtype for c in clipped] == [ms.float16, ms.float32, ms.float16]
        for c, a in zip(clipped, arrays):
            np.testing.assert_allclose(c.asnumpy().astype(np.float32), a.astype(np.float32) * coef, rtol=2e-3)


def test_squared_norms_per_tensor():
    arrays = _arrays(4)
    sq = squared_norms(tuple(Tensor(a) for a in arrays), segment_ids_for(SHAPES)).asnumpy()
    np.testing.assert_allclose(sq, [float((a.astype(np.float64) ** 2).sum()) for a in arrays], rtol=1e-6)


@pytest.mark.parametrize("max_norm", [0.25, 3.0, 1e9])
def test_matches_torch_clip_grad_norm(max_norm):
    torch = pytest.importorskip("torch")
    arrays = _arrays(5, 0.7)
    params = []
    for a in arrays:
        p = torch.nn.Parameter(torch.zeros(a.shape, dtype=torch.float32))
        p.grad = torch.tensor(a)
        params.append(p)
    torch_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    clipped, norm = clip_by_global_norm(tuple(Tensor(a) for a in arrays), max_norm)
    np.testing.assert_allclose(float(norm.asnumpy()), torch_norm, rtol=1e-6)
    for c, p in zip(clipped, params):
        np.testing.assert_allclose(c.asnumpy(), p.grad.numpy(), rtol=1e-6, atol=1e-9)


def test_compat_errors_name_the_supported_range():
    from gradmon.cells import SUPPORTED_RANGE, UnsupportedMindSporeError
    from gradmon.cells._compat import check_train_cell_layout, require_supported

    require_supported()  # the installed MindSpore is a supported one
    with pytest.raises(UnsupportedMindSporeError, match=r"2\.7 to 2\.10") as info:
        check_train_cell_layout(object())
    assert SUPPORTED_RANGE in str(info.value) and "grad_reducer" in str(info.value)
