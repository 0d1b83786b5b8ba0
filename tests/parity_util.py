"""Shared parts of the parity tests: a tiny network, fixed batches, and bit-level comparisons of runs.

A run is 20 steps of one train cell on the same batches from the same weights; two runs are
"bit-identical" when every step's loss and every Parameter of the cell afterwards (weights and
optimizer state; gradmon's own ``gradmon_*`` Parameters aside) have the same bytes. That holds with one
CPU kernel thread only (tests/conftest.py): with more, the stock cell differs from itself under load.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops

STEPS = 20
IN, HIDDEN, OUT = 4, 6, 3
MODES = {"GRAPH": ms.GRAPH_MODE, "PYNATIVE": ms.PYNATIVE_MODE}


@pytest.fixture(params=list(MODES))
def mode(request):
    """Run the test in GRAPH and in PYNATIVE mode (switched in-process); import it into a test module."""
    old = ms.get_context("mode")
    ms.set_context(mode=MODES[request.param])
    yield request.param
    ms.set_context(mode=old)


@pytest.fixture
def graph_mode():
    """Run the test in GRAPH mode, the mode before it restored after."""
    old = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    yield
    ms.set_context(mode=old)


@pytest.fixture
def context_mode():
    """``context_mode("GRAPH" | "PYNATIVE")`` switches the mode inside a test (for tests parametrized
    on more than the mode); the mode before the test is restored after."""
    old = ms.get_context("mode")
    yield lambda name: ms.set_context(mode=MODES[name])
    ms.set_context(mode=old)


class TinyNet(nn.Cell):
    """Dense → Tanh → Dense with weights drawn from a fixed numpy seed (the same in every instance)."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        rng = np.random.default_rng(seed)

        def init(*shape: int) -> Tensor:
            return Tensor(rng.normal(0, 0.5, shape).astype(np.float32))

        self.fc1 = nn.Dense(IN, HIDDEN, weight_init=init(HIDDEN, IN), bias_init=init(HIDDEN))
        self.act = nn.Tanh()
        self.fc2 = nn.Dense(HIDDEN, OUT, weight_init=init(OUT, HIDDEN), bias_init=init(OUT))

    def construct(self, x):
        return self.fc2(self.act(self.fc1(x)))


class LossAndLogits(nn.Cell):
    """A model-zoo style network with loss: returns ``(loss, logits)``."""

    def __init__(self, net: nn.Cell) -> None:
        super().__init__(auto_prefix=False)
        self.net = net
        self.loss_fn = nn.MSELoss()

    def construct(self, x, y):
        logits = self.net(x)
        return self.loss_fn(logits, y), logits


def loss_net(seed: int = 0) -> nn.Cell:
    return nn.WithLossCell(TinyNet(seed), nn.MSELoss())


def batches(n: int = STEPS, seed: int = 1, sizes: Iterable[int] | None = None,
            x_scale: float = 1.0) -> list[tuple[Tensor, Tensor]]:
    """``n`` fixed regression batches ``(x [b, 4], y [b, 3])``; ``sizes`` varies the batch size per step."""
    rng = np.random.default_rng(seed)
    sizes = list(sizes) if sizes is not None else [8] * n
    out = []
    for b in sizes[:n]:
        x = (rng.normal(0, 1, (b, IN)) * x_scale).astype(np.float32)
        y = rng.normal(0, 1, (b, OUT)).astype(np.float32)
        out.append((Tensor(x), Tensor(y)))
    return out


def host(value: Any) -> Any:
    """A step's outputs on the host (numpy copies), keeping tuples and dicts."""
    if isinstance(value, (tuple, list)):
        return tuple(host(v) for v in value)
    if isinstance(value, dict):
        return {k: host(v) for k, v in value.items()}
    return value.asnumpy().copy() if hasattr(value, "asnumpy") else value


def first(outputs: Any) -> Any:
    """The loss: the stock cell returns it alone, the monitored cells first in a tuple."""
    return outputs[0] if isinstance(outputs, tuple) else outputs


@dataclass
class Run:
    """What a run left: every step's outputs (on the host) and the cell's Parameters afterwards."""

    outputs: list[Any]
    params: dict[str, bytes] = field(default_factory=dict)
    initial: dict[str, bytes] = field(default_factory=dict)

    def losses(self) -> list[np.ndarray]:
        return [first(o) for o in self.outputs]


def cell_params(cell: nn.Cell) -> dict[str, bytes]:
    """Every Parameter of a train cell but gradmon's own, as dtype + shape + raw bytes."""
    return {p.name: _bits(p.asnumpy()) for p in cell.get_parameters() if not p.name.startswith("gradmon_")}


def run(cell: nn.Cell, data: list[tuple[Tensor, ...]],
        before_step: Callable[[int], None] | None = None) -> Run:
    initial = cell_params(cell)
    outputs = []
    for i, batch in enumerate(data):
        if before_step is not None:
            before_step(i)
        outputs.append(host(cell(*batch)))
    return Run(outputs, cell_params(cell), initial)


def _bits(a: Any) -> bytes:
    a = np.asarray(a)
    return f"{a.dtype}{a.shape}".encode() + a.tobytes()


def assert_same_bits(a: Any, b: Any, what: str) -> None:
    assert _bits(a) == _bits(b), f"{what}: {np.asarray(a)!r} != {np.asarray(b)!r}"


def assert_same_run(ours: Run, stock: Run, what: str) -> None:
    """Bit-identical losses at every step and bit-identical Parameters after the last."""
    assert len(ours.outputs) == len(stock.outputs)
    for step, (a, b) in enumerate(zip(ours.losses(), stock.losses()), start=1):
        assert_same_bits(a, b, f"{what}: loss at step {step}")
    assert ours.params.keys() == stock.params.keys(), what
    differ = sorted(name for name in stock.params if ours.params[name] != stock.params[name])
    assert not differ, f"{what}: Parameters differ after {len(stock.outputs)} steps: {differ}"
    # Two runs that trained nothing would compare equal too: the stock run must have moved its weights.
    moved = [name for name in stock.initial if stock.params[name] != stock.initial[name]]
    assert moved, f"{what}: nothing trained"


class CpuLossScaleStep(nn.TrainOneStepWithLossScaleCell):
    """``nn.TrainOneStepWithLossScaleCell`` itself, runnable on CPU: only its overflow-status read (Ascend
    status ops, or GPU kernels) is replaced by the rule of its GPU path: overflow when any gradient,
    after unscaling and reduction, is not finite. Everything else is the stock ``construct``."""

    def get_overflow_status(self, status, compute_output):
        finite = ops.stack([ops.isfinite(g).all() for g in compute_output]).all()
        return ops.logical_not(finite)


def compiler_missing() -> bool:
    """True when no C++ compiler is found: the fused kernels' tests skip only then (a kernel that
    does not build or fails its self-test fails them)."""
    from gradmon.cells.fused_build import KernelBuildError, find_compiler

    try:
        find_compiler()
    except KernelBuildError:
        return True
    return False

