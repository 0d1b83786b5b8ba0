"""``LiveMonitor``: the MindSpore callback that writes the run log (docs/format.md).

A thin adapter: MindSpore's callback hooks (and ``log`` / ``after_step`` for hand-written loops)
are turned into calls of :class:`gradmon.monitor.steplog.StepLogger`, which owns the read interval, the
records, their events and the abort policy. What MindSpore tells about the run goes into the
header (:mod:`gradmon.monitor.header`); where a resumed run continues comes from the restored training
state (:mod:`gradmon.monitor.training_state`).

Host cost per step: a non-log step is two ``time.perf_counter()`` calls and a few integer
operations (no tensor is read). Every ``log_interval`` steps the monitor reads the device once:
the step cell's history ring when it has one (``gradmon_read_history``, see docs/design.md) —
then every step since the last read gets its own record — or else the last step's outputs.

Outside ``Model.train``: ``log(step, **metrics)`` and ``log_eval(step, **metrics)`` write records
directly; ``attach(cell, optimizer)`` + ``after_step(outputs)`` after each step of a hand-written
loop gives the same interval logic as under ``Model``; ``start(initial_step=N)`` opens the segment
at a step of your choosing; ``close()`` (or ``with``) ends the run; ``should_stop`` turns true when
the abort policy fires.

Gradient accumulation (a cell with ``grad_accum_steps=N``): the loop calls the cell once per
micro-batch, the monitor counts optimizer steps. Under ``Model.train`` step ``s`` is done at the
loop's step ``s * N`` (its ``cur_step_num`` divided by N, rounded down); an epoch of B batches is
``B // N`` steps and a step's samples are N batches. In a hand-written loop call ``after_step``
after every call of the cell (each N-th one completes a step). Records are per optimizer step.
Automatic recovery acts at optimizer-step boundaries only, and counts optimizer steps (its
``every``, ``skip_batches`` and ``window``; a held step is N batches, each run and undone).
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

from mindspore.train import Callback

from gradmon.logformat.jsonl import to_jsonable
from gradmon.logformat.schema import FLAG_FIELDS
from gradmon.monitor.outputs import parse_step_outputs, to_float, to_host
from gradmon.monitor.records import eval_metrics, resumed_epoch_offset
from gradmon.monitor.rollback import RecoveryDriver, RecoveryHooks
from gradmon.monitor.segment import Segment, rank_log_path
from gradmon.monitor.settings import MonitorSettings
from gradmon.monitor.steplog import StepLogger
from gradmon.monitor.training_state import accumulation_steps, batch_size, epoch_length, restored_step

__all__ = ["LiveMonitor", "log_file_path", "rank_log_path"]

_log = logging.getLogger("gradmon.monitor.callback")

LOG_FILE_NAME = "metrics.jsonl"
_EPOCH_LENGTH_NOT_GIVEN = "not given (a hand-written loop: pass steps_per_epoch to start())"


def log_file_path(path: str | os.PathLike[str]) -> str:
    """The run log a ``LiveMonitor(path)`` writes: ``path`` itself when it ends in ``.jsonl``,
    else ``path/metrics.jsonl`` (a run directory, as TensorBoard's ``SummaryWriter(log_dir)``), so
    ``gradmon serve`` on the parent lists it as the run ``path``'s name. One exception keeps older
    runs going: an existing gradmon log without the suffix (its first line a ``header``) is itself."""
    text = os.fspath(path)
    separators = tuple(s for s in (os.sep, os.altsep) if s)
    names_a_file = not text.endswith(separators) and not os.path.isdir(text)
    if names_a_file and (text.lower().endswith(".jsonl") or _is_run_log(text)):
        return text
    return os.path.join(text, LOG_FILE_NAME)


def note_unlisted_name(log_file: str) -> None:
    """Say once, at the start, when ``gradmon serve`` will not list ``log_file`` (a run is a
    directory holding ``metrics.jsonl``): the seed of many a blank page."""
    if os.path.basename(log_file) != LOG_FILE_NAME:
        run = os.path.splitext(log_file)[0]
        _log.warning("gradmon: %s is not named %s, so gradmon serve will not list it (a run is a directory "
                     "holding %s); LiveMonitor(%r) writes the run %r", log_file, LOG_FILE_NAME, LOG_FILE_NAME,
                     run, os.path.basename(run))


def _is_run_log(path: str) -> bool:
    """Whether ``path`` is a regular file whose first line is a run-log ``header`` record."""
    try:
        with open(path, "rb") as f:
            first = f.readline(1 << 16)
        return json.loads(first).get("type") == "header"
    except (OSError, ValueError, AttributeError):
        return False


def _metric_value(value: Any) -> Any:
    """A user/eval metric as a float when it is a scalar, else plain JSON data."""
    host = to_host(value)
    if isinstance(host, (bool, int, float)) or getattr(host, "size", 2) == 1:
        number = to_float(host)
        if number is not None:
            return number
    return to_jsonable(host)


_TRAINER_CALLBACK_HINT = (
    "LiveMonitor is a MindSpore Callback; mindformers' PyNative Trainer calls TrainerCallback hooks: use "
    "gradmon.integrations.mindformers.MindFormersLiveMonitor (YAML: callbacks: [{type: LiveMonitor}]) or "
    "gradmon.integrations.trainer_callback.TrainerLiveMonitor")


class LiveMonitor(RecoveryHooks, Callback):
    """Write a live run log of a MindSpore training run.

    Args:
        log_file: the run log, e.g. ``logs/exp001/metrics.jsonl``; a path not ending in ``.jsonl``
            is a run directory: ``LiveMonitor("logs/exp001")`` writes ``logs/exp001/metrics.jsonl``
            (:func:`log_file_path`). Directories are created; the file is appended to, so a
            restarted run adds a new segment. One writer per log: a second one raises
            :class:`gradmon.monitor.writelock.LogInUseError`.
        log_interval: read the device on steps that are multiples of this (and before an
            evaluation and at the end).
        **options: the monitor's other options, each described in
            :class:`~gradmon.monitor.settings.MonitorSettings` (``config``, ``batch_size``,
            ``per_rank``, ``system_metrics``, ``abort_after``, ``abort_checkpoint``,
            ``layer_stats_every``, ``initial_step``, ``on_event``, ``alarms``, ``alarm_config``...);
            validated once into :attr:`settings`. An unknown name raises ``TypeError`` listing them.

    Hand-written loops: see the module docstring (``log``, ``attach`` + ``after_step``, ``close``).
    """

    def __init__(self, log_file: str | os.PathLike[str], log_interval: int = 1, **options: Any) -> None:
        super().__init__()
        self.settings = MonitorSettings.from_kwargs(type(self).__name__, log_file_path(log_file),
                                                    log_interval=log_interval, **options)
        note_unlisted_name(self.settings.log_file)
        self._cell: Any = None
        self._optimizer: Any = None
        self._segment: Segment | None = None  # the open (or last) segment
        self._started = False
        self._run_context: Any = None
        self._step_offset = 0  # global step = Model's cur_step_num // accumulation + this
        self._accumulation = 1  # calls of the step cell per optimizer step (its grad_accum_steps)
        self._micro_calls = 0  # after_step calls (hand-written loops)
        self._epoch_offset: int | None = None  # epoch = Model's cur_epoch_num + this (set at the 1st step)
        self._eval_losses: list[float] = []  # per-batch losses of the evaluation under way
        self._depth = 0  # nesting of `with` blocks (Model enters callbacks for train and eval)
        self._recovery_config = self.settings.recovery
        self.recovery: RecoveryDriver | None = None  # created with the first segment
        self._segment_args: tuple[Any, ...] = ()

    @property
    def should_stop(self) -> bool:
        """True once the abort policy has fired (for hand-written loops)."""
        return self._segment is not None and self._segment.logger.aborted

    @property
    def dropped_records(self) -> int:
        """Records lost to I/O errors, over all files this monitor writes."""
        return self._segment.dropped_records if self._segment is not None else 0

    @property
    def step(self) -> int:
        """The last training step seen."""
        return self._segment.logger.step if self._segment is not None else 0

    def attach(self, cell: Any, optimizer: Any = None) -> LiveMonitor:
        """Use ``cell`` (e.g. a ``MonitoredTrainStep``) for history reads, its config, layer stats
        and restored step counter in a hand-written loop; ``optimizer`` (default
        ``cell.optimizer``) for the rate and its ``global_step``."""
        self._cell = cell
        self._optimizer = optimizer if optimizer is not None else getattr(cell, "optimizer", None)
        self._accumulation, self._micro_calls = accumulation_steps(cell), 0
        if self._started and self._segment is not None:
            self._segment.bind(self._cell, self._optimizer)
        return self

    # -- starting and ending a segment --------------------------------------------------------

    def start(self, *, initial_step: int | None = None, steps_per_epoch: int | None = None,
              batch_size: int | None = None) -> None:
        """Open the log and write the header (``on_train_begin`` and the first ``log`` /
        ``after_step`` call do this). ``initial_step``: the last step done before this segment
        (default: the monitor's ``initial_step``, else the restored training state). A segment
        started here and still without steps is the one ``Model.train`` then continues."""
        unknown = None if steps_per_epoch else _EPOCH_LENGTH_NOT_GIVEN
        self._open_segment(initial_step, steps_per_epoch, unknown, batch_size)

    def _open_segment(self, initial_step: int | None, steps_per_epoch: int | None,
                      steps_per_epoch_unknown: str | None, batch_size: int | None, *,
                      steps_run: int = 0, initial_step_from: str | None = None,
                      **segment_options: Any) -> None:
        """``steps_run``: steps already done in this segment (``after_step`` opens it after the
        loop's first step, which the training state then counts already). ``initial_step_from``:
        where a given ``initial_step`` came from; ``segment_options``: :class:`Segment`'s optional
        arguments (a trainer adapter's pipeline stages, samples per step, header fields)."""
        if self._started:
            return
        if initial_step is None:
            initial_step = self.settings.initial_step
        if initial_step is not None:
            step, source = int(initial_step), initial_step_from or "argument"
        else:
            step, source = restored_step(self._cell, self._optimizer)
            step = max(step - steps_run, 0)
        self._segment = Segment(
            self.settings, cell=self._cell, optimizer=self._optimizer, initial_step=step,
            initial_step_from=source, steps_per_epoch=steps_per_epoch,
            steps_per_epoch_unknown=steps_per_epoch_unknown,
            batch_size=batch_size if batch_size is not None else self.settings.batch_size,
            on_stop=self._request_stop, **segment_options,
        )
        self._started, self._epoch_offset = True, None
        self._segment_args = (steps_per_epoch, steps_per_epoch_unknown, batch_size)
        if self._recovery_config is not None:
            if self.recovery is None:
                self.recovery = RecoveryDriver(self._recovery_config, self._cell,
                                               alarm_config=self.settings.alarm_config)
            self.recovery.begin_segment(step)
            self._segment.logger.watch = self.recovery.observe

    def close(self, status: str | None = None) -> None:
        """Write the pending steps and the ``end`` record, close the files. Idempotent.

        ``status``: ``finished`` / ``aborted`` / ``interrupted`` / ``failed``; default
        ``aborted`` after an abort, else ``finished``."""
        if self._started and self._segment is not None:
            self._started = False
            self._segment.close(status)

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

    def _request_stop(self) -> None:
        if self._run_context is not None:
            self._run_context.request_stop()

    # -- MindSpore callback hooks -------------------------------------------------------------

    @property
    def _logger(self) -> StepLogger:
        assert self._segment is not None, "no segment open"
        return self._segment.logger

    def on_train_begin(self, run_context: Any, *args: Any, **kwargs: Any) -> None:
        if args or kwargs:  # mindformers 2.x's PyNative Trainer: on_train_begin(config, state, model=...)
            raise TypeError(_TRAINER_CALLBACK_HINT)
        cb = run_context.original_args()
        self.attach(cb.train_network, cb.get("optimizer"))
        if self._started and self._logger.step > self._segment.initial_step:
            self.close()  # a monitor reused for a second train(): a new segment
        if not self._started:
            steps, unknown = epoch_length(cb)
            per_batch = self.settings.batch_size or batch_size(cb)
            n = self._accumulation  # an optimizer step takes n of the loop's steps (batches)
            self._open_segment(None, steps // n if steps else steps, unknown,
                               per_batch * n if per_batch else per_batch)
        self._run_context = run_context
        # Model counts from 0 (or its initial_step) in every process: continue from the segment's start.
        self._step_offset = self._logger.step - int(cb.get("cur_step_num") or 0) // self._accumulation

    def on_train_step_begin(self, run_context: Any) -> None:
        if not self._holding():
            self._logger.step_begin()

    def on_train_step_end(self, run_context: Any) -> None:
        cb = run_context.original_args()
        if self._holding():
            self._undo_held_step()
            # The next batch is the next step (a hold is whole optimizer steps: the count stays in phase).
            self._step_offset = self._logger.step - int(cb.cur_step_num) // self._accumulation
            return
        epoch = cb.cur_epoch_num
        if self._epoch_offset is None:
            seg = self._segment
            self._epoch_offset = resumed_epoch_offset(seg.initial_step, seg.steps_per_epoch, epoch)
        self._logger.step_end(int(cb.cur_step_num) // self._accumulation + self._step_offset, cb.net_outputs,
                              epoch=epoch + self._epoch_offset)
        self._recover(int(cb.cur_step_num) % self._accumulation == 0)

    def on_train_end(self, run_context: Any) -> None:
        self.close()

    def on_eval_begin(self, run_context: Any) -> None:
        # Write the training steps before the eval record (the eval syncs the device anyway).
        if self._started:
            self._logger.flush()
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
        metrics = eval_metrics(cb.get("eval_results") or cb.get("metrics") or {}, self._eval_losses)
        self._eval_losses = []
        self.log_eval(self._logger.step, **metrics)
        self._logger.pause()  # evaluation time is neither a training step nor an input stall

    # -- hand-written loops -------------------------------------------------------------------

    def log(self, step: int, *, epoch: int | None = None, **metrics: Any) -> None:
        """Write a ``step`` record for a hand-written loop: ``monitor.log(step, loss=..., lr=...)``.

        Tensor values are read here. Non-finite loss/norm and ``skipped``/``nonfinite``/``spike``
        flags produce events and count for the abort policy (see :attr:`should_stop`)."""
        self.start()
        fields = {key: bool(value) if key in FLAG_FIELDS else _metric_value(value)
                  for key, value in metrics.items()}
        self._logger.log_step(step, fields, epoch=epoch)

    def log_eval(self, step: int | None = None, **metrics: Any) -> None:
        """Write an ``eval`` record at training step ``step`` (default: the current one)."""
        self.start()
        logger = self._logger
        at = int(logger.step if step is None else step)
        record: dict[str, Any] = {"type": "eval", "step": at, "epoch": logger.epochs.epoch_at(at),
                                  "ts": time.time()}
        record.update({str(key): _metric_value(value) for key, value in metrics.items()})
        logger.emit(record)

    def after_step(self, outputs: Any = None, *, epoch: int | None = None) -> None:
        """Count one step of a hand-written loop (``outputs``: what the step cell returned; kept
        as a reference and only read on log steps). Same interval logic as under ``Model``. The
        first call opens the segment (unless ``start`` did): the training state counts this step
        already, so the segment starts one step before it."""
        self._micro_calls += 1
        done = int(self._micro_calls % self._accumulation == 0)  # this call ran the optimizer
        if not self._started:
            self._open_segment(None, None, _EPOCH_LENGTH_NOT_GIVEN, None, steps_run=done)
        if self._holding():
            self._undo_held_step()
            return
        logger = self._logger
        logger.step_end(logger.step + done, outputs, epoch=epoch)
        self._recover(bool(done))
