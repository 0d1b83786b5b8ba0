"""StepLogger alone, without MindSpore: read interval, history vs outputs, alignment, abort policy,
``on_event``, sink-mode epochs, layer stats, the alarm rule's wiring (fake step cells, writers, clock)."""

from __future__ import annotations

import logging
import math
import subprocess
import sys
import types

import numpy as np

from gradmon.logformat.alarms import AlarmConfig, AlarmRule
from gradmon.monitor.settings import MonitorSettings
from gradmon.monitor.steplog import StepLogger

FIELDS = ("loss", "grad_norm", "skipped", "nonfinite")


SETTING_NAMES = ("log_interval", "abort_after", "on_event", "layer_stats_every", "layer_top_k")


def logger_of(sinks, **kwargs) -> StepLogger:
    """A StepLogger whose monitor options (the MonitorSettings it reads) come from ``kwargs`` too."""
    options = {name: kwargs.pop(name) for name in SETTING_NAMES if name in kwargs}
    return StepLogger(sinks, MonitorSettings.from_kwargs("test", "unused.jsonl", **options), **kwargs)


class Sink:
    def __init__(self) -> None:
        self.records: list[dict] = []
        self.closed = False

    def write(self, record) -> bool:
        self.records.append(dict(record))
        return True

    def of(self, kind: str) -> list[dict]:
        return [r for r in self.records if r["type"] == kind]


class RingCell:
    """A step cell keeping the history contract on the host: rows appended by ``run``."""

    def __init__(self, size: int = 64) -> None:
        self.rows: list[list[float]] = []
        self.size = size
        self.reads = 0
        self.layer_calls = 0

    def run(self, loss: float = 1.0, norm: float = 2.0, skipped: bool = False) -> None:
        bad = not (math.isfinite(loss) and math.isfinite(norm))
        self.rows.append([loss, norm, float(skipped or bad), float(bad)])

    def gradmon_read_history(self):
        self.reads += 1
        kept = self.rows[-self.size:]
        return types.SimpleNamespace(total_steps=len(self.rows), fields=FIELDS,
                                     rows=np.array(kept, dtype=np.float64).reshape(-1, len(FIELDS)))

    def gradmon_layer_stats(self, top_k=10):
        self.layer_calls += 1
        return [{"name": "w", "grad_norm": 1.0}]


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Rates:
    """An lr reader: step i's rate is 0.1 * i (skipped steps ignored)."""

    def __init__(self, logger_ref: list) -> None:
        self.logger_ref = logger_ref
        self.calls: list[tuple[int, list[bool]]] = []

    def values(self, n, skipped):
        self.calls.append((n, list(skipped)))
        last = self.logger_ref[0].step
        return [0.1 * s for s in range(last - n + 1, last + 1)]


def run_steps(logger: StepLogger, cell: RingCell, clock: Clock, n: int, **kw) -> None:
    for _ in range(n):
        logger.step_begin()
        clock.t += 0.25  # the step
        cell.run(**kw)
        logger.step_end(logger.step + 1, outputs=None, epoch=1)


def test_one_read_per_interval_every_step_recorded_with_aligned_values():
    sink, cell, clock = Sink(), RingCell(), Clock()
    ref: list = []
    rates = Rates(ref)
    logger = logger_of([sink], log_interval=4, cell=cell, lr_reader=rates, samples_per_step=8, clock=clock)
    ref.append(logger)
    run_steps(logger, cell, clock, 10)
    assert cell.reads == 2 and [r["step"] for r in sink.of("step")] == list(range(1, 9))
    logger.flush()  # the end of training
    steps = sink.of("step")
    assert [r["step"] for r in steps] == list(range(1, 11)) and cell.reads == 3
    assert [r["lr"] for r in steps] == [0.1 * s for s in range(1, 11)]
    assert rates.calls == [(4, [False] * 4), (4, [False] * 4), (2, [False] * 2)]
    assert all(r["step_time"] == 0.25 and r["throughput"] == 32.0 and r["data_time"] == 0.0 for r in steps)


def test_plain_outputs_are_read_on_log_steps_only():
    sink, clock = Sink(), Clock()
    logger = logger_of([sink], log_interval=3, clock=clock)

    class Poison:
        def __getattr__(self, name):
            raise AssertionError("outputs read off a log step")

    for step in range(1, 7):
        outputs = (np.float32(step), np.float32(2 * step)) if step % 3 == 0 else Poison()
        logger.step_end(step, outputs)
    got = [(r["step"], r["loss"], r["grad_norm"]) for r in sink.of("step")]
    assert got == [(3, 3.0, 6.0), (6, 6.0, 12.0)]


def test_abort_is_placed_at_the_step_that_reached_the_limit_and_saves_first():
    sink, cell, clock = Sink(), RingCell(), Clock()
    calls: list[str] = []
    logger = logger_of([sink], log_interval=10, cell=cell, abort_after=3, clock=clock,
                        save_checkpoint=lambda: (calls.append("save"), ("/ckpt/a.ckpt", ""))[1],
                        on_stop=lambda: calls.append("stop"))
    run_steps(logger, cell, clock, 2)
    run_steps(logger, cell, clock, 6, loss=math.nan, norm=math.nan)
    run_steps(logger, cell, clock, 2)  # read at step 10: bad steps 3..8
    assert calls == ["save", "stop"] and logger.aborted
    recs = sink.records
    (abort,) = [r for r in recs if r.get("kind") == "abort"]
    assert (abort["step"], abort["consecutive"], abort["checkpoint"]) == (5, 3, "/ckpt/a.ckpt")
    i = recs.index(abort)
    assert recs[i - 2]["type"] == "step" and recs[i - 2]["step"] == 5 and recs[i - 1]["kind"] == "nonfinite"


def test_on_event_gets_copies_of_events_and_a_failing_hook_is_logged_once(caplog):
    sink, cell, clock = Sink(), RingCell(), Clock()
    got: list[dict] = []

    def hook(event):
        got.append(event)
        event["kind"] = "changed by user code"
        raise ValueError("user bug")

    logger = logger_of([sink], log_interval=1, cell=cell, on_event=hook, clock=clock)
    with caplog.at_level(logging.WARNING, logger="gradmon.monitor.callback"):
        run_steps(logger, cell, clock, 1, loss=math.nan)
        run_steps(logger, cell, clock, 1, norm=math.inf)
        run_steps(logger, cell, clock, 1)
    assert [e["step"] for e in got] == [1, 2] and [e["kind"] for e in sink.of("event")] == ["nonfinite"] * 2
    assert sum("on_event" in r.message for r in caplog.records) == 1


def test_a_rank_without_writers_reads_only_for_the_abort_policy():
    cell, clock = RingCell(), Clock()
    logger = logger_of([], log_interval=2, cell=cell, clock=clock)
    run_steps(logger, cell, clock, 4)
    assert cell.reads == 0 and logger.logged_step == 4
    stops: list[int] = []
    logger = logger_of([], log_interval=2, cell=cell, abort_after=1, clock=clock,
                        on_stop=lambda: stops.append(logger.step))
    cell.rows.clear()
    run_steps(logger, cell, clock, 2, loss=math.nan)
    assert cell.reads == 1 and stops == [2] and logger.aborted


def test_sink_mode_epochs_and_data_time():
    # One callback per sink of 4 steps; the loop's epoch changes with the second sink.
    sink, cell, clock = Sink(), RingCell(), Clock()
    logger = logger_of([sink], log_interval=1, cell=cell, clock=clock)
    for last, epoch in ((4, 1), (8, 2)):
        logger.step_begin()
        for _ in range(4):
            cell.run()
        clock.t += 1.0
        logger.step_end(last, None, epoch=epoch)
    steps = sink.of("step")
    assert [(r["step"], r["epoch"]) for r in steps] == [(s, 1 if s <= 4 else 2) for s in range(1, 9)]
    assert [r.get("data_time") for r in steps] == [None, None, None, 0.0] * 2
    assert all(r["step_time"] == 0.25 for r in steps)


def test_initial_step_and_layer_stats():
    sink, cell, clock = Sink(), RingCell(), Clock()
    cell.run()
    cell.run()  # two steps before this segment, restored with the cell
    logger = logger_of([sink], log_interval=2, initial_step=2, cell=cell, layer_stats_every=3, clock=clock)
    run_steps(logger, cell, clock, 6)
    assert [r["step"] for r in sink.of("step")] == [3, 4, 5, 6, 7, 8]
    assert [r["step"] for r in sink.of("layers")] == [4, 6]  # the first log step at or after 3 and 6
    assert sink.of("layers")[0]["top"] == [{"name": "w", "grad_norm": 1.0}]


def test_failing_history_read_falls_back_to_the_outputs(caplog):
    sink, clock = Sink(), Clock()

    class Broken:
        reads = 0

        def gradmon_read_history(self):
            self.reads += 1
            raise RuntimeError("gone")

    cell = Broken()
    logger = logger_of([sink], log_interval=1, cell=cell, clock=clock)
    for step in (1, 2):
        logger.step_end(step, (np.float32(1.0), np.float32(3.0)))
    assert cell.reads == 1 and [r["grad_norm"] for r in sink.of("step")] == [3.0, 3.0]


def test_steplog_does_not_import_mindspore():
    code = ("import sys, gradmon.monitor.steplog, gradmon.monitor.records, gradmon.monitor.writer, "
            "gradmon.logformat.reader; print('mindspore' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False"


# -- the alarm rule -------------------------------------------------------------------------------


def _kinds(sink: Sink) -> list[tuple]:
    return [(r["type"], r.get("kind"), r.get("step")) for r in sink.records]


def test_alarm_events_follow_each_step_and_its_events_and_reach_on_event():
    sink, cell, clock = Sink(), RingCell(), Clock()
    seen: list[dict] = []
    rule = AlarmRule(AlarmConfig(window=8, min_history=4, quiet_steps=3))
    logger = logger_of([sink], log_interval=4, cell=cell, alarm_rule=rule, on_event=seen.append, clock=clock)
    run_steps(logger, cell, clock, 6, norm=1.0)
    run_steps(logger, cell, clock, 1, norm=50.0)  # step 7: 50x the median and the envelope
    run_steps(logger, cell, clock, 1, loss=math.nan)  # step 8 joins the incident
    run_steps(logger, cell, clock, 4, norm=1.0)  # 12 - 8 > quiet_steps: the incident ends at step 12
    kinds = _kinds(sink)
    at = kinds.index(("event", "alarm", 7))
    assert kinds[at - 1] == ("step", None, 7)
    assert kinds[at + 1:at + 3] == [("step", None, 8), ("event", "nonfinite", 8)]  # no second alarm
    (alarm,) = [e for e in sink.of("event") if e["kind"] == "alarm"]
    assert (alarm["reason"], alarm["value"], alarm["baseline"]) == ("grad_norm_spike", 50.0, 1.0)
    (end,) = [e for e in sink.of("event") if e["kind"] == "alarm_end"]
    assert kinds[kinds.index(("event", "alarm_end", 8)) - 1] == ("step", None, 12)  # judged with step 12
    assert (end["start"], end["flagged"], end["reasons"]) == (7, 2, {"grad_norm_spike": 1, "nonfinite": 1})
    assert [(e["kind"], e["step"]) for e in seen] == [(e["kind"], e["step"]) for e in sink.of("event")]
    assert [e["kind"] for e in seen] == ["alarm", "nonfinite", "alarm_end"]
    logger.finish()
    assert len(sink.records) == len(kinds)  # nothing open: finish writes nothing


def test_an_abort_goes_through_the_rule_and_finish_ends_the_incident_once():
    # Skipped updates (e.g. the spike rule's) with finite values: the rule flags none of them, so
    # the abort opens the incident itself, right after the abort event.
    sink, cell, clock = Sink(), RingCell(), Clock()
    logger = logger_of([sink], log_interval=1, cell=cell, abort_after=2, alarm_rule=AlarmRule(), clock=clock)
    run_steps(logger, cell, clock, 3)
    run_steps(logger, cell, clock, 2, skipped=True)
    kinds = _kinds(sink)
    assert kinds[-4:] == [("step", None, 5), ("event", "skip", 5), ("event", "abort", 5),
                          ("event", "alarm", 5)]
    alarm = sink.records[-1]
    assert alarm["reason"] == "abort"
    assert alarm["message"].startswith("run aborted: training aborted at step 5")
    logger.finish()
    logger.finish()
    (end,) = [e for e in sink.of("event") if e["kind"] == "alarm_end"]
    assert (end["start"], end["step"], end["flagged"], end["reasons"]) == (5, 5, 1, {"abort": 1})


def test_an_abort_joins_the_open_incident():
    sink, cell, clock = Sink(), RingCell(), Clock()
    logger = logger_of([sink], log_interval=3, cell=cell, abort_after=3, alarm_rule=AlarmRule(), clock=clock)
    run_steps(logger, cell, clock, 3, loss=math.nan)
    logger.finish()
    events = [(e["kind"], e["step"]) for e in sink.of("event")]
    assert events == [("nonfinite", 1), ("alarm", 1), ("nonfinite", 2), ("nonfinite", 3), ("abort", 3),
                      ("alarm_end", 3)]
    assert sink.of("event")[-1]["reasons"] == {"nonfinite": 3, "abort": 1}


def test_hand_logged_steps_pass_the_rule_and_without_a_rule_nothing_alarms():
    for rule in (AlarmRule(), None):
        sink = Sink()
        logger = logger_of([sink], alarm_rule=rule)
        logger.log_step(1, {"loss": 1.0})
        logger.log_step(2, {"loss": math.inf})
        logger.finish()
        kinds = [e["kind"] for e in sink.of("event")]
        assert kinds == (["nonfinite", "alarm", "alarm_end"] if rule else ["nonfinite"])


def test_a_rank_without_writers_does_not_run_the_rule():
    cell, clock = RingCell(), Clock()
    rule = AlarmRule()
    logger = logger_of([], log_interval=1, cell=cell, abort_after=1, alarm_rule=rule, clock=clock)
    run_steps(logger, cell, clock, 1, loss=math.nan)
    assert logger.aborted and rule.incident is None
