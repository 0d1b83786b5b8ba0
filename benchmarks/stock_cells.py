"""What a MindSpore 2.10 user writes today without gradmon: a ``TrainOneStepCell`` subclass that
clips with the stock ``ops.clip_by_global_norm`` and, to see the norm, computes it by hand.

MindSpore 2.10 has no public "global gradient norm" function: ``ops.clip_by_global_norm``
computes the norm internally and returns only the clipped gradients (its docstring also says it
is deprecated "after version 2.9.0", yet it still works in 2.10, in GRAPH and PYNATIVE mode on
CPU). ``nn.ClipByNorm`` clips one tensor by its own norm. So the hand-written norm below
(square, reduce-sum per tensor, ``addn``, ``sqrt``) is the user's only option, and the clip then
computes the same norm a second time.
"""

from __future__ import annotations

from mindspore import nn, ops
from mindspore.ops import composite as C

_square_sum = C.MultitypeFuncGraph("benchmarks_stock_square_sum")


@_square_sum.register("Tensor")
def _square_sum_tensor(g):
    return ops.reduce_sum(ops.square(g))


class StockClipStep(nn.TrainOneStepCell):
    """``TrainOneStepCell`` that clips the gradients with ``ops.clip_by_global_norm(grads, max_norm)``."""

    def __init__(self, network: nn.Cell, optimizer: nn.Optimizer, max_norm: float) -> None:
        super().__init__(network, optimizer)
        self.max_norm = float(max_norm)

    def construct(self, *inputs):
        loss = self.network(*inputs)
        sens = ops.fill(loss.dtype, loss.shape, self.sens)
        grads = self.grad(self.network, self.weights)(*inputs, sens)
        grads = self.grad_reducer(grads)
        grads = ops.clip_by_global_norm(grads, self.max_norm)
        loss = ops.depend(loss, self.optimizer(grads))
        return loss


class StockNormClipStep(nn.TrainOneStepCell):
    """Like :class:`StockClipStep`, and also returns the hand-computed global norm: ``(loss, norm)``."""

    def __init__(self, network: nn.Cell, optimizer: nn.Optimizer, max_norm: float) -> None:
        super().__init__(network, optimizer)
        self.max_norm = float(max_norm)
        self.hyper_map = C.HyperMap()

    def construct(self, *inputs):
        loss = self.network(*inputs)
        sens = ops.fill(loss.dtype, loss.shape, self.sens)
        grads = self.grad(self.network, self.weights)(*inputs, sens)
        grads = self.grad_reducer(grads)
        norm = ops.sqrt(ops.addn(self.hyper_map(_square_sum, grads)))
        grads = ops.clip_by_global_norm(grads, self.max_norm)
        loss = ops.depend(loss, self.optimizer(grads))
        return loss, norm
