"""The settings of a ``LiveMonitor`` and the run-log segment it has open.

:class:`MonitorSettings` validates the monitor's options once. :class:`Segment` is what one
``start`` opens and one ``close`` ends: the header, a writer per file this rank writes, the
:class:`~gradmon.monitor.steplog.StepLogger` that turns steps into records, the segment's alarm rule
(a fresh one per segment, as for a new process: a resumed segment never continues an incident of
the one before) and the system sampler.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Callable

from gradmon.logformat.alarms import AlarmConfig, AlarmRule
from gradmon.monitor.header import distributed, header_fields
from gradmon.monitor.lr import LrReader
from gradmon.monitor.steplog import StepLogger
from gradmon.monitor.training_state import overflow_floor, save_abort_checkpoint
from gradmon.monitor.writer import RunLogWriter

__all__ = ["MonitorSettings", "Segment", "alarm_config_of", "rank_log_path"]

_log = logging.getLogger("gradmon.monitor.callback")


def rank_log_path(log_file: str, rank: int) -> str:
    """``dir/metrics.jsonl`` -> ``dir/metrics.rank<rank>.jsonl``."""
    root, ext = os.path.splitext(log_file)
    return f"{root}.rank{rank}{ext or '.jsonl'}"


def alarm_config_of(value: AlarmConfig | Mapping[str, Any] | None) -> AlarmConfig:
    """The alarm rule's settings from an :class:`AlarmConfig`, a dict of some of its fields (numpy
    scalars welcome; the rest default) or None (all defaults). An unknown name is an error."""
    if value is None:
        return AlarmConfig()
    if isinstance(value, AlarmConfig):
        return value
    if not isinstance(value, Mapping):
        raise TypeError(f"alarm_config must be an AlarmConfig, a dict of its fields or None, "
                        f"got {type(value).__name__}")
    known = [f.name for f in fields(AlarmConfig)]
    unknown = sorted(str(k) for k in value if k not in known)
    if unknown:
        raise ValueError(f"alarm_config: unknown setting(s) {', '.join(unknown)}; known: {', '.join(known)}")
    # numpy scalars -> Python numbers (AlarmConfig checks int/float; np.float32 is neither)
    plain = {k: v.item() if type(v).__module__ == "numpy" and hasattr(v, "item") else v
             for k, v in value.items()}
    return AlarmConfig(**plain)


@dataclass(frozen=True)
class MonitorSettings:
    """The options of :class:`gradmon.monitor.callback.LiveMonitor` (see there), validated."""

    log_file: str
    log_interval: int = 1
    config: Mapping[str, Any] = field(default_factory=dict)
    batch_size: int | None = None
    per_rank: bool = False
    system_metrics: bool = False
    system_interval: float = 5.0
    abort_after: int | None = None
    abort_checkpoint: str | None = None
    layer_stats_every: int = 0
    layer_top_k: int = 10
    initial_step: int | None = None
    on_event: Callable[[dict[str, Any]], Any] | None = None
    retry_initial: float = 1.0
    alarms: bool = True
    alarm_config: AlarmConfig | Mapping[str, Any] | None = None  # normalised: None iff not alarms
    sample_ids: Callable[[int], Any] | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise once, here
        if int(self.log_interval) < 1:
            raise ValueError(f"log_interval must be >= 1, got {self.log_interval}")
        if self.abort_after is not None and int(self.abort_after) < 1:
            raise ValueError(f"abort_after must be >= 1 or None, got {self.abort_after}")
        if self.initial_step is not None and int(self.initial_step) < 0:
            raise ValueError(f"initial_step must be >= 0 or None, got {self.initial_step}")
        if self.on_event is not None and not callable(self.on_event):
            raise TypeError(f"on_event must be callable, got {type(self.on_event).__name__}")
        if self.sample_ids is not None and not callable(self.sample_ids):
            raise TypeError("sample_ids must be callable (step -> ids), "
                            f"got {type(self.sample_ids).__name__}")
        for name in ("log_interval", "layer_stats_every", "layer_top_k"):
            set_(self, name, int(getattr(self, name)))
        for name in ("abort_after", "initial_step"):
            if getattr(self, name) is not None:
                set_(self, name, int(getattr(self, name)))
        if self.abort_checkpoint is not None:
            set_(self, "abort_checkpoint", os.fspath(self.abort_checkpoint))
        set_(self, "config", dict(self.config or {}))
        if not (isinstance(self.alarms, bool) or type(self.alarms).__name__ == "bool_"):
            raise TypeError(f"alarms must be True or False, got {self.alarms!r}")
        set_(self, "alarms", bool(self.alarms))
        if not self.alarms and self.alarm_config is not None:
            raise ValueError("alarm_config was given with alarms=False: drop one of them")
        set_(self, "alarm_config", alarm_config_of(self.alarm_config) if self.alarms else None)


class Segment:
    """One open segment of a monitor's run log.

    ``initial_step``: the last step before the segment (``initial_step_from`` says where it came
    from, for the header); ``on_stop``: called when the abort policy fires.
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
        )
        paths = ([settings.log_file] if self.rank == 0 else []) + (
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
            self.writers, log_interval=settings.log_interval, initial_step=initial_step, cell=cell,
            samples_per_step=None if batch_size is None else int(batch_size) * world_size,
            abort_after=settings.abort_after, on_event=settings.on_event,
            save_checkpoint=self._save_abort_checkpoint if saves else None, on_stop=on_stop,
            layer_stats_every=settings.layer_stats_every, layer_top_k=settings.layer_top_k,
            alarm_rule=AlarmRule(config) if isinstance(config, AlarmConfig) and self.writers else None,
            sample_ids=settings.sample_ids,
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
