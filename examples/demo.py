"""The gradmon demo: a small Transformer learns scikit-learn's bundled digits while you watch.

    python examples/demo.py --logdir logs --serve

trains ``TinyTransformer`` (~1.8M parameters) with :class:`gradmon.MonitoredTrainStep` (global
gradient norm on device, clipping, spike defence) and :class:`gradmon.LiveMonitor` (strict JSONL
run log at ``<logdir>/<run>/metrics.jsonl``), evaluates a held-out split every epoch, and with
``--serve`` serves the live dashboard for ``<logdir>`` and prints its URL before training starts.
The server keeps running after training until Ctrl-C (``--exit-after-train`` to stop instead).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

# Runnable as a plain script from a checkout: make `examples` importable.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--logdir", default="logs", help="log root (default: logs)")
    p.add_argument("--run", default="demo", help="run name, a directory under the log root (default: demo)")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--max-norm", type=float, default=2.0, help="fixed clip threshold (0 disables)")
    p.add_argument("--spike-mode", default="clip", choices=["off", "detect", "clip", "skip"])
    p.add_argument("--mode", default="GRAPH", choices=["GRAPH", "PYNATIVE"])
    p.add_argument("--log-interval", type=int, default=1)
    p.add_argument("--serve", action="store_true", help="serve the live dashboard while training")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=6060)
    p.add_argument("--exit-after-train", action="store_true", help="with --serve: stop when training ends")
    p.add_argument("--small", action="store_true", help="a tiny model and few steps (for tests)")
    return p.parse_args(argv)


def make_datasets(batch_size: int, small: bool):
    import mindspore.dataset as ds

    from examples.models import digits

    x_train, y_train, x_test, y_test = digits()
    if small:
        x_train, y_train, x_test, y_test = x_train[:256], y_train[:256], x_test[:128], y_test[:128]
    train = ds.NumpySlicesDataset({"x": x_train, "y": y_train}, shuffle=True)
    train = train.batch(batch_size, drop_remainder=True)
    valid = ds.NumpySlicesDataset({"x": x_test, "y": y_test}, shuffle=False).batch(batch_size)
    return train, valid


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import mindspore as ms
    from mindspore import nn
    from mindspore.train import Accuracy, Model

    from examples.models import TinyTransformer, count_params
    from examples.serving import finish_serving, start_dashboard
    from gradmon import LiveMonitor, MonitoredTrainStep

    ms.set_context(mode=ms.GRAPH_MODE if args.mode == "GRAPH" else ms.PYNATIVE_MODE)
    ms.set_seed(0)
    log_file = Path(args.logdir) / args.run / "metrics.jsonl"

    server = start_dashboard(args.logdir, args.host, args.port) if args.serve else None

    net = TinyTransformer(d_model=64, layers=2, ff=128) if args.small else TinyTransformer()
    train, valid = make_datasets(args.batch_size, args.small)
    steps_per_epoch = train.get_dataset_size()
    total_steps = steps_per_epoch * args.epochs
    # Warm-up then cosine decay: a dynamic schedule, so the learning-rate chart has a shape.
    warmup = max(1, total_steps // 10)
    lr = [args.lr * (i + 1) / warmup for i in range(warmup)] + nn.cosine_decay_lr(
        args.lr * 0.05, args.lr, total_steps - warmup, 1, total_steps - warmup
    )
    optimizer = nn.AdamWeightDecay(net.trainable_params(), learning_rate=lr, weight_decay=0.01)
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    step = MonitoredTrainStep(
        nn.WithLossCell(net, loss_fn), optimizer, max_norm=args.max_norm or None, spike_mode=args.spike_mode
    )
    eval_net = nn.WithEvalCell(net, loss_fn)
    # LiveMonitor logs the held-out loss (the mean over the eval batches) beside these metrics.
    model = Model(step, eval_network=eval_net, metrics={"accuracy": Accuracy()}, eval_indexes=[0, 1, 2])
    config = {
        "model": "TinyTransformer",
        "params": count_params(net),
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "max_norm": args.max_norm,
        "spike_mode": args.spike_mode,
        "dataset": "sklearn digits",
    }
    monitor = LiveMonitor(str(log_file), log_interval=args.log_interval, config=config, system_metrics=True)
    print(f"training {count_params(net):,} parameters for {total_steps} steps; log: {log_file}", flush=True)
    t0 = time.perf_counter()
    model.fit(args.epochs, train, valid_dataset=valid, valid_frequency=1, callbacks=[monitor],
              dataset_sink_mode=False)
    print(f"done in {time.perf_counter() - t0:.1f} s; log: {log_file}", flush=True)

    finish_serving(server, args.exit_after_train)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("GLOG_v", "3")  # MindSpore's C++ log: errors only
    raise SystemExit(main())
