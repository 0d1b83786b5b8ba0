"""Section ``logging``: host cost of ``LiveMonitor`` per step, proof that non-log steps never read
the device, and the write throughput of ``RunLogWriter``.

Runs in a child process (``python -m benchmarks.logging_section``): it imports MindSpore.

- ``callback``: a hand-written GRAPH-mode loop on the MLP calls ``monitor.after_step(outputs)``
  after each step (the same interval logic ``on_train_step_end`` uses under ``Model.train``).
  Before each call the step's loss is synced with an *uncounted* read, so the time is the monitor's
  host work alone. While it runs, every host-read method of ``mindspore.Tensor`` (``asnumpy``,
  ``item``, ``tolist``, ``__float__``, ...) is wrapped by a counter; the section reports the reads
  on non-log steps (must be 0) and on log steps (must be >= 1, which proves the counter works).
- ``writer``: ``RunLogWriter.write`` of realistic step records (one ``write()`` + flush each),
  against a bare ``file.write(encode_record(r)); file.flush()`` baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from benchmarks.child import run_child

READ_METHODS = ("asnumpy", "item", "tolist", "__float__", "__int__", "__bool__", "__index__", "__array__")


class ReadCounter:
    """Counts calls of the host-read methods of ``mindspore.Tensor`` while installed."""

    def __init__(self) -> None:
        import mindspore as ms

        self.cls = ms.Tensor
        self.count = 0
        self.by_method: dict[str, int] = {}
        self._saved: dict[str, Any] = {}
        self.original_asnumpy = self.cls.asnumpy

    def _wrap(self, name: str, fn: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            self.by_method[name] = self.by_method.get(name, 0) + 1
            return fn(*args, **kwargs)

        return counted

    def __enter__(self) -> ReadCounter:
        for name in READ_METHODS:
            fn = getattr(self.cls, name, None)
            if fn is not None:
                self._saved[name] = self.cls.__dict__.get(name, None)
                setattr(self.cls, name, self._wrap(name, fn))
        return self

    def __exit__(self, *exc: Any) -> None:
        for name, fn in self._saved.items():
            if fn is None:
                delattr(self.cls, name)
            else:
                setattr(self.cls, name, fn)


def _callback_case(cell_kind: str, log_interval: int, steps: int, tmp: str) -> dict[str, Any]:
    from mindspore import nn

    from benchmarks.stats import summarize
    from examples import models as M
    from gradmon.monitor.callback import LiveMonitor

    net = M.with_loss(M.MLP())
    opt = nn.Adam(net.trainable_params(), learning_rate=1e-3)
    if cell_kind == "gm":
        from gradmon.cells import MonitoredTrainStep

        cell = MonitoredTrainStep(net, opt, max_norm=1.0)
    else:
        cell = nn.TrainOneStepCell(net, opt)
    x, y = M.synthetic_batch(32)
    path = os.path.join(tmp, f"cb-{cell_kind}-{log_interval}", "metrics.jsonl")
    monitor = LiveMonitor(path, log_interval=log_interval, batch_size=32).attach(cell)
    monitor.start()
    counter = ReadCounter()
    raw_read = counter.original_asnumpy

    def loss_of(out: Any) -> Any:
        return out[0] if isinstance(out, (tuple, list)) else out

    for _ in range(2 * log_interval):  # warm-up: compile, first log steps; ends on a log step
        out = cell(x, y)
        raw_read(loss_of(out))
        monitor.after_step(out)
    times: dict[str, list[float]] = {"nonlog": [], "log": []}
    reads = {"nonlog": 0, "log": 0}
    with counter:
        for i in range(1, steps + 1):
            out = cell(x, y)
            raw_read(loss_of(out))  # uncounted: the step is done before the monitor runs
            kind = "log" if i % log_interval == 0 else "nonlog"
            before = counter.count
            t0 = time.perf_counter()
            monitor.after_step(out)
            times[kind].append(time.perf_counter() - t0)
            reads[kind] += counter.count - before
        by_method = dict(counter.by_method)
    monitor.close()
    result: dict[str, Any] = {
        "cell": cell_kind,
        "log_interval": log_interval,
        "steps": steps,
        "reads_nonlog_steps": reads["nonlog"],
        "reads_log_steps": reads["log"],
        "reads_by_method": by_method,
    }
    for kind, values in times.items():
        if values:
            s = summarize([v * 1e6 for v in values])
            result[f"{kind}_us"] = {k: s[k] for k in ("n", "median", "q1", "q3", "max", "mean")}
    result["log_file_bytes"] = os.path.getsize(path) if os.path.exists(path) else 0
    return result


def _writer_case(n: int, tmp: str) -> dict[str, Any]:
    from benchmarks.runlogs import step_record
    from gradmon.logformat.jsonl import encode_record
    from gradmon.monitor.writer import RunLogWriter

    records = [step_record(s, 1.7e9 + s) for s in range(1, n + 1)]
    out: dict[str, Any] = {"records": n}
    path = os.path.join(tmp, "writer", "metrics.jsonl")
    t0 = time.perf_counter()
    w = RunLogWriter(path)
    for r in records:
        w.write(r)
    w.close(None)
    dt = time.perf_counter() - t0
    size = os.path.getsize(path)
    out["run_log_writer"] = {
        "records_per_s": n / dt,
        "mb_per_s": size / dt / 1e6,
        "us_per_record": dt / n * 1e6,
        "bytes_per_record": size / n,
    }
    raw = os.path.join(tmp, "raw.jsonl")
    t0 = time.perf_counter()
    with open(raw, "w", encoding="utf-8") as f:
        for r in records:
            f.write(encode_record(r))
            f.flush()
    dt = time.perf_counter() - t0
    out["bare_write_flush"] = {
        "records_per_s": n / dt,
        "mb_per_s": os.path.getsize(raw) / dt / 1e6,
        "us_per_record": dt / n * 1e6,
    }
    return out


def measure(settings: dict[str, Any], log: Callable[[str], None]) -> dict[str, Any]:
    import mindspore as ms

    ms.set_context(mode=ms.GRAPH_MODE, device_target=settings.get("device", "CPU"))
    tmp = tempfile.mkdtemp(prefix="gradmon-bench-log-")
    result: dict[str, Any] = {"callback": [], "unavailable": {}}
    try:
        try:
            import gradmon.monitor.callback  # noqa: F401
        except Exception as exc:
            result["unavailable"]["callback"] = (
                f"gradmon.monitor.callback not available: {type(exc).__name__}: {exc}")
        else:
            try:
                from gradmon.cells import MonitoredTrainStep  # noqa: F401

                kinds = ["plain", "gm"]
            except Exception as exc:
                result["unavailable"]["callback_gm"] = f"gradmon.cells not available: {exc}"
                kinds = ["plain"]
            for kind in kinds:
                for interval in settings["intervals"]:
                    try:
                        case = _callback_case(kind, interval, settings["callback_steps"], tmp)
                        result["callback"].append(case)
                        log(
                            f"  callback {kind} interval {interval}: non-log "
                            f"{case.get('nonlog_us', {}).get('median', float('nan')):.1f} us, log "
                            f"{case.get('log_us', {}).get('median', float('nan')):.1f} us, reads on non-log "
                            f"steps {case['reads_nonlog_steps']}, on log steps {case['reads_log_steps']}"
                        )
                    except Exception as exc:
                        result["unavailable"][f"callback_{kind}_{interval}"] = f"{type(exc).__name__}: {exc}"
        try:
            result["writer"] = _writer_case(settings["writer_records"], tmp)
            log(f"  writer: {result['writer']['run_log_writer']['records_per_s']:.0f} records/s")
        except ImportError as exc:
            result["unavailable"]["writer"] = f"gradmon.monitor.writer not available: {exc}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return result


def run_section(device: str, smoke: bool, log: Callable[[str], None], out_dir: str) -> dict[str, Any]:
    settings = (
        {"intervals": [5], "callback_steps": 20, "writer_records": 2000}
        if smoke
        else {"intervals": [10, 100], "callback_steps": 400, "writer_records": 50_000}
    )
    settings["device"] = device
    log("logging: callback host cost and writer throughput")
    out = run_child(
        "benchmarks.logging_section",
        ["--settings", json.dumps(settings)],
        os.path.join(out_dir, "logging.json"),
        300 if smoke else 600,
        log,
    )
    out["settings"] = settings
    out["about"] = (__doc__ or "").strip()
    return out


def _main() -> int:
    p = argparse.ArgumentParser(description="the logging section (child process)")
    p.add_argument("--settings", required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    result = measure(json.loads(a.settings), lambda m: print(m, flush=True))
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
