"""Small MindSpore models and data used by the demo, the tests and the benchmarks.

``TinyTransformer`` reads an 8x8 digit as a sequence of 8 row tokens; with the default sizes it
has about 1.8M parameters, the "demo Transformer" of the benchmarks. ``mlp`` is the ~60k-parameter
dispatch-bound model. Nothing here downloads anything: the digits ship inside scikit-learn.
"""

from __future__ import annotations

import math

import mindspore as ms
import numpy as np
from mindspore import nn, ops


class MLP(nn.Cell):
    """A plain 3-layer perceptron: ``in_dim -> hidden -> hidden -> classes``."""

    def __init__(self, in_dim: int = 64, hidden: int = 208, classes: int = 10) -> None:
        super().__init__()
        self.body = nn.SequentialCell(
            nn.Dense(in_dim, hidden), nn.ReLU(),
            nn.Dense(hidden, hidden), nn.ReLU(),
            nn.Dense(hidden, classes),
        )

    def construct(self, x):
        return self.body(x.reshape(x.shape[0], -1))


class SelfAttention(nn.Cell):
    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = d_model // heads
        self.qkv = nn.Dense(d_model, 3 * d_model)
        self.out = nn.Dense(d_model, d_model)
        self.scale = 1.0 / math.sqrt(self.head_dim)

    def construct(self, x):
        b, t, d = x.shape
        qkv = self.qkv(x).reshape(b, t, 3, self.heads, self.head_dim).transpose(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = ops.softmax(ops.matmul(q, k.transpose(0, 1, 3, 2)) * self.scale, axis=-1)
        y = ops.matmul(att, v).transpose(0, 2, 1, 3).reshape(b, t, d)
        return self.out(y)


class EncoderBlock(nn.Cell):
    def __init__(self, d_model: int, heads: int, ff: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm((d_model,))
        self.attn = SelfAttention(d_model, heads)
        self.norm2 = nn.LayerNorm((d_model,))
        self.ff = nn.SequentialCell(nn.Dense(d_model, ff), nn.GELU(), nn.Dense(ff, d_model))

    def construct(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.ff(self.norm2(x))


class TinyTransformer(nn.Cell):
    """Pre-norm Transformer encoder classifier over ``tokens`` tokens of ``token_dim`` features."""

    def __init__(
        self,
        tokens: int = 8,
        token_dim: int = 8,
        d_model: int = 192,
        heads: int = 4,
        layers: int = 4,
        ff: int = 768,
        classes: int = 10,
    ) -> None:
        super().__init__()
        self.tokens = tokens
        self.token_dim = token_dim
        self.embed = nn.Dense(token_dim, d_model)
        self.pos = ms.Parameter(ms.Tensor(np.random.default_rng(0).normal(0, 0.02, (1, tokens, d_model)),
                                          ms.float32), name="pos")
        self.blocks = nn.SequentialCell([EncoderBlock(d_model, heads, ff) for _ in range(layers)])
        self.norm = nn.LayerNorm((d_model,))
        self.head = nn.Dense(d_model, classes)

    def construct(self, x):
        x = x.reshape(x.shape[0], self.tokens, self.token_dim)
        h = self.blocks(self.embed(x) + self.pos)
        return self.head(self.norm(h).mean(axis=1))


def transformer_20m() -> TinyTransformer:
    """A ~20M-parameter configuration of :class:`TinyTransformer` for the benchmarks."""
    return TinyTransformer(d_model=512, heads=8, layers=7, ff=2048)


def count_params(net: nn.Cell) -> int:
    return int(sum(int(np.prod(p.shape)) for p in net.trainable_params()))


def with_loss(net: nn.Cell) -> nn.Cell:
    """``net`` followed by softmax cross-entropy over integer labels."""
    return nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))


def digits(
    test_fraction: float = 0.2, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """scikit-learn's bundled 8x8 digits, scaled to [0, 1]: ``(x_train, y_train, x_test, y_test)``.

    ``x`` is float32 ``[n, 64]``, ``y`` int32 ``[n]``; the split is stratified-free but seeded.
    """
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(len(x) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def synthetic_batch(batch: int = 32, in_dim: int = 64, classes: int = 10, seed: int = 0):
    """A deterministic random batch ``(x, y)`` as MindSpore tensors."""
    rng = np.random.default_rng(seed)
    x = ms.Tensor(rng.random((batch, in_dim), dtype=np.float32))
    y = ms.Tensor(rng.integers(0, classes, batch).astype(np.int32))
    return x, y
