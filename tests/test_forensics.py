"""Forensics without MindSpore: the ring's columns and the event's fields (cells/layer_stats.py),
and how StepLogger attaches them to an alarm (gradmon/monitor/forensics.py; fake step cells)."""

from __future__ import annotations

import json
import logging
import math

from gradmon.cells.layer_stats import forensics_columns, forensics_fields, ring_slot

from gradmon.logformat.alarms import AlarmConfig, AlarmRule
from gradmon.logformat.jsonl import encode_record
from gradmon.monitor.forensics import sample_id_lists
from gradmon.monitor.settings import MonitorSettings
from gradmon.monitor.steplog import StepLogger
from tests.test_steplog import Clock, RingCell, Sink, run_steps


def test_columns_are_parameters_until_too_many_then_name_prefixes_then_runs():
    names = ["a.0.w", "a.0.b", "a.1.w", "a.1.b", "head.w"]
    assert forensics_columns(names, 5) == (names, None)
    assert forensics_columns(names, 3) == (["a.0", "a.1", "head.w"], [0, 0, 1, 1, 2])
    assert forensics_columns(names, 2) == (["a", "head"], [0, 0, 0, 0, 1])
    columns, groups = forensics_columns(["x", "y", "z"], 2)  # no prefix to share: consecutive runs
    assert (columns, groups) == (["x..y", "z"], [0, 0, 1])


def test_fields_sort_layers_name_the_top_rank_and_keep_ids_by_rank():
    f = forensics_fields(["a", "b", "c", "d"], [4.0, 100.0, math.nan, 0.0], [1.0, math.inf, 3.0],
                         [[1, 2], [3, 4], [5, 6]], top_k=3)
    assert [r["name"] for r in f["layers"]] == ["c", "b", "a"]  # non-finite first, then largest
    assert math.isnan(f["layers"][0]["grad_norm"]) and f["layers"][1]["grad_norm"] == 10.0
    assert f["layer_count"] == 4 and f["top_rank"] == 1 and f["rank_norms"][1] == math.inf
    assert f["sample_ids"] == [[1, 2], [3, 4], [5, 6]]
    single = forensics_fields(["a"], [1.0], None, None)
    assert set(single) == {"layers", "layer_count"}
    # Non-finite norms are written as the log's strings, so the event stays one strict JSON line.
    assert '"grad_norm":"NaN"' in encode_record({"type": "event", "forensics": f})


def test_ring_slot_finds_the_kept_steps_only():
    assert [ring_slot(5, 3, back) for back in range(4)] == [1, 0, 2, None]
    assert ring_slot(2, 3, 1) == 0 and ring_slot(2, 3, 2) is None and ring_slot(0, 3, 0) is None


def test_sample_id_hook_answers_become_lists_by_rank():
    assert sample_id_lists([3, 4]) == [[3, 4]]
    assert sample_id_lists([[1], [2, 3]]) == [[1], [2, 3]]
    assert sample_id_lists(()) == [[]]


class ForensicCell(RingCell):
    """RingCell plus the forensics contract: ``gradmon_forensics(steps_back)``, ``size`` steps kept."""

    def __init__(self, size: int = 4, fail: bool = False) -> None:
        super().__init__()
        self.kept = size
        self.fail = fail
        self.asked: list[int] = []

    def gradmon_forensics(self, steps_back=0, top_k=10):
        self.asked.append(steps_back)
        if self.fail:
            raise RuntimeError("device gone")
        if self.kept == 0:
            return None  # forensics off
        if steps_back >= min(self.kept, len(self.rows)):
            return {"missing": "left the ring"}
        step = len(self.rows) - steps_back
        return {"layers": [{"name": "w", "grad_norm": self.rows[step - 1][1]}], "layer_count": 1,
                "rank_norms": [0.5, self.rows[step - 1][1]], "top_rank": 1}


def _alarm(sink: Sink) -> dict:
    (alarm,) = [e for e in sink.of("event") if e["kind"] == "alarm"]
    return alarm


def _run(cell, log_interval=4, **kw):
    sink, clock = Sink(), Clock()
    rule = AlarmRule(AlarmConfig(window=8, min_history=4, quiet_steps=3))
    seen: list[dict] = []
    settings = MonitorSettings.from_kwargs("test", "unused.jsonl", log_interval=log_interval,
                                           on_event=seen.append, **kw)
    logger = StepLogger([sink], settings, cell=cell, alarm_rule=rule, clock=clock)
    run_steps(logger, cell, clock, 6, norm=1.0)
    run_steps(logger, cell, clock, 1, norm=50.0)  # step 7 alarms, read at step 8 (one step back)
    run_steps(logger, cell, clock, 5, norm=1.0)
    logger.finish()
    return sink, seen


def test_the_alarm_gets_the_forensics_of_its_own_step_once_per_incident():
    cell = ForensicCell()
    sink, seen = _run(cell, sample_ids=lambda step: [[step * 10], [step * 10 + 1]])
    alarm = _alarm(sink)
    assert alarm["forensics"] == {"step": 7, "layers": [{"name": "w", "grad_norm": 50.0}], "layer_count": 1,
                                  "rank_norms": [0.5, 50.0], "top_rank": 1, "sample_ids": [[70], [71]]}
    assert cell.asked == [1]  # step 8 was the last run when step 7 was judged; asked once
    assert next(e for e in seen if e["kind"] == "alarm")["forensics"] == alarm["forensics"]
    assert all("forensics" not in r for r in sink.records if r is not alarm)
    json.loads(encode_record(alarm))


def test_a_step_that_left_the_ring_is_named_missing_and_the_hook_still_answers():
    sink, _ = _run(ForensicCell(size=1), sample_ids=lambda step: [step])
    f = _alarm(sink)["forensics"]
    assert f == {"step": 7, "missing": "left the ring", "sample_ids": [[7]]}


def test_a_failing_read_is_written_into_the_event_and_training_goes_on(caplog):
    with caplog.at_level(logging.WARNING, logger="gradmon.monitor.callback"):
        sink, _ = _run(ForensicCell(fail=True))
    f = _alarm(sink)["forensics"]
    assert f == {"step": 7, "error": "RuntimeError: device gone"}
    assert "reading the forensics of step 7 failed" in caplog.text
    assert sink.of("step")[-1]["step"] == 12


def test_without_forensics_or_hook_the_alarm_is_unchanged():
    sink, _ = _run(RingCell())
    assert "forensics" not in _alarm(sink)
    sink, _ = _run(ForensicCell(size=0))  # a cell that could keep them, built with forensics=0
    assert "forensics" not in _alarm(sink)
