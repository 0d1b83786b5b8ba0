"""The alarm rule inside ``LiveMonitor``, end to end with real MindSpore training (a tiny MLP on
random data, tests/train_util.py): what the writer logs — the header's ``alarm_rule``, one
``alarm`` per injected fault at its step and its ``alarm_end``, ``on_event`` — with the rule on,
off and tuned, on an abort and across a resume."""

from __future__ import annotations

import math

import mindspore as ms
import numpy as np
import pytest
from mindspore import dataset as ds
from mindspore import nn
from mindspore.train import Model
from train_util import BATCH, IN_DIM, CpuLossScaleStep, NanAwareLoss, mlp, monitored_step, records, segments

from gradmon.logformat.alarms import AlarmConfig, AlarmRule
from gradmon.logformat.schema import ALARM_KINDS
from gradmon.monitor.callback import LiveMonitor

STEPS = 60
FAULTS = {25: 1000.0, 40: 100.0}  # step -> input scale; 25: the loss overflows, 40: a norm spike
NAN_AT = 55
QUIET = 10  # alarm_config: an incident ends 10 quiet steps after its last flagged step


@pytest.fixture(autouse=True)
def _graph_mode():
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)


def batches(steps: int, scale: dict[int, float] | None = None, nan_at=(), seed: int = 0) -> ds.Dataset:
    """``steps`` batches of random (x, y); the inputs of step s (from 1) times ``scale[s]``; one NaN
    input in the batches of ``nan_at``."""
    rng = np.random.default_rng(seed)
    x = rng.random((steps * BATCH, IN_DIM), dtype=np.float32)
    y = rng.integers(0, 10, steps * BATCH).astype(np.int32)
    for s, factor in (scale or {}).items():
        x[(s - 1) * BATCH:s * BATCH] *= factor
    for s in nan_at:
        x[(s - 1) * BATCH, 0] = np.nan
    return ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(BATCH)


def step_cell():
    """MonitoredTrainStep (SGD; clipped at 5, ~15x the clean norm, so a fault does not wreck the
    weights and each fault is its own incident)."""
    net = mlp()
    optimizer = nn.SGD(net.trainable_params(), learning_rate=0.05)
    return monitored_step(NanAwareLoss(net), optimizer, 64, max_norm=5.0)


def alarm_events(recs: list[dict]) -> list[dict]:
    return [r for r in recs if r["type"] == "event" and r["kind"] in ALARM_KINDS]


def test_a_clean_run_writes_no_alarm_and_its_header_names_the_rule(tmp_path):
    path, seen = tmp_path / "metrics.jsonl", []
    monitor = LiveMonitor(path, log_interval=10, on_event=seen.append)
    Model(step_cell()).train(1, batches(STEPS), callbacks=[monitor])
    recs = records(path)
    assert recs[0]["alarm_rule"] == AlarmConfig().as_dict()
    assert len([r for r in recs if r["type"] == "step"]) == STEPS and recs[-1]["status"] == "finished"
    assert alarm_events(recs) == [] and seen == []


def test_each_injected_fault_writes_one_alarm_at_its_step_and_its_end(tmp_path):
    path, seen = tmp_path / "metrics.jsonl", []
    monitor = LiveMonitor(path, log_interval=10, on_event=seen.append, alarm_config={"quiet_steps": QUIET})
    Model(step_cell()).train(1, batches(STEPS, FAULTS, [NAN_AT]), callbacks=[monitor])
    recs = records(path)
    assert recs[0]["alarm_rule"] == AlarmConfig(quiet_steps=QUIET).as_dict()
    alarms = [r for r in recs if r.get("kind") == "alarm"]
    assert [a["step"] for a in alarms] == [25, 40, NAN_AT]
    # x1000: the loss overflows (MindSpore's CPU cross-entropy) or else the norm is judged
    assert alarms[0]["reason"] in ("nonfinite", "grad_norm_spike")
    spike = alarms[1]
    assert spike["reason"] == "grad_norm_spike" and spike["field"] == "grad_norm"
    assert spike["value"] > 20 * spike["baseline"] > 0
    assert alarms[2]["reason"] == "nonfinite" and math.isnan(alarms[2]["value"])
    ends = [r for r in recs if r.get("kind") == "alarm_end"]
    assert [(e["start"], e["step"], e["flagged"]) for e in ends] == [(25, 25, 1), (40, 40, 1), (55, 55, 1)]
    # Each alarm right after its step's record and events; an end with the step that closed it
    # (QUIET steps later), the last one at the end of the run, just before the end record.
    for alarm in alarms:
        before = recs[:recs.index(alarm)]
        last_step = [r for r in before if r["type"] == "step"][-1]
        assert last_step["step"] == alarm["step"]
        assert all(r["type"] == "event" for r in before[before.index(last_step) + 1:])
    step_records = {r["step"]: r for r in recs if r["type"] == "step"}
    for end, closed_by in zip(ends[:2], (25 + QUIET + 1, 40 + QUIET + 1)):
        assert recs[recs.index(end) - 1] is step_records[closed_by]
    assert recs[-2] is ends[-1] and recs[-1]["type"] == "end"
    written = [(e["kind"], e["step"], e.get("reason")) for e in alarm_events(recs)]
    assert [(e["kind"], e["step"], e.get("reason")) for e in alarm_events(seen)] == written
    # What the writer judged is what a reader's rule finds in the records as written.
    rule, replayed = AlarmRule(AlarmConfig(quiet_steps=QUIET)), []
    for r in recs:
        if r["type"] != "event" or r["kind"] == "abort":
            replayed += rule.update(r)
    replayed += rule.finish()
    assert [(e["kind"], e["step"], e.get("reason")) for e in replayed] == written


def test_alarms_false_writes_no_alarm_and_no_header_key(tmp_path):
    path, seen = tmp_path / "metrics.jsonl", []
    Model(step_cell()).train(1, batches(6, nan_at=[3]),
                             callbacks=[LiveMonitor(path, alarms=False, on_event=seen.append)])
    recs = records(path)
    assert "alarm_rule" not in recs[0]
    assert [(e["kind"], e["step"]) for e in recs if e["type"] == "event"] == [("nonfinite", 3)]
    assert [e["kind"] for e in seen] == ["nonfinite"]


def test_an_abort_writes_an_abort_alarm(tmp_path):
    # A fixed loss scale whose overflow check always fires: every update is skipped as an overflow
    # (finite loss; nothing for the rule to flag), and with a fixed scale each one counts toward
    # abort_after. The abort opens the incident.
    class AlwaysOverflows(CpuLossScaleStep):
        def get_overflow_status(self, status, compute_output):
            return ms.Tensor(True)

    net = mlp()
    cell = AlwaysOverflows(NanAwareLoss(net), nn.SGD(net.trainable_params(), learning_rate=0.05),
                           scale_sense=nn.FixedLossScaleUpdateCell(1024.0))
    path, seen = tmp_path / "metrics.jsonl", []
    Model(cell).train(1, batches(8), callbacks=[LiveMonitor(path, abort_after=3, on_event=seen.append)])
    recs = records(path)
    events = [(r["kind"], r["step"]) for r in recs if r["type"] == "event"]
    assert events == [("skip", 1), ("skip", 2), ("skip", 3), ("abort", 3), ("alarm", 3), ("alarm_end", 3)]
    alarm = next(r for r in recs if r.get("kind") == "alarm")
    assert alarm["reason"] == "abort" and "abort_after=3" in alarm["message"]
    assert next(r for r in recs if r.get("kind") == "alarm_end")["reasons"] == {"abort": 1}
    assert recs[-1]["status"] == "aborted"
    assert [e["kind"] for e in seen] == [kind for kind, _ in events]


def test_a_resumed_segment_does_not_alarm_again_on_the_old_incident(tmp_path):
    # Segment 1 ends inside an incident (a NaN at step 25 of 30): its alarm_end is written at close.
    # The checkpoint carries the cell's device history (the NaN row included) and counters; the
    # resumed segment continues at step 31 with a fresh rule and judges only its own steps.
    path, ckpt = tmp_path / "metrics.jsonl", str(tmp_path / "step30.ckpt")
    cell = step_cell()
    Model(cell).train(1, batches(30, nan_at=[25]), callbacks=[LiveMonitor(path, log_interval=4)])
    ms.save_checkpoint(cell, ckpt)
    resumed = step_cell()
    ms.load_param_into_net(resumed, ms.load_checkpoint(ckpt))
    Model(resumed).train(1, batches(12, seed=1), callbacks=[LiveMonitor(path, log_interval=4)])
    first, second = segments(path)
    assert [(e["kind"], e["step"]) for e in alarm_events(first)] == [("alarm", 25), ("alarm_end", 25)]
    assert first[-2]["kind"] == "alarm_end" and first[-1]["type"] == "end"
    assert [r["step"] for r in second if r["type"] == "step"] == list(range(31, 43))
    assert "alarm_rule" in second[0] and alarm_events(second) == []


def test_alarm_options_are_validated(tmp_path):
    path = tmp_path / "m.jsonl"
    tuned = LiveMonitor(path, alarm_config={"quiet_steps": np.int64(20), "norm_ratio": np.float32(6.0)})
    assert tuned.settings.alarm_config == AlarmConfig(quiet_steps=20, norm_ratio=6.0)
    assert LiveMonitor(path, alarm_config=AlarmConfig(window=50)).settings.alarm_config.window == 50
    assert LiveMonitor(path).settings.alarm_config == AlarmConfig()
    assert LiveMonitor(path, alarms=np.bool_(False)).settings.alarm_config is None
    with pytest.raises(ValueError, match=r"quiet_step.*known: window"):
        LiveMonitor(path, alarm_config={"quiet_step": 5})
    with pytest.raises(ValueError, match="min_history"):
        LiveMonitor(path, alarm_config={"min_history": 500})
    with pytest.raises(ValueError, match="alarms=False"):
        LiveMonitor(path, alarms=False, alarm_config={"quiet_steps": 5})
    with pytest.raises(TypeError, match="alarms must be True or False"):
        LiveMonitor(path, alarms="yes")
    with pytest.raises(TypeError, match="alarm_config must be"):
        LiveMonitor(path, alarm_config=8.0)
