"""Spike defence, shown: the same faulty run diverges without a defence and completes with one.

    python examples/spike_demo.py --logdir logs            # ~15 s on a 2-core CPU
    gradmon serve logs                                      # or add --serve

An MLP (~60k parameters) learns scikit-learn's bundled digits with SGD + momentum (lr 0.1,
momentum 0.9, batch 32). Two faults are injected, identically in every faulty variant:

- step ``--spike-step`` (default 60, inside the detector's 100-step EMA warm-up, where its early
  rule judges): the batch's inputs are
  multiplied by ``--spike-scale`` (default 1000) — a corrupted shard, a unit mix-up;
- step ``--nan-step`` (default 120): one input value of the batch is NaN.

Variants, trained back to back from the same initial weights on the same batch order, each
logged by :class:`gradmon.LiveMonitor` to ``<logdir>/spike-demo/<variant>/metrics.jsonl`` so that
``gradmon serve <logdir>`` shows them side by side:

- ``clean``: no faults — the reference accuracy;
- ``no-defence``: ``MonitoredTrainStep(skip_nonfinite=False, spike_mode="off")``: it measures the
  norm and otherwise trains like ``nn.TrainOneStepCell``;
- ``clip``: ``spike_mode="clip"`` (ZClip: a spike's gradient is scaled down to the detector's
  target) + ``skip_nonfinite``;
- ``skip``: ``spike_mode="skip"`` (a spike's update is dropped) + ``skip_nonfinite``.

What happens (measured, see the summary table it prints): the one scaled batch gives a gradient
~1000x the usual; applied as is, it throws the weights so far that the loss is infinite from then
on, and every monitor's ``abort_after=10`` (ten consecutive non-finite or skipped steps, checked
when the log is read, every ``--log-interval`` steps) stops the undefended run with status
``aborted``. (Hit earlier in training, e.g. ``--spike-step 40``, the same fault instead kills
every ReLU: the loss settles at ln 10, the accuracy at chance, and both stay there — outcome
``collapsed`` in the table.) With either defence the scaled step is flagged (by the early rule:
~1000x the median of the last 16 norms, where 4-8x is the threshold) and clipped or dropped, the
NaN step is skipped, and the held-out accuracy ends within a point or so of the clean run's. The
detector flags nothing else: with its defaults (docs/cells.md) the ordinary steps of early
training, where the norm still climbs fast, stay unflagged. Since issue 22 a fault from the 5th
step on is judged; before, it had to come after a 50-step warm-up.

Everything is seeded; the numbers repeat from run to run on the same machine.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# Runnable as a plain script from a checkout: make `examples` importable.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

RUN_GROUP = "spike-demo"
VARIANTS = ("clean", "no-defence", "clip", "skip")
# MonitoredTrainStep options of each variant; "faults" says whether the faults are injected.
VARIANT_OPTIONS: dict[str, dict[str, Any]] = {
    "clean": {"faults": False, "skip_nonfinite": True, "spike_mode": "off"},
    "no-defence": {"faults": True, "skip_nonfinite": False, "spike_mode": "off"},
    "clip": {"faults": True, "skip_nonfinite": True, "spike_mode": "clip"},
    "skip": {"faults": True, "skip_nonfinite": True, "spike_mode": "skip"},
}
ABORT_AFTER = 10
CHANCE_ACCURACY = 0.1  # ten digit classes


# -- pure parts: the fault plan and the summary ----------------------------------------------


@dataclass(frozen=True)
class FaultPlan:
    """Which steps (counted from 1) get a corrupted batch, and how."""

    spike_steps: tuple[int, ...] = (60,)
    spike_scale: float = 1000.0
    nan_steps: tuple[int, ...] = (120,)

    def apply(self, step: int, x: np.ndarray) -> np.ndarray:
        """The batch ``x`` of ``step`` as the faulty pipeline delivers it (a copy when changed)."""
        if step in self.spike_steps:
            x = x * np.float32(self.spike_scale)
        if step in self.nan_steps:
            x = x.copy()
            x.flat[0] = np.nan
        return x

    def fault_of(self, step: int) -> str | None:
        """``"spike"``, ``"nan"`` or None for ``step``."""
        if step in self.nan_steps:
            return "nan"
        if step in self.spike_steps:
            return "spike"
        return None


NO_FAULTS = FaultPlan(spike_steps=(), nan_steps=())


@dataclass
class VariantResult:
    """What one variant's run ended with."""

    name: str
    steps: int  # steps executed (fewer than asked when aborted)
    final_loss: float  # mean training loss of the last (up to) 10 steps executed
    eval_loss: float
    eval_accuracy: float
    counters: dict[str, int] = field(default_factory=dict)  # steps, clipped, spikes, skipped, nonfinite
    status: str = "finished"  # the run log's end status
    log_file: str = ""


def outcome(result: VariantResult, clean_accuracy: float | None, tolerance: float = 0.05) -> str:
    """``diverged`` (aborted, or non-finite held-out loss), ``collapsed`` (held-out accuracy below
    twice chance), ``degraded`` (more than ``tolerance`` below the clean run's accuracy) or ``ok``."""
    if result.status == "aborted" or not math.isfinite(result.eval_loss):
        return "diverged"
    if result.eval_accuracy < 2 * CHANCE_ACCURACY:
        return "collapsed"
    if clean_accuracy is not None and result.eval_accuracy < clean_accuracy - tolerance:
        return "degraded"
    return "ok"


def _num(x: float, fmt: str) -> str:
    return format(x, fmt) if math.isfinite(x) else str(x)


def summary_table(results: list[VariantResult]) -> str:
    """A plain-text table of the results (one row per variant)."""
    clean = next((r.eval_accuracy for r in results if r.name == "clean"), None)
    head = ("variant", "steps", "final loss", "held-out loss", "held-out acc", "spikes", "clipped",
            "skipped", "non-finite norm", "status", "outcome")
    rows = [head]
    for r in results:
        c = r.counters
        rows.append((
            r.name, str(r.steps), _num(r.final_loss, ".4g"), _num(r.eval_loss, ".4g"),
            _num(r.eval_accuracy, ".3f"), str(c.get("spikes", 0)), str(c.get("clipped", 0)),
            str(c.get("skipped", 0)), str(c.get("nonfinite", 0)), r.status, outcome(r, clean),
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def batch_order(n: int, batch_size: int, steps: int, seed: int = 0) -> list[np.ndarray]:
    """Index arrays of ``steps`` batches: reshuffled epochs of whole batches, seeded."""
    rng = np.random.default_rng(seed)
    per_epoch = n // batch_size
    order: list[np.ndarray] = []
    while len(order) < steps:
        perm = rng.permutation(n)
        order.extend(perm[i * batch_size:(i + 1) * batch_size] for i in range(per_epoch))
    return order[:steps]


# -- training --------------------------------------------------------------------------------


def evaluate(net: Any, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Held-out ``(mean cross-entropy, accuracy)`` of ``net`` (NaN weights: NaN loss)."""
    import mindspore as ms

    logits = net(ms.Tensor(x)).asnumpy().astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    loss = float(-log_probs[np.arange(len(y)), y].mean())
    accuracy = float((logits.argmax(axis=1) == y).mean())
    return loss, accuracy


def run_variant(name: str, log_root: Path, *, steps: int, batch_size: int, lr: float, faults: FaultPlan,
                eval_every: int, log_interval: int, data: tuple[np.ndarray, ...]) -> VariantResult:
    """Train one variant from the seeded initial weights; log it; return its result."""
    import mindspore as ms
    from mindspore import nn

    from examples.models import MLP, count_params, with_loss
    from gradmon import LiveMonitor, MonitoredTrainStep

    options = dict(VARIANT_OPTIONS[name])
    plan = faults if options.pop("faults") else NO_FAULTS
    x_train, y_train, x_test, y_test = data

    ms.set_seed(0)  # the same initial weights in every variant
    net = MLP()
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=lr, momentum=0.9)
    step_cell = MonitoredTrainStep(with_loss(net), optimizer, history_size=max(1024, log_interval), **options)
    step_cell.set_train()

    log_file = log_root / RUN_GROUP / name / "metrics.jsonl"
    config = {
        "variant": name, "model": "MLP", "params": count_params(net), "dataset": "sklearn digits",
        "optimizer": "Momentum(0.9)", "lr": lr, "batch_size": batch_size, "steps": steps,
        "spike_steps": list(plan.spike_steps), "spike_scale": plan.spike_scale,
        "nan_steps": list(plan.nan_steps),
    }
    monitor = LiveMonitor(str(log_file), log_interval=log_interval, config=config, batch_size=batch_size,
                          abort_after=ABORT_AFTER)
    monitor.attach(step_cell)
    per_epoch = len(x_train) // batch_size

    losses: list[Any] = []
    done = 0
    with monitor:  # an exception ends the log with status failed/interrupted
        monitor.start(steps_per_epoch=per_epoch, batch_size=batch_size)
        for i, idx in enumerate(batch_order(len(x_train), batch_size, steps)):
            step = i + 1
            x = plan.apply(step, x_train[idx])
            outputs = step_cell(ms.Tensor(x), ms.Tensor(y_train[idx]))
            losses.append(outputs[0])  # a device tensor; the last ten are read at the end
            done = step
            monitor.after_step(outputs, epoch=i // per_epoch + 1)
            if monitor.should_stop:  # abort_after fired (checked on log steps)
                break
            if step % eval_every == 0 and step < steps:
                loss, accuracy = evaluate(net, x_test, y_test)
                monitor.log_eval(step, loss=loss, accuracy=accuracy)
        eval_loss, eval_acc = evaluate(net, x_test, y_test)
        monitor.log_eval(done, loss=eval_loss, accuracy=eval_acc)
    status = "aborted" if monitor.should_stop else "finished"

    tail = [float(t.asnumpy()) for t in losses[-10:]]
    snap = step_cell.gradmon_read_history()
    counters = {"steps": int(snap.total_steps), **{k: int(v) for k, v in snap.counters.items()}}
    return VariantResult(name=name, steps=done, final_loss=float(np.mean(tail)) if tail else math.nan,
                         eval_loss=eval_loss, eval_accuracy=eval_acc, counters=counters, status=status,
                         log_file=str(log_file))


# -- command line --------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--logdir", default="logs", help="log root (default: logs); runs: <logdir>/spike-demo/*")
    p.add_argument("--steps", type=int, default=400, help="training steps per variant (default: 400)")
    p.add_argument("--spike-step", type=int, default=60, help="step whose inputs are scaled (0: none)")
    p.add_argument("--spike-scale", type=float, default=1000.0)
    p.add_argument("--nan-step", type=int, default=120, help="step whose batch holds a NaN (0: none)")
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help=f"comma-separated subset of {', '.join(VARIANTS)} (default: all)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--log-interval", type=int, default=10)
    p.add_argument("--mode", default="GRAPH", choices=["GRAPH", "PYNATIVE"])
    p.add_argument("--serve", action="store_true", help="serve the dashboard for --logdir while training")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=6060)
    p.add_argument("--exit-after-train", action="store_true", help="with --serve: stop when training ends")
    args = p.parse_args(argv)
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown or not args.variants:
        p.error(f"--variants: unknown {', '.join(unknown) or '(empty)'}; choose from {', '.join(VARIANTS)}")
    if args.steps < 1:
        p.error("--steps must be >= 1")
    for flag in ("spike_step", "nan_step"):
        value = getattr(args, flag)
        if value < 0 or value > args.steps:
            p.error(f"--{flag.replace('_', '-')} must be between 0 and --steps ({args.steps}), got {value}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import mindspore as ms

    from examples.models import digits
    from examples.serving import finish_serving, start_dashboard

    ms.set_context(mode=ms.GRAPH_MODE if args.mode == "GRAPH" else ms.PYNATIVE_MODE)
    faults = FaultPlan(
        spike_steps=(args.spike_step,) if args.spike_step else (), spike_scale=args.spike_scale,
        nan_steps=(args.nan_step,) if args.nan_step else (),
    )
    log_root = Path(args.logdir)
    server = start_dashboard(args.logdir, args.host, args.port) if args.serve else None

    data = digits()
    print(f"{args.steps} steps per variant; faults: inputs x{args.spike_scale:g} at step(s) "
          f"{list(faults.spike_steps)}, a NaN input at step(s) {list(faults.nan_steps)}", flush=True)
    results = []
    t_all = time.perf_counter()
    for name in args.variants:
        t0 = time.perf_counter()
        result = run_variant(name, log_root, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                             faults=faults, eval_every=args.eval_every, log_interval=args.log_interval,
                             data=data)
        results.append(result)
        seconds = time.perf_counter() - t0
        print(f"  {name:<11} {result.status:<9} {seconds:5.1f} s  {result.log_file}", flush=True)
    print(f"\n{summary_table(results)}\n\n({time.perf_counter() - t_all:.1f} s in all)", flush=True)

    finish_serving(server, args.exit_after_train)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("GLOG_v", "3")  # MindSpore's C++ log: errors only
    raise SystemExit(main())
