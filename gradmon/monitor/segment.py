"""The run-log segment a ``LiveMonitor`` has open.

:class:`Segment` is what one ``start`` opens and one ``close`` ends, built from the monitor's
:class:`~gradmon.monitor.settings.MonitorSettings`: the header, a writer per file this rank writes, the
:class:`~gradmon.monitor.steplog.StepLogger` that turns steps into records, the segment's alarm rule
(a fresh one per segment, as for a new process: a resumed segment never continues an incident of
the one before) and the system sampler.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any, Callable

from gradmon.logformat.alarms import AlarmConfig, AlarmRule
from gradmon.monitor.header import context_pipeline_stages, distributed, header_fields
from gradmon.monitor.lr import LrReader
from gradmon.monitor.settings import MonitorSettings
from gradmon.monitor.steplog import StepLogger
from gradmon.monitor.training_state import overflow_floor, save_abort_checkpoint
from gradmon.monitor.writer import RunLogWriter
from gradmon.monitor.writer_rank import writer_rank

__all__ = ["Segment", "rank_log_path"]

_log = logging.getLogger("gradmon.monitor.callback")


def rank_log_path(log_file: str, rank: int) -> str:
    """``dir/metrics.jsonl`` -> ``dir/metrics.rank<rank>.jsonl``."""
    root, ext = os.path.splitext(log_file)
    return f"{root}.rank{rank}{ext or '.jsonl'}"


class Segment:
    """One open segment of a monitor's run log.

    ``initial_step``: the last step before the segment (``initial_step_from`` says where it came
    from, for the header); ``on_stop``: called when the abort policy fires. ``pipeline_stages``:
    for the writer rank (default: MindSpore's auto-parallel context); ``samples_per_step``: samples
    per step over all ranks when known as such (default ``batch_size * world_size``);
    ``header_extra``: more header fields (a trainer's settings).
    """

    def __init__(
        self,
        settings: MonitorSettings,
        *,
        cell: Any,
        optimizer: Any,
        initial_step: int,
        initial_step_from: str,
        steps_per_epoch: int | None,
        steps_per_epoch_unknown: str | None,
        batch_size: int | None,
        on_stop: Callable[[], Any],
        pipeline_stages: int | None = None,
        samples_per_step: int | None = None,
        header_extra: Mapping[str, Any] | None = None,
    ) -> None:
        self.settings = settings
        self.initial_step = initial_step
        self.steps_per_epoch = steps_per_epoch
        self.rank, world_size = distributed()
        config = settings.alarm_config
        header = header_fields(
            cell=cell, config=settings.config, log_interval=settings.log_interval, rank=self.rank,
            world_size=world_size, batch_size=batch_size, steps_per_epoch=steps_per_epoch,
            steps_per_epoch_unknown=steps_per_epoch_unknown, initial_step=initial_step,
            initial_step_from=initial_step_from,
            alarm_rule=config.as_dict() if isinstance(config, AlarmConfig) else None,
            recovery=settings.recovery.as_dict() if settings.recovery is not None else None,
        )
        header.update(header_extra or {})
        stages = pipeline_stages if pipeline_stages is not None else context_pipeline_stages()
        self.writer_rank = writer_rank(world_size, stages, settings.writer_rank)
        paths = ([settings.log_file] if self.rank == self.writer_rank else []) + (
            [rank_log_path(settings.log_file, self.rank)] if settings.per_rank else [])
        self.writers: list[RunLogWriter] = []
        try:
            for path in paths:
                self.writers.append(RunLogWriter(path, header=header, retry_initial=settings.retry_initial))
        except Exception:  # e.g. LogInUseError: give back what this segment holds
            for w in self.writers:
                w.close(None)
            raise
        saves = settings.abort_checkpoint is not None and self.rank == 0  # DP weights agree on every rank
        self.logger = StepLogger(
            self.writers, settings, initial_step=initial_step, cell=cell,
            samples_per_step=samples_per_step if samples_per_step is not None
            else None if batch_size is None else int(batch_size) * world_size,
            save_checkpoint=self._save_abort_checkpoint if saves else None, on_stop=on_stop,
            alarm_rule=AlarmRule(config) if isinstance(config, AlarmConfig) and self.writers else None,
        )
        self.bind(cell, optimizer)
        self._sampler: Any = None
        if settings.system_metrics and self.writers:
            import mindspore as ms

            from gradmon.monitor.sysmetrics import SystemSampler

            logger = self.logger
            self._sampler = SystemSampler(logger.emit, lambda: logger.step, interval=settings.system_interval,
                                          device_target=ms.get_context("device_target"))
            self._sampler.start()

    def bind(self, cell: Any, optimizer: Any) -> None:
        """Read history, rate, loss-scale floor and layer stats from this cell and optimizer."""
        self.logger.cell = cell
        reader = LrReader(optimizer, pad_to=self.settings.log_interval) if optimizer is not None else None
        self.logger.lr_reader = reader
        self.logger.overflow_floor = overflow_floor(cell)

    @property
    def dropped_records(self) -> int:
        return sum(w.dropped_records for w in self.writers)

    def close(self, status: str | None) -> None:
        """Stop the sampler, write the pending steps and the ``end`` record (``status``; default
        ``aborted`` after an abort, else ``finished``), close the files."""
        if self._sampler is not None:
            self._sampler.stop()
            self._sampler = None
        try:
            self.logger.flush()
        except Exception as exc:  # the device may be gone after a crash; the end record matters more
            _log.warning("gradmon: could not read the last steps: %s", exc)
        self.logger.finish()  # the open incident's alarm_end, before the end record
        final = status or ("aborted" if self.logger.aborted else "finished")
        for w in self.writers:
            w.close(final, steps=self.logger.step)

    def _save_abort_checkpoint(self) -> tuple[str | None, str]:
        assert self.settings.abort_checkpoint is not None
        return save_abort_checkpoint(self.logger.cell, self.settings.abort_checkpoint)
