"""Helpers of the mindformers tests: twin tiny Llamas, reference gradients, mindformers' log lines."""

from __future__ import annotations

import re

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn

from examples.mindformers.tiny_llama import counting_tokens, tiny_llama

# What the Trainer passes to every runner_wrapper besides network and optimizer (1.8's create_model_wrapper).
TRAINER_DEFAULTS = {"calculate_per_token_loss": False, "global_norm_spike_threshold": 1.0,
                    "print_separate_loss": True, "use_skip_data_by_global_norm": False,
                    "lr_scheduler": None, "grouped_lr_scheduler": None}

# MFLossMonitor's step line: "... lr: 0.001, overflow cond: False, loss_scale: 1.0, global_norm: 1.234, ..."
_MF_LINE = re.compile(r"step:\[\s*(\d+)/\s*\d+\].*?lr: ([^,]+), .*?global_norm: \[?([^,\]\n]+)")


def twins() -> tuple[nn.Cell, nn.Cell]:
    """Two tiny Llamas with identical weights: one to train, one for reference gradients."""
    net, ref = tiny_llama(seed=0), tiny_llama(seed=1)
    copy_weights(net, ref)
    ref.set_train(True)  # the training forward (inputs and labels sliced from the tokens), as in the cell
    return net, ref


def copy_weights(src: nn.Cell, dst: nn.Cell) -> None:
    for p_src, p_dst in zip(src.trainable_params(), dst.trainable_params()):
        p_dst.set_data(Tensor(p_src.asnumpy()))


def batch(seed: int, size: int = 4) -> Tensor:
    return Tensor(counting_tokens(size, seed=seed))


def reference_grads(net: nn.Cell, tokens: Tensor) -> tuple[list[Tensor], list[np.ndarray]]:
    """The gradients of the network's loss by ``ms.value_and_grad`` (not through any train cell):
    as float32 tensors and as float64 arrays."""
    _, grads = ms.value_and_grad(net, None, net.trainable_params())(tokens)
    return list(grads), [g.asnumpy().astype(np.float64) for g in grads]


def norm64(arrays: list[np.ndarray]) -> float:
    return float(np.sqrt(sum(float((a * a).sum()) for a in arrays)))


def weights(net: nn.Cell) -> list[np.ndarray]:
    return [p.asnumpy().copy() for p in net.trainable_params()]


def mf_loss_monitor_lines(text: str) -> dict[int, tuple[str, str]]:
    """``{step: (lr, global_norm)}`` as MFLossMonitor printed them."""
    return {int(m.group(1)): (m.group(2).strip(), m.group(3).strip()) for m in _MF_LINE.finditer(text)}
