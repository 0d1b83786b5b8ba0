"""``LiveMonitor``: the MindSpore callback that writes the run log (docs/format.md).

Host cost per step: a non-log step is two ``time.perf_counter()`` calls and a comparison (no
tensor is read). Every ``log_interval`` steps the monitor reads the device once: the step cell's
history ring when it has one (``gradmon_read_history``, see docs/design.md) — then every step
since the last read gets its own record — or else the last step's outputs.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

import mindspore as ms
import numpy as np
from mindspore.train import Callback

from gradmon.jsonl import to_jsonable
from gradmon.lr import LrReader
from gradmon.outputs import parse_step_outputs, to_float, to_host
from gradmon.records import (
    BadStepCounter,
    epoch_of,
    events_for_step,
    history_rows_to_steps,
    is_bad_step,
)
from gradmon.runlog import RunLogWriter
from gradmon.schema import FLAG_FIELDS

__all__ = ["LiveMonitor", "rank_log_path"]

_log = logging.getLogger("gradmon.callback")


def rank_log_path(log_file: str, rank: int) -> str:
    """``dir/metrics.jsonl`` -> ``dir/metrics.rank<rank>.jsonl``."""
    root, ext = os.path.splitext(log_file)
    return f"{root}.rank{rank}{ext or '.jsonl'}"


def _distributed() -> tuple[int, int]:
    """``(rank, world_size)`` when MindSpore communication is initialised, else ``(0, 1)``."""
    try:
        from mindspore.communication._comm_helper import GlobalComm

        if not GlobalComm.INITED:
            return 0, 1
        from mindspore.communication import get_group_size, get_rank

        return int(get_rank()), int(get_group_size())
    except Exception:
        return 0, 1


def _metric_value(value: Any) -> Any:
    """A user/eval metric as a float when it is a scalar, else plain JSON data."""
    host = to_host(value)
    if isinstance(host, (bool, int, float)) or getattr(host, "size", 2) == 1:
        number = to_float(host)
        if number is not None:
            return number
    return to_jsonable(host)


class LiveMonitor(Callback):
    """Write a live run log of a MindSpore training run.

    Args:
        log_file: the run log, e.g. ``logs/exp001/metrics.jsonl`` (directories are created; the
            file is appended to, so a restarted run adds a new segment).
        log_interval: read the device on steps that are multiples of this (and before an
            evaluation and at the end). With a step cell that keeps a device history
            (``MonitoredTrainStep(history_size >= log_interval)``) every step still gets a
            record; with any other cell only the steps read do.
        config: the user's settings, written into the header.
        batch_size: samples per step on one rank, when the dataset cannot tell
            (``train_dataset.get_batch_size()`` is used otherwise). Throughput is global:
            ``batch_size * world_size / step_time``.
        per_rank: every rank also writes ``metrics.rank<N>.jsonl`` beside ``log_file`` (rank 0
            still writes ``log_file``). By default only rank 0 writes.
        system_metrics, system_interval: sample host CPU, RSS and device memory every
            ``system_interval`` seconds on a background thread (``system`` records).
        abort_after: stop training after this many consecutive skipped or non-finite steps.
            Every rank evaluates it (ranks that write nothing still read on log steps), so the
            data-parallel ranks stop together as long as the flags agree across ranks — true for
            ``MonitoredTrainStep``, whose norm is the all-reduced one.
        abort_checkpoint: on abort, rank 0 first saves the train network's parameters
            (optimizer state included) here, unless they are non-finite.
        layer_stats_every, layer_top_k: every N steps write a ``layers`` record from the step
            cell's ``gradmon_layer_stats(top_k=...)`` when it has one.
        retry_initial: first back-off (seconds) before reopening an unwritable log.

    Outside ``Model.train``: ``log(step, **metrics)`` and ``log_eval(step, **metrics)`` write
    records directly; ``attach(cell, optimizer)`` + ``after_step(outputs)`` after each step of a
    hand-written loop gives the same interval logic as under ``Model``; ``close()`` (or ``with``)
    ends the run. ``should_stop`` turns true when the abort policy fires.
    """

    def __init__(
        self,
        log_file: str | os.PathLike[str],
        log_interval: int = 1,
        *,
        config: Mapping[str, Any] | None = None,
        batch_size: int | None = None,
        per_rank: bool = False,
        system_metrics: bool = False,
        system_interval: float = 5.0,
        abort_after: int | None = None,
        abort_checkpoint: str | os.PathLike[str] | None = None,
        layer_stats_every: int = 0,
        layer_top_k: int = 10,
        retry_initial: float = 1.0,
    ) -> None:
        super().__init__()
        if int(log_interval) < 1:
            raise ValueError(f"log_interval must be >= 1, got {log_interval}")
        if abort_after is not None and int(abort_after) < 1:
            raise ValueError(f"abort_after must be >= 1 or None, got {abort_after}")
        self.log_file = os.fspath(log_file)
        self.log_interval = int(log_interval)
        self.config = dict(config or {})
        self.batch_size = batch_size
        self.per_rank = per_rank
        self.system_metrics = system_metrics
        self.system_interval = system_interval
        self.abort_after = abort_after
        self.abort_checkpoint = os.fspath(abort_checkpoint) if abort_checkpoint is not None else None
        self.layer_stats_every = int(layer_stats_every)
        self.layer_top_k = int(layer_top_k)
        self._retry_initial = retry_initial
        self._cell: Any = None
        self._optimizer: Any = None
        self._writers: list[RunLogWriter] = []
        self._started = False
        self._eval_losses: list[float] = []  # per-batch losses of the evaluation under way
        self._depth = 0  # nesting of `with` blocks (Model enters callbacks for train and eval)
        self._reset_run_state()

    # -- run state --------------------------------------------------------------------------

    def _reset_run_state(self) -> None:
        self._step = 0  # last global step executed
        self._epoch = 1
        self._logged_step = 0  # last step whose record is written
        self._steps_per_epoch: int | None = None
        self._outputs: Any = None  # last train step's outputs (a reference, never read off the log step)
        self._t_last_end: float | None = None
        self._t_interval = time.perf_counter()
        self._data_times: list[float] = []
        self._lr: LrReader | None = None
        self._samples_per_step: int | None = None
        self._bad = BadStepCounter(self.abort_after)
        self._status: str | None = None
        self._stop_requested = False
        self._run_context: Any = None
        self._sampler: Any = None
        self._last_layers_step = 0
        self._history_failed = False
        self._rank, self._world_size = 0, 1

    @property
    def should_stop(self) -> bool:
        """True once the abort policy has fired (for hand-written loops)."""
        return self._stop_requested

    @property
    def dropped_records(self) -> int:
        """Records lost to I/O errors, over all files this monitor writes."""
        return sum(w.dropped_records for w in self._writers)

    @property
    def step(self) -> int:
        """The last training step seen."""
        return self._step

    def attach(self, cell: Any, optimizer: Any = None) -> LiveMonitor:
        """Use ``cell`` (e.g. a ``MonitoredTrainStep``) for history reads, its config and layer
        stats in a hand-written loop; ``optimizer`` (default ``cell.optimizer``) for the rate."""
        self._cell = cell
        self._optimizer = optimizer if optimizer is not None else getattr(cell, "optimizer", None)
        return self

    # -- starting and ending a segment --------------------------------------------------------

    def start(
        self, *, initial_step: int = 0, steps_per_epoch: int | None = None, batch_size: int | None = None
    ) -> None:
        """Open the log and write the header (``on_train_begin`` and the first ``log`` call do
        this; call it yourself to have the header written at a time of your choosing)."""
        if self._started:
            return
        self._reset_run_state()
        self._step = self._logged_step = self._last_layers_step = int(initial_step)
        self._steps_per_epoch = steps_per_epoch
        self._rank, self._world_size = _distributed()
        header = self._header_fields(batch_size if batch_size is not None else self.batch_size)
        paths = []
        if self._rank == 0:
            paths.append(self.log_file)
        if self.per_rank:
            paths.append(rank_log_path(self.log_file, self._rank))
        self._writers = [RunLogWriter(p, header=header, retry_initial=self._retry_initial) for p in paths]
        if self._optimizer is not None:
            self._lr = LrReader(self._optimizer, pad_to=self.log_interval)
        batch = batch_size if batch_size is not None else self.batch_size
        if batch is not None:
            self._samples_per_step = int(batch) * self._world_size
        self._started = True
        self._t_last_end = self._t_interval = time.perf_counter()
        if self.system_metrics and self._writers:
            from gradmon.sysmetrics import SystemSampler

            self._sampler = SystemSampler(
                self._emit, lambda: self._step, interval=self.system_interval,
                device_target=ms.get_context("device_target"),
            )
            self._sampler.start()

    def close(self, status: str | None = None) -> None:
        """Write the pending steps and the ``end`` record, close the files. Idempotent.

        ``status``: ``finished`` / ``aborted`` / ``interrupted`` / ``failed``; default
        ``aborted`` after an abort, else ``finished``."""
        if not self._started:
            return
        if self._sampler is not None:
            self._sampler.stop()
            self._sampler = None
        try:
            self._flush()
        except Exception as exc:  # the device may be gone after a crash; the end record matters more
            _log.warning("gradmon: could not read the last steps: %s", exc)
        final = status or self._status or "finished"
        for w in self._writers:
            w.close(final, steps=self._step)
        self._started = False

    def __enter__(self) -> LiveMonitor:
        self._depth += 1
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        # Model enters every callback as a context manager, for train() and again for each
        # evaluation inside fit(): only the outermost exit ends the run. This is also how a
        # run that raises gets its end record.
        self._depth = max(self._depth - 1, 0)
        if self._depth:
            return
        if exc_type is None:
            self.close()
        elif issubclass(exc_type, (KeyboardInterrupt, SystemExit)):
            self.close("interrupted")
        else:
            self.close("failed")

    def _header_fields(self, batch_size: int | None) -> dict[str, Any]:
        cell_cfg: dict[str, Any] = {}
        get_cfg = getattr(self._cell, "gradmon_config", None)
        if callable(get_cfg):
            try:
                cell_cfg = dict(get_cfg())
            except Exception as exc:
                _log.warning("gradmon: gradmon_config() failed: %s", exc)
        mode = "GRAPH" if ms.get_context("mode") == ms.GRAPH_MODE else "PYNATIVE"
        from gradmon import __version__

        header: dict[str, Any] = {
            "versions": {
                "gradmon": __version__, "mindspore": ms.__version__, "python": sys.version.split()[0],
            },
            "mode": mode,
            "device": ms.get_context("device_target"),
            "world_size": self._world_size,
            "rank": self._rank,
            "config": self.config,
            "max_norm": cell_cfg.get("max_norm"),
            "spike_mode": cell_cfg.get("spike_mode"),
            "log_interval": self.log_interval,
        }
        if cell_cfg:
            header["cell_config"] = cell_cfg
        if batch_size is not None:
            header["batch_size"] = int(batch_size)
        if self._steps_per_epoch:
            header["steps_per_epoch"] = int(self._steps_per_epoch)
        return header

    # -- MindSpore callback hooks -------------------------------------------------------------

    def on_train_begin(self, run_context: Any) -> None:
        cb = run_context.original_args()
        self._cell = cb.train_network
        optimizer = getattr(cb, "optimizer", None)
        self._optimizer = optimizer if optimizer is not None else getattr(cb.train_network, "optimizer", None)
        batch = self.batch_size
        if batch is None:
            dataset = getattr(cb, "train_dataset", None)
            try:
                batch = int(dataset.get_batch_size()) if dataset is not None else None
            except Exception:
                batch = None
        if self._started:  # a monitor reused for a second train(): new segment
            self.close()
        self.start(initial_step=int(getattr(cb, "cur_step_num", 0) or 0), steps_per_epoch=cb.batch_num,
                   batch_size=batch)
        self._run_context = run_context

    def on_train_step_begin(self, run_context: Any) -> None:
        t = time.perf_counter()
        if self._t_last_end is not None:
            self._data_times.append(t - self._t_last_end)

    def on_train_step_end(self, run_context: Any) -> None:
        self._t_last_end = time.perf_counter()
        cb = run_context.original_args()
        self._step = cb.cur_step_num
        self._epoch = cb.cur_epoch_num
        self._outputs = cb.net_outputs
        if self._step // self.log_interval > self._logged_step // self.log_interval:
            self._run_context = run_context
            self._flush()

    def on_train_end(self, run_context: Any) -> None:
        self.close()

    def on_eval_begin(self, run_context: Any) -> None:
        # Write the training steps before the eval record (the eval syncs the device anyway).
        if self._started:
            self._flush()
        self._eval_losses = []

    def on_eval_step_end(self, run_context: Any) -> None:
        # The eval network's first output is its loss (WithEvalCell: loss, logits, label).
        if self._started:
            loss = parse_step_outputs(run_context.original_args().net_outputs).loss
            if loss is not None:
                self._eval_losses.append(loss)

    def on_eval_end(self, run_context: Any) -> None:
        if not self._started:
            return
        cb = run_context.original_args()
        results = getattr(cb, "eval_results", None) or getattr(cb, "metrics", None) or {}
        metrics = dict(results)
        # MindSpore 2.7-2.10's Model.fit makes a new loss metric for every eval batch, so its
        # "eval_loss" is the LAST batch's loss. The loss is the user's "loss" metric if they have
        # one, else the mean of the per-batch losses seen here (what mindspore.train.Loss computes).
        last_batch_loss = metrics.pop("eval_loss", None)
        if "loss" not in metrics:
            if self._eval_losses:
                metrics["loss"] = sum(self._eval_losses) / len(self._eval_losses)
            elif last_batch_loss is not None:
                metrics["last_batch_loss"] = last_batch_loss
        self._eval_losses = []
        self.log_eval(self._step, **metrics)
        # Evaluation time is neither a training step nor an input stall.
        self._t_interval = self._t_last_end = time.perf_counter()

    # -- direct logging -----------------------------------------------------------------------

    def log(self, step: int, *, epoch: int | None = None, **metrics: Any) -> None:
        """Write a ``step`` record for a hand-written loop: ``monitor.log(step, loss=..., lr=...)``.

        Tensor values are read here. Non-finite loss/norm and ``skipped``/``nonfinite``/``spike``
        flags produce events and count for the abort policy (see :attr:`should_stop`)."""
        self.start(initial_step=0)
        self._step = max(self._step, int(step))
        record: dict[str, Any] = {"type": "step", "step": int(step), "epoch": int(epoch or self._epoch),
                                  "ts": time.time()}
        for key, value in metrics.items():
            record[key] = bool(value) if key in FLAG_FIELDS else _metric_value(value)
        self._write_steps([record])
        self._logged_step = max(self._logged_step, int(step))

    def log_eval(self, step: int | None = None, **metrics: Any) -> None:
        """Write an ``eval`` record at training step ``step`` (default: the current one)."""
        self.start(initial_step=0)
        record: dict[str, Any] = {"type": "eval", "step": int(self._step if step is None else step),
                                  "epoch": int(self._epoch), "ts": time.time()}
        for key, value in metrics.items():
            record[str(key)] = _metric_value(value)
        self._emit(record)

    def after_step(self, outputs: Any = None, *, epoch: int | None = None) -> None:
        """Count one step of a hand-written loop (``outputs``: what the step cell returned; kept
        as a reference and only read on log steps). Same interval logic as under ``Model``."""
        now = time.perf_counter()
        self.start(initial_step=0)
        self._t_last_end = now
        self._step += 1
        if epoch is not None:
            self._epoch = int(epoch)
        self._outputs = outputs
        if self._step // self.log_interval > self._logged_step // self.log_interval:
            self._flush()

    # -- log steps ------------------------------------------------------------------------------

    def _emit(self, record: Mapping[str, Any]) -> None:
        for w in self._writers:
            if not w.closed:
                w.write(record)

    def _flush(self) -> None:
        """Write the records of every step after the last written one (the one device read)."""
        step = self._step
        n = step - self._logged_step
        if n <= 0 or not self._started:
            return
        if not self._writers and not self.abort_after:
            # A rank that writes nothing reads nothing. With an abort policy every rank reads, so
            # that all data-parallel ranks take the same stop decision.
            self._logged_step = step
            self._data_times.clear()
            return
        now = time.perf_counter()
        step_time = (now - self._t_interval) / n
        self._t_interval = now
        data_times, self._data_times = self._data_times, []
        ts = time.time()
        first = self._logged_step + 1

        records: list[dict[str, Any]] = []
        history = self._read_history(step)
        if history is not None:
            items, lost = history
        else:
            items, lost = [(step, self._fields_from_outputs())], 0
        if self._lr is not None:
            skipped = [False] * n
            for s, fields in items:
                if 0 <= s - first < n:
                    skipped[s - first] = bool(fields.get("skipped"))
            lrs = self._lr.values(n, skipped)
        else:
            lrs = [None] * n
        timing: dict[str, float] = {"step_time": step_time}
        if step_time > 0:
            if self._samples_per_step:
                timing["throughput"] = self._samples_per_step / step_time
            else:
                timing["steps_per_sec"] = 1.0 / step_time
        for s, fields in items:
            record: dict[str, Any] = {
                "type": "step", "step": s,
                "epoch": epoch_of(s, step, self._epoch, self._steps_per_epoch), "ts": ts,
            }
            record.update(fields)
            lr = lrs[s - first] if 0 <= s - first < len(lrs) else None
            if lr is not None:
                record["lr"] = lr
            record.update(timing)
            # One data time per host step; in sink mode (several steps per callback) the last one.
            k = s - first if len(data_times) == n else (len(data_times) - 1 if s == step else -1)
            if 0 <= k < len(data_times):
                record["data_time"] = data_times[k]
            records.append(record)
        if lost:
            self._emit({
                "type": "event", "kind": "history_overflow", "step": first, "ts": ts, "count": lost,
                "message": f"{lost} steps were not recorded: the device history ring is smaller than the "
                           f"read interval (history_size < log_interval)",
            })
        self._logged_step = step
        self._write_steps(records)
        self._maybe_layer_stats(step, ts)

    def _read_history(self, step: int) -> tuple[list[tuple[int, dict[str, Any]]], int] | None:
        """The steps since the last read from the cell's device history; None when the cell has
        none or reading it failed (then the step outputs are parsed instead)."""
        read_history = getattr(self._cell, "gradmon_read_history", None)
        if not callable(read_history) or self._history_failed:
            return None
        try:
            snap = read_history()
            return history_rows_to_steps(
                tuple(snap.fields), snap.rows, int(snap.total_steps),
                current_step=step, after_step=self._logged_step,
            )
        except Exception as exc:  # monitoring must not stop training
            self._history_failed = True
            _log.warning("gradmon: reading the step cell's history failed (%s: %s); logging the step "
                         "outputs of log steps instead", type(exc).__name__, exc)
            return None

    def _fields_from_outputs(self) -> dict[str, Any]:
        return parse_step_outputs(self._outputs).record_fields()

    def _write_steps(self, records: list[dict[str, Any]]) -> None:
        """Write step records with their events, and apply the abort policy."""
        for record in records:
            self._emit(record)
            for event in events_for_step(record, record.get("ts")):
                self._emit(event)
            # One history read can hold more bad steps than the limit: the abort belongs to the
            # step that reached it, with that step's count, right after that step's record.
            if self._bad.update(is_bad_step(record)) and self._status != "aborted":
                self._abort(record["step"], self._bad.consecutive)

    def _maybe_layer_stats(self, step: int, ts: float) -> None:
        every = self.layer_stats_every
        stats_fn = getattr(self._cell, "gradmon_layer_stats", None)
        if every <= 0 or not callable(stats_fn) or step // every <= self._last_layers_step // every:
            return
        self._last_layers_step = step
        try:
            stats = stats_fn(top_k=self.layer_top_k)
        except Exception as exc:
            _log.warning("gradmon: gradmon_layer_stats() failed: %s", exc)
            return
        record: dict[str, Any] = {"type": "layers", "step": step, "ts": ts}
        if isinstance(stats, Mapping):
            record.update({k: v for k, v in stats.items() if k not in ("type", "step", "ts")})
        else:
            record["top"] = list(stats)
        self._emit(record)

    # -- abort policy -------------------------------------------------------------------------

    def _abort(self, step: int, consecutive: int) -> None:
        checkpoint = None
        note = ""
        if self.abort_checkpoint and self._rank == 0:  # data-parallel weights are the same on every rank
            checkpoint, note = self._save_abort_checkpoint()
        message = (f"training aborted at step {step}: {consecutive} consecutive skipped or non-finite "
                   f"steps (abort_after={self.abort_after})"
                   + (f"; checkpoint saved to {checkpoint}" if checkpoint else "") + note)
        _log.error("gradmon: %s", message)
        event: dict[str, Any] = {"type": "event", "kind": "abort", "step": step, "ts": time.time(),
                                 "consecutive": consecutive, "message": message}
        if checkpoint:
            event["checkpoint"] = checkpoint
        self._emit(event)
        self._status = "aborted"
        self._stop_requested = True
        if self._run_context is not None:
            self._run_context.request_stop()

    def _save_abort_checkpoint(self) -> tuple[str | None, str]:
        network = self._cell
        if network is None:
            return None, "; no network to save"
        try:
            params = network.trainable_params()
            if not all(np.isfinite(p.asnumpy()).all() for p in params):
                return None, ("; checkpoint NOT saved: the weights are non-finite "
                              "(the step cell does not skip bad steps)")
            path = self.abort_checkpoint
            assert path is not None
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            ms.save_checkpoint(network, path)
            return path, ""
        except Exception as exc:  # saving is best effort; stopping is what matters
            _log.error("gradmon: could not save the abort checkpoint: %s", exc)
            return None, f"; checkpoint NOT saved: {exc}"
