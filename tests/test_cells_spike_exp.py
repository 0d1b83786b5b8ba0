"""The detector kernel's exp (``MsCpuExp`` in ``cells/csrc/spike_detector.cc``) against the installed
MindSpore's CPU ``ops.exp``, bit for bit: a sweep of float32 in [-90, 90] (every 257th bit pattern, every
float32 of the bands where MindSpore's vector and scalar loops part, and the extremes: +-inf, NaNs,
+-0, subnormals, +-FLT_MAX, the clamp bounds and their neighbours) as a few large tensors, and as
1-element tensors, the op path's case, in GRAPH and PYNATIVE. (numpy's exp is libm's and differs in
the last bits: the numpy reference's tests keep their tolerances.)"""

from __future__ import annotations

import ctypes

import mindspore as ms
import numpy as np
import pytest
from gradmon.cells import spike_kernel as K
from mindspore import Tensor, nn, ops

from tests import parity_util

pytestmark = pytest.mark.skipif(parity_util.compiler_missing(),
                                reason="no C++ compiler here (the op path is the detector)")
graph_mode = parity_util.graph_mode  # the fixtures
context_mode = parity_util.context_mode

F32 = np.float32
MAX_CLAMP, MIN_CLAMP = F32(88.72283935546875), F32(-87.3365478515625)
# Where MindSpore's AVX/AVX-512 loops (large tensors) round otherwise than its scalar loop (1 to 3
# elements): 2**(n-1) * poly overflows or is subnormal before the doubling.
VECTOR_BANDS = ((F32(88.37), F32(np.inf)), (MIN_CLAMP, F32(-86.2)))


def _floats_between(lo: float, hi: float, stride: int = 1) -> np.ndarray:
    """Every ``stride``-th float32 in [lo, hi] (same sign)."""
    a, b = sorted(int(np.abs(F32(v)).view(np.int32)) for v in (lo, hi))
    bits = np.arange(a, b + 1, stride, dtype=np.int32).view(np.float32)
    return -bits if np.signbit(lo) else bits


def _extremes() -> np.ndarray:
    nans = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FC12345], np.uint32).view(np.float32)
    tiny = np.array([1, 2, 0x7FFFFF, 0x800000, 0x800001], np.uint32).view(np.float32)  # subnormals, FLT_MIN
    big = np.finfo(np.float32).max
    edges = [np.nextafter(c, d, dtype=np.float32) for c in (MAX_CLAMP, MIN_CLAMP) for d in (-np.inf, np.inf)]
    values = np.array([np.inf, -np.inf, 0.0, -0.0, big, -big, MAX_CLAMP, MIN_CLAMP, *edges, 88.0, 88.5, 89.0,
                       -87.0, -86.5, -88.0, 1.0, -1.0, 0.5], np.float32)
    return np.concatenate([nans, tiny, -tiny, values])  # float32 throughout: a signalling NaN stays one


@pytest.fixture(scope="module")
def sweep() -> np.ndarray:
    parts = [_floats_between(0.0, 90.0, 257), _floats_between(-0.0, -90.0, 257), _extremes()]
    parts += [_floats_between(88.3, 88.73), _floats_between(-87.34, -86.2)]  # the bands, every float32
    return np.concatenate(parts).astype(np.float32)


def kernel_exp(x: np.ndarray) -> np.ndarray:
    dll = ctypes.CDLL(str(K.library_path()))
    dll.GradmonSpikeExp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    x = np.ascontiguousarray(x, np.float32)
    y = np.empty_like(x)
    dll.GradmonSpikeExp(x.ctypes.data, y.ctypes.data, x.size)
    return y


def _bits(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).view(np.uint32)


def _in_vector_bands(x: np.ndarray) -> np.ndarray:
    return np.logical_or.reduce([(x >= lo) & (x <= hi) for lo, hi in VECTOR_BANDS])


class OneByOne(nn.Cell):
    """exp of each element of a (32,) tensor as its own (1,)-shaped tensor: 32 launches of 1 element."""

    def construct(self, x):
        return ops.concat([ops.exp(part) for part in ops.split(x, 1)])


def test_sweep_is_dense_and_has_the_cases(sweep):
    assert sweep.size > 8_000_000
    assert np.isnan(sweep).sum() == 4 and np.isposinf(sweep).any() and np.isneginf(sweep).any()
    assert (np.abs(sweep) < np.finfo(np.float32).tiny).sum() > 10  # zeros and subnormals
    gaps = np.diff(np.sort(sweep[np.isfinite(sweep) & (np.abs(sweep) < 90)]))
    assert gaps.max() < 2.5e-3  # 257 float32 ulps at 90


def test_large_tensors_match_the_kernel_outside_the_vector_bands(sweep):
    """A few large tensors (the vector loops): the kernel's bits everywhere but in the bands where
    MindSpore's own vector and scalar loops disagree (checked 1 element at a time below)."""
    want = kernel_exp(sweep)
    got = np.concatenate([ops.exp(Tensor(chunk)).asnumpy() for chunk in np.array_split(sweep, 3)])
    differ = _bits(got) != _bits(want)
    assert not (differ & ~_in_vector_bands(sweep)).any(), sweep[differ & ~_in_vector_bands(sweep)][:10]
    assert differ.sum() > 1000  # the bands are real: 88.5 is finite in a vector, inf alone
    assert np.isnan(got[np.isnan(sweep)]).all() and (_bits(got) == _bits(want))[np.isnan(sweep)].all()


def test_one_element_tensors_match_the_kernel_graph(sweep, graph_mode):
    """Every float32 of the bands, and a sample of the rest, as 1-element tensors in GRAPH mode."""
    rng = np.random.default_rng(0)
    x = np.concatenate([sweep[_in_vector_bands(sweep)][::8], _extremes(), rng.choice(sweep, 10_000)])
    x = np.concatenate([x, np.zeros(-x.size % 32, np.float32)]).astype(np.float32)
    net = OneByOne()
    got = np.concatenate([net(Tensor(row)).asnumpy() for row in x.reshape(-1, 32)])
    np.testing.assert_array_equal(_bits(got), _bits(kernel_exp(x)))
    assert np.isinf(got[x == F32(88.5)]).all()  # the scalar loop: inf where the vector loop is finite


def test_one_element_tensors_match_the_kernel_pynative(sweep, context_mode):
    """The same in PYNATIVE (its own launch path), shape (1,) and shape (), on a smaller sample."""
    context_mode("PYNATIVE")  # (whatever mode the tests before left)
    rng = np.random.default_rng(1)
    x = np.concatenate([_extremes(), rng.choice(sweep[_in_vector_bands(sweep)], 150), rng.choice(sweep, 150)])
    want = kernel_exp(x)
    got = np.array([ops.exp(Tensor(v.reshape(1))).asnumpy()[0] for v in x], np.float32)
    np.testing.assert_array_equal(_bits(got), _bits(want))
    got0 = np.array([ops.exp(Tensor(v)).asnumpy() for v in x[:100]], np.float32)
    np.testing.assert_array_equal(_bits(got0), _bits(want[:100]))
    assert ms.get_context("mode") == ms.PYNATIVE_MODE


def test_kernel_exp_is_not_libm(sweep):
    """What the kernel had before (libm's expf) differs from MindSpore's on most of the range."""
    finite = sweep[::50][np.isfinite(sweep[::50]) & (np.abs(sweep[::50]) < 80)]
    assert (_bits(kernel_exp(finite)) != _bits(np.exp(finite))).mean() > 0.05
