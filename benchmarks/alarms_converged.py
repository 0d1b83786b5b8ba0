"""A clean run trained to its noise floor: does anything alarm once the model has converged?

    python -m benchmarks.alarms_converged              # 20,000 steps (~2-4 min on 2 cores)
    python -m benchmarks.alarms_converged --steps 600  # a short check of the harness

Issue 22's case: an MLP 64-128-10 on easy synthetic data (ten well separated Gaussian clusters),
Adam 1e-3, ``max_norm=1.0``, ``spike_mode="clip"``, :class:`gradmon.LiveMonitor` with its defaults,
under ``Model.train``. The loss falls to ~1e-7 and the gradient norm to 1e-7..1e-4, where float
noise alone moves the norm by 10-100x. Scored from the run's own log: the alarms ``LiveMonitor``
wrote, the detector's flags after step 10 (per 100 steps), the norm and loss at the end; and the
alarm rule replayed over the log's step records with any other settings (``replay``). Writes
``<out-dir>/alarms-converged.json``; the numbers go to ``benchmarks/ALARMS.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
EARLY_STEP = 10  # detector flags are counted after this step (issue 22)


def easy_data(n: int = 2048, dim: int = 64, classes: int = 10, seed: int = 0
              ) -> tuple[np.ndarray, np.ndarray]:
    """Ten Gaussian clusters, centres 4 apart (unit noise): a net separates them perfectly."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, 4.0 / math.sqrt(2.0), (classes, dim)).astype(np.float32)
    y = rng.integers(0, classes, n).astype(np.int32)
    x = centres[y] + rng.normal(0.0, 1.0, (n, dim)).astype(np.float32)
    return x.astype(np.float32), y


def train(log_file: Path, steps: int, mode: str = "GRAPH", batch_size: int = 32, seed: int = 0,
          **spike_options: Any) -> float:
    """Train ``steps`` steps with ``LiveMonitor`` logging to ``log_file``; returns the seconds taken.
    ``spike_options``: the step cell's other ``spike_*`` options (default: the defaults)."""
    import mindspore as ms
    import mindspore.dataset as ds
    from mindspore import nn
    from mindspore.train import Model

    from examples.models import MLP
    from gradmon import LiveMonitor, MonitoredTrainStep

    ms.set_context(mode=ms.GRAPH_MODE if mode == "GRAPH" else ms.PYNATIVE_MODE)
    ms.set_seed(seed)
    x, y = easy_data(seed=seed)
    per_epoch = len(x) // batch_size
    epochs = -(-steps // per_epoch)
    data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=True).batch(batch_size, drop_remainder=True)
    net = MLP(in_dim=64, hidden=128, classes=10)
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = nn.Adam(net.trainable_params(), learning_rate=1e-3)
    cell = MonitoredTrainStep(nn.WithLossCell(net, loss_fn), opt, max_norm=1.0, spike_mode="clip",
                              **spike_options)
    model = Model(cell)
    monitor = LiveMonitor(str(log_file))
    stop = stop_at(steps)
    t0 = time.perf_counter()
    model.train(epochs, data, callbacks=[monitor, stop], dataset_sink_mode=False)
    return time.perf_counter() - t0


def stop_at(steps: int) -> Any:
    """A Callback that stops training after ``steps`` steps (MindSpore imported late)."""
    from mindspore.train import Callback

    class StopAt(Callback):
        def on_train_step_end(self, run_context: Any) -> None:
            if run_context.original_args().cur_step_num >= steps:
                run_context.request_stop()

    return StopAt()


def score(log_file: Path) -> dict[str, Any]:
    """The run's alarms, detector flags after step 10, and where its loss and norm ended."""
    from gradmon.logformat.reader import read_records

    records = list(read_records(str(log_file)))
    steps = [r for r in records if r.get("type") == "step"]
    alarms = [r for r in records if r.get("type") == "event" and r.get("kind") == "alarm"]
    after = [r for r in steps if r["step"] > EARLY_STEP]
    flags = [r["step"] for r in after if r.get("spike") is True]
    tail = steps[-1000:]

    def med(name: str) -> float:
        vals = [r[name] for r in tail if isinstance(r.get(name), float) and math.isfinite(r[name])]
        return statistics.median(vals) if vals else math.nan

    return {
        "steps": len(steps),
        "alarms": [{k: a.get(k) for k in ("step", "reason", "value", "baseline", "message")} for a in alarms],
        "detector_flags_after_10": flags,
        "detector_after_10_per_100": 100.0 * len(flags) / len(after) if after else math.nan,
        "last_1000_median_loss": med("loss"),
        "last_1000_median_norm": med("grad_norm"),
        "records": steps,
    }


def replay(records: list[dict[str, Any]], config: Any = None) -> list[dict[str, Any]]:
    """The alarms :class:`gradmon.logformat.alarms.AlarmRule` (``config``) raises over ``records``."""
    from gradmon.logformat.alarms import AlarmRule

    rule = AlarmRule(config)
    events = [e for r in records for e in rule.update(r)] + rule.finish()
    return [e for e in events if e["kind"] == "alarm"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.alarms_converged", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20000)
    p.add_argument("--mode", choices=("GRAPH", "PYNATIVE"), default="GRAPH")
    p.add_argument("--seed", type=int, default=0, help="data, weights and shuffling (the report's run: 0)")
    p.add_argument("--out-dir", default=str(HERE / "out"))
    p.add_argument("--keep-records", action="store_true", help="keep the step records in the JSON file")
    p.add_argument("--loss-window", type=int, default=None,
                   help="the cell's spike_loss_window (0: no loss test; default: the default)")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gradmon-converged-") as tmp:
        log_file = Path(tmp) / "metrics.jsonl"
        extra = {} if a.loss_window is None else {"spike_loss_window": a.loss_window}
        seconds = train(log_file, a.steps, a.mode, seed=a.seed, **extra)
        doc = score(log_file)
    doc.update(seconds=seconds, mode=a.mode, requested_steps=a.steps, seed=a.seed, loss_window=a.loss_window)
    if not a.keep_records:
        doc.pop("records")
    os.makedirs(a.out_dir, exist_ok=True)
    name = "alarms-converged.json" if a.seed == 0 else f"alarms-converged-seed{a.seed}.json"
    out = Path(a.out_dir) / name
    out.write_text(json.dumps(doc, indent=1, default=str), encoding="utf-8")
    print(f"{doc['steps']} steps in {seconds:.0f} s: {len(doc['alarms'])} alarms, "
          f"{len(doc['detector_flags_after_10'])} detector flags after step {EARLY_STEP} "
          f"({doc['detector_after_10_per_100']:.3f} per 100); last 1000 steps: median loss "
          f"{doc['last_1000_median_loss']:.3g}, norm {doc['last_1000_median_norm']:.3g}\nwrote {out}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("GLOG_v", "3")
    sys.exit(main())
