"""The divergence suite: faults that clip and skip alone do not survive, and what recovery does.

A small MLP learns a teacher network's labels (Adam, ``Model.train``, GRAPH mode) for ``steps``
batches. Faults are tied to the data stream (batch index), not to the optimizer's step, as a bad
data shard or a misconfigured stretch of a job is; a rollback therefore goes on with the batches
after the fault's start, not with the fault again:

- ``lr_x30``: the learning rate is 30x for 40 batches (a schedule or config fault);
- ``bad_shard``: 50 consecutive batches have wrong labels (shifted by one class: a label-mapping
  bug in one shard). Their gradient norms stay ordinary: the detector does not flag them.

They start at batches 450 and 500 of 600: late enough that a damaged run has no time to learn its
way back (earlier, this small model relearns the task in ~100 clean batches and every defence ends
near the clean run).

Defences: ``none`` (no clip, no skip: non-finite updates go in), ``clip`` (``max_norm`` + the spike
detector clipping), ``skip`` (the spike detector skipping, non-finite steps skipped), ``recovery``
(``clip`` + ``LiveMonitor(recovery=Recovery(every=50, keep=3, rule=LossRise()))``: the alarm and skip
triggers as by default, plus the loss-rise rule for the slow divergences). The score is the final
weights' loss on a clean held-out set (``inf`` when they are non-finite); the target: recovery within
10 % of the clean run.

Run: ``python -m benchmarks.divergence [--out DIR]`` (about a minute on 2 cores). Importable:
:func:`run_case` is what tests/test_recovery_train.py runs, on fewer steps.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from typing import Any

import numpy as np

FAULTS = {
    "clean": None,
    "lr_x30": {"kind": "lr", "start": 450, "length": 40, "factor": 30.0},
    "bad_shard": {"kind": "data", "start": 500, "length": 50},
}
DEFENCES = ("none", "clip", "skip", "recovery")
IN_DIM, HIDDEN, CLASSES, BATCH, LR = 32, 64, 10, 32, 3e-3


def _teacher_data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    w1 = np.random.default_rng(123).normal(0, 1, (IN_DIM, 48)).astype(np.float32)
    w2 = np.random.default_rng(124).normal(0, 1, (48, CLASSES)).astype(np.float32)
    x = rng.normal(0, 1, (n, IN_DIM)).astype(np.float32)
    y = np.argmax(np.tanh(x @ w1) @ w2, axis=1).astype(np.int32)
    return x, y


def batches(steps: int, fault: dict | None, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The training stream, ``steps`` batches; a ``data`` fault corrupts its stretch."""
    x, y = _teacher_data(steps * BATCH, seed)
    if fault and fault["kind"] == "data":
        lo, hi = fault["start"] * BATCH, (fault["start"] + fault["length"]) * BATCH
        y[lo:hi] = (y[lo:hi] + 1) % CLASSES
    return x, y


def step_options(defence: str) -> dict[str, Any]:
    if defence == "none":
        return {"skip_nonfinite": False}
    if defence == "skip":
        return {"spike_mode": "skip"}
    return {"max_norm": 1.0, "spike_mode": "clip"}  # clip, and recovery on top of it


def run_case(fault_name: str, defence: str, *, steps: int = 600, log_dir: str | None = None,
             recovery: dict | None = None, log_interval: int = 1) -> dict[str, Any]:
    """Train one case; returns ``{final_loss, rollbacks, aborted, seconds, log}``."""
    import mindspore as ms
    from gradmon.cells import MonitoredTrainStep
    from mindspore import Tensor, nn, ops
    from mindspore import dataset as ds
    from mindspore.train import Callback, Model

    from examples.models import MLP, with_loss
    from gradmon.monitor.callback import LiveMonitor

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    fault = FAULTS[fault_name]
    x, y = batches(steps, fault)
    data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(BATCH)
    net = MLP(in_dim=IN_DIM, hidden=HIDDEN, classes=CLASSES)
    opt = nn.Adam(net.trainable_params(), learning_rate=LR)
    cell = MonitoredTrainStep(with_loss(net), opt, history_size=64, **step_options(defence))

    class LrFault(Callback):
        """Sets the rate by batch index (Model's step count: batches consumed, rollbacks or not)."""

        def on_train_step_begin(self, run_context: Any) -> None:
            b = run_context.original_args().cur_step_num  # 1-based index of the batch about to run
            bad = fault is not None and fault["kind"] == "lr" and \
                fault["start"] < b <= fault["start"] + fault["length"]
            # ops.assign, not set_data: a compiled clipping step ignores a Parameter given a new buffer.
            ops.assign(opt.learning_rate, Tensor(LR * (fault["factor"] if bad else 1.0), ms.float32))

    log_dir = log_dir or tempfile.mkdtemp(prefix="gradmon-divergence-")
    log = os.path.join(log_dir, f"{fault_name}-{defence}.jsonl")
    rec = None
    if defence == "recovery":
        from gradmon.monitor.recovery import LossRise

        rec = dict(every=50, keep=3, rule=LossRise())
        rec.update(recovery or {})
    monitor = LiveMonitor(log, log_interval=log_interval, recovery=rec)
    t0 = time.perf_counter()
    Model(cell).train(1, data, callbacks=[LrFault(), monitor], dataset_sink_mode=False)
    seconds = time.perf_counter() - t0
    xe, ye = _teacher_data(2048, seed=7)
    eval_net = with_loss(net)
    loss = float(eval_net(Tensor(xe), Tensor(ye)).asnumpy())
    return {"fault": fault_name, "defence": defence, "final_loss": loss if math.isfinite(loss) else math.inf,
            "rollbacks": monitor.rollbacks, "aborted": monitor.should_stop, "seconds": seconds, "log": log}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="directory for the logs and results.json")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--faults", default="lr_x30,bad_shard")
    args = parser.parse_args(argv)
    out = args.out or tempfile.mkdtemp(prefix="gradmon-divergence-")
    os.makedirs(out, exist_ok=True)
    rows = [run_case("clean", "clip", steps=args.steps, log_dir=out)]
    for fault in args.faults.split(","):
        for defence in DEFENCES:
            rows.append(run_case(fault, defence, steps=args.steps, log_dir=out))
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "log"}), flush=True)
    clean = rows[0]["final_loss"]
    print(f"clean final loss {clean:.4f}")
    for r in rows[1:]:
        ratio = r["final_loss"] / clean if math.isfinite(r["final_loss"]) else math.inf
        print(f"{r['fault']:10s} {r['defence']:9s} final {r['final_loss']:.4g} ({ratio:.2f}x clean) "
              f"rollbacks {r['rollbacks']} aborted {r['aborted']}")
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(rows, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main())
