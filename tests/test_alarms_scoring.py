"""The alarm benchmark's pure scoring (benchmarks/alarms_rules.py): the ported page rule, the
per-step and per-incident counts, fault magnitudes and headroom."""

from __future__ import annotations

import math

import pytest

from benchmarks import alarms_rules as rules


def steps(norms, losses=None):
    losses = [1.0] * len(norms) if losses is None else losses
    return [{"type": "step", "step": i + 1, "loss": loss, "grad_norm": norm}
            for i, (norm, loss) in enumerate(zip(norms, losses))]


def test_page_rule_is_spikes_js():
    # 5x the median of the previous (up to) 50 finite norms, after 10 of them; NaN never counts.
    norms = [1.0] * 10 + [5.0, 5.1, math.nan] + [1.0] * 60 + [4.9]
    assert rules.page_rule_steps(steps(norms)) == {12}
    assert rules.page_rule_steps(steps([1.0] * 9 + [100.0])) == set()  # before min_history


def test_per_step_rules_count_every_flagged_step_and_alarms_count_incidents():
    norms = [1.0 + 0.01 * (i % 3) for i in range(100)] + [math.nan] * 3 + [1.0] * 10
    records = steps(norms)
    assert rules.flagged_steps("page_rule", records) == [101, 102, 103]
    assert rules.flagged_steps("alarms", records) == [101]
    score = rules.score_fault("alarms", records[:100], records[100:], 101)
    assert score.detected and score.alarms == 1 and score.delay == 0
    assert rules.score_fault("page_rule", records[:100], records[100:], 101).alarms == 3


def test_fault_magnitude():
    prefix = steps([2.0] * 60)
    assert rules.fault_magnitude(prefix, steps([4.0, 30.0, 1.0])) == 15.0
    assert math.isinf(rules.fault_magnitude(prefix, steps([4.0, 3.0], [1.0, math.inf])))


def test_headroom_reports_the_closest_call():
    norms = [1.0] * 100 + [12.0] + [1.0] * 20 + [20.0]
    worst = rules.headroom(steps(norms))
    assert worst["norm_over_envelope"] == 12.0  # the first: 12x its envelope of 1.0; the second 20/12
    assert worst["loss_over_height"] is None
    assert rules.headroom(steps(norms), steps=[122])["norm_over_envelope"] == 20.0 / 12.0


def test_detector_rate_counts_after_the_warm_up():
    records = steps([1.0] * 50)
    assert rules.detector_rate(records, 25, {10, 30, 40}) == 100.0 * 2 / 25


def test_separability_marks_a_fault_that_only_the_loss_separates():
    from benchmarks import alarms_separability as sep

    # A heavy-tailed clean run: every 40th norm is 30x (a hard batch), the loss 5x there.
    rng = [1.0 + 0.1 * ((i * 7) % 5) for i in range(400)]
    norms = [30.0 * n if i % 40 == 39 else n for i, n in enumerate(rng)]
    losses = [0.5 if i % 40 == 39 else 0.1 for i in range(400)]
    clean = steps(norms, losses)
    # The fault at step 301: a 20x norm (below the clean 30x) with a 300x loss.
    faulty = steps([20.0, 1.0], [30.0, 0.1])
    for i, r in enumerate(faulty):
        r["step"] = 301 + i
    records = {"clean": {"0": clean}, "faults": [{"fault": "f", "start": 301, "records": faulty}]}
    scores = [{"must": True, "magnitude": 20.0, "detector_caught": False}]
    doc = {"settings": [{"setting": "s", "records": records, "faults": scores}]}
    result = sep.analyse([doc])
    worst, fault = result["worst_clean"], result["faults"][0]
    assert worst["norm_ratio"] > 25 and fault["norm_ratio"] < worst["norm_ratio"]
    assert fault["loss_ratio"] > 100 > 10 > worst["loss_ratio"]
    table = sep.render(result)
    assert "fault s/f@301 | no |" in table and table.count("(below)") == 2  # z and norm ratio, not the loss
    # the detector's loss test, over its own ring: clean 4x (the hard batches), the fault 299x
    loss_test = sep.analyse_loss_test([doc])
    assert loss_test["worst_clean"] == pytest.approx(4.0)
    assert loss_test["faults"][0]["ratio"] == pytest.approx(299.0)
    assert "| fault s/f@301 | no | 299.00 |" in sep.render_loss_test(loss_test)
