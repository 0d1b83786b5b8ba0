"""Standalone check: the fused spike-detector kernel against the stock-op detector, interleaved.

Two parts, in one process per MindSpore mode:

- ``update``: a cell that runs the detector update and assigns its state, nothing else (the ``ops``
  path bracketing the ``kernel`` one, and the kernel without the loss test, ``kernel_noloss``, and
  without the learning-rate test, ``kernel_nolr``);
  reported in microseconds per update.
- ``step``: the MLP step (``benchmarks.step_overhead``'s model and settings) with ``spike_mode``
  detect / clip / skip, each built with the kernel and with the op path
  (``GRADMON_FUSED_DETECTOR=0`` while it is built), plus ``gm_clip`` (spike off), the op path
  without the early rule (``spike_early_window=0``: the detector before issue 22) and the kernel
  without the loss test (``spike_loss_window=0``) and without the learning-rate test
  (``spike_lr_ratio=0``), bracketed by ``nn.TrainOneStepCell``.

Run pinned, e.g. ``taskset -c 1 .venv/bin/python -m benchmarks.detector_kernel --mode GRAPH --clock cpu``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def detector_kernel_off(off: bool) -> Iterator[None]:
    """Build cells with the op-path detector inside (``GRADMON_FUSED_DETECTOR=0``) when ``off``."""
    from gradmon.cells.spike_kernel import ENV_SWITCH

    old = os.environ.get(ENV_SWITCH)
    if off:
        os.environ[ENV_SWITCH] = "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(ENV_SWITCH, None)
        else:
            os.environ[ENV_SWITCH] = old


def update_cells() -> tuple[dict[str, Any], tuple]:
    """``{"ops": cell, "kernel": cell, "kernel_noloss": cell, "kernel_nolr": cell}`` each running one
    detector update (default SpikeConfig, its learning-rate test included; the last two without the
    loss test, without the learning-rate test)."""
    import numpy as np
    from gradmon.cells.spike import SpikeConfig, initial_state
    from gradmon.cells.spike_kernel import SpikeDetector
    from mindspore import Parameter, Tensor, nn, ops

    class UpdateOnly(nn.Cell):
        def __init__(self, fused: bool, config: SpikeConfig) -> None:
            super().__init__()
            self.detector = SpikeDetector(config, fused=fused)
            self.state = Parameter(Tensor(initial_state(config)), name="state", requires_grad=False)

        def construct(self, norm, loss, lr):
            zscore, spike, target, state, _, _ = self.detector(norm, ops.isfinite(norm), self.state, loss, lr)
            ops.assign(self.state, state)
            return zscore, spike, target

    config = SpikeConfig(mode="skip")
    cells = {"ops": UpdateOnly(False, config), "kernel": UpdateOnly(True, config),
             "kernel_noloss": UpdateOnly(True, SpikeConfig(mode="skip", loss_window=0)),
             "kernel_nolr": UpdateOnly(True, SpikeConfig(mode="skip", lr_ratio=0))}
    return cells, (Tensor(np.float32(1.5)), Tensor(np.float32(0.7)), Tensor(np.float32(1e-3)))


SPIKE_VARIANTS = {"gm_detect": "detect", "gm_spike_clip": "clip", "gm_spike_skip": "skip"}


def step_cells(smoke: bool = False) -> tuple[dict[str, Any], tuple]:
    """The MLP step cells: plain, gm_clip, and each spike mode with the kernel and with the op path
    (``smoke``: plain and ``gm_spike_skip`` on both paths)."""
    from gradmon.cells import MonitoredTrainStep
    from mindspore import nn

    from benchmarks.step_overhead import MAX_NORM, network_and_inputs

    net, inputs = network_and_inputs("mlp")
    opt = nn.Adam(net.trainable_params(), learning_rate=1e-3)
    cells: dict[str, Any] = {"plain": nn.TrainOneStepCell(net, opt)}
    if smoke:
        variants = {"gm_spike_skip": "skip"}
    else:
        cells["gm_clip"] = MonitoredTrainStep(net, opt, max_norm=MAX_NORM)
        variants = SPIKE_VARIANTS
    for name, mode in variants.items():
        for path in ("kernel", "ops"):
            with detector_kernel_off(path == "ops"):
                cell = MonitoredTrainStep(net, opt, max_norm=MAX_NORM, spike_mode=mode)
            assert cell.spike_detector.fused == (path == "kernel")
            cells[f"{name}_{path}"] = cell
    if smoke:
        return cells, inputs
    with detector_kernel_off(True):
        cells["gm_spike_skip_noearly_ops"] = MonitoredTrainStep(net, opt, max_norm=MAX_NORM,
                                                                spike_mode="skip", spike_early_window=0)
    cells["gm_spike_skip_noloss_kernel"] = MonitoredTrainStep(net, opt, max_norm=MAX_NORM, spike_mode="skip",
                                                              spike_loss_window=0)
    cells["gm_spike_skip_nolr_kernel"] = MonitoredTrainStep(net, opt, max_norm=MAX_NORM, spike_mode="skip",
                                                            spike_lr_ratio=0)
    return cells, inputs


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=["GRAPH", "PYNATIVE"], default="GRAPH")
    p.add_argument("--part", choices=["update", "step", "both"], default="both")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--block-s", type=float, default=0.3)
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    p.add_argument("--smoke", action="store_true", help="seconds: one round, tiny blocks, skip only")
    a = p.parse_args()
    os.environ.setdefault("GLOG_v", "3")
    import mindspore as ms

    from benchmarks.interleave import run_interleaved

    ms.set_context(mode=ms.GRAPH_MODE if a.mode == "GRAPH" else ms.PYNATIVE_MODE, device_target="CPU")
    ms.set_seed(0)
    print(f"mode {a.mode}, clock {a.clock}, load average {os.getloadavg()}")
    parts = ["update", "step"] if a.part == "both" else [a.part]
    for part in parts:
        cells, inputs = update_cells() if part == "update" else step_cells(a.smoke)
        baseline = "ops" if part == "update" else "plain"
        timing = ({"rounds": 1, "target_block_s": 0.001, "min_steps": 2, "max_steps": 2, "warmup_steps": 1}
                  if a.smoke else {"rounds": a.rounds, "target_block_s": a.block_s, "min_steps": 3,
                                   "max_steps": 2000, "warmup_steps": 5})
        res = run_interleaved(cells, inputs, baseline=baseline, clock=a.clock, **timing)
        print(f"{part}: {res['blocks']} blocks of {res['steps_per_block']} steps, baseline {baseline}")
        for name, v in res["variants"].items():
            per = v["ms_per_step"]["median"]
            cost = f"{per * 1e3:8.1f} us" if part == "update" else f"{per:8.3f} ms"
            ratio = v.get("ratio")
            tail = f"  ratio {ratio['median']:.3f} IQR {ratio['q1']:.3f}-{ratio['q3']:.3f}" if ratio else ""
            print(f"  {name:26s} {cost}{tail}")
    print(f"load average at end {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
