"""The alarm rule end to end: real MindSpore training (the spike demo's MLP), logged by LiveMonitor,
read back from the run log, judged by gradmon.alarms."""

from __future__ import annotations

from pathlib import Path

import pytest

from examples.models import digits
from examples.spike_demo import FaultPlan, run_variant
from gradmon.alarms import AlarmRule
from gradmon.runlog import read_records

STEPS, SPIKE_AT, NAN_AT = 135, 60, 130  # the fault after the detector's 50-step warm-up


def _alarm_events(log_file: str) -> list[dict]:
    rule = AlarmRule()
    out: list[dict] = []
    for record in read_records(log_file):
        out += rule.update(record)
    return out + rule.finish()


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    import mindspore as ms

    ms.set_context(mode=ms.GRAPH_MODE)
    root = Path(tmp_path_factory.mktemp("alarms"))
    data = digits()
    plan = FaultPlan(spike_steps=(SPIKE_AT,), spike_scale=1000.0, nan_steps=(NAN_AT,))
    out = {}
    for variant in ("clean", "skip"):
        result = run_variant(variant, root, steps=STEPS, batch_size=32, lr=0.1, faults=plan, eval_every=1000,
                             log_interval=10, data=data)
        assert result.steps == STEPS
        out[variant] = result.log_file
    return out


def test_a_clean_run_raises_no_alarm(logs):
    assert _alarm_events(logs["clean"]) == []


def test_each_injected_fault_raises_one_alarm_at_its_step(logs):
    events = _alarm_events(logs["skip"])
    alarms = [e for e in events if e["kind"] == "alarm"]
    assert [a["step"] for a in alarms] == [SPIKE_AT, NAN_AT]
    assert alarms[0]["reason"] in ("grad_norm_spike", "nonfinite") and alarms[1]["reason"] == "nonfinite"
    spike = alarms[0]
    if spike["reason"] == "grad_norm_spike":
        assert spike["value"] > 100 * spike["baseline"]
    ends = [e for e in events if e["kind"] == "alarm_end"]
    assert [(e["start"], e["step"]) for e in ends] == [(SPIKE_AT, SPIKE_AT), (NAN_AT, NAN_AT)]
