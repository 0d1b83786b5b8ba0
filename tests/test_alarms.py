"""The alarm rule (gradmon/logformat/alarms.py) on synthetic series: what alarms, what stays quiet,
incidents."""

from __future__ import annotations

import json
import math
import statistics

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradmon.logformat.alarms import (
    ZERO_NORM,
    AlarmConfig,
    AlarmRule,
    RunningBaseline,
    is_overflow,
    is_zero_norm,
)
from gradmon.logformat.jsonl import decode_line, encode_record
from gradmon.logformat.schema import ALARM_KINDS, ALARM_REASONS


def steps(norms, losses=None, start=1, **extra):
    """Step records for a norm series (and a loss series; default a flat 1.0)."""
    losses = [1.0] * len(norms) if losses is None else losses
    return [{"type": "step", "step": start + i, "ts": 1000.0 + start + i, "loss": float(loss),
             "grad_norm": float(norm), **extra} for i, (norm, loss) in enumerate(zip(norms, losses))]


def run(records, config=None):
    rule = AlarmRule(config)
    out = []
    for r in records:
        out += rule.update(r)
    return out + rule.finish()


def alarms(events):
    return [e for e in events if e["kind"] == "alarm"]


def ends(events):
    return [e for e in events if e["kind"] == "alarm_end"]


def noisy(n, level=1.0, sigma=0.3, seed=0):
    """A stationary norm series with log-normal batch noise."""
    return level * np.random.default_rng(seed).lognormal(0.0, sigma, n)


# ----------------------------------------------------------------------------- stays quiet


def test_clean_noisy_decay_raises_nothing():
    rng = np.random.default_rng(1)
    t = np.arange(3000)
    norms = 5.0 * np.exp(-t / 400) * rng.lognormal(0, 0.35, t.size) + 0.05
    losses = 2.0 * np.exp(-t / 300) + 0.1 + 0.05 * rng.standard_normal(t.size) ** 2
    assert run(steps(norms, losses)) == []


def test_norm_rising_early_in_sgd_is_not_an_alarm():
    # The first 80 steps: the norm climbs 30x (6 % a step) with batch noise, then settles.
    rng = np.random.default_rng(2)
    rise = 0.1 * 1.045 ** np.arange(80) * rng.lognormal(0, 0.2, 80)
    norms = np.concatenate([rise, noisy(300, level=rise[-1], seed=3)])
    assert run(steps(norms)) == []


def test_slow_drift_is_not_an_alarm():
    norms = np.geomspace(0.1, 5.0, 3000) * noisy(3000, sigma=0.2, seed=4)
    assert run(steps(norms)) == []


def test_heavy_tail_that_grows_epoch_by_epoch_is_not_an_alarm():
    # Late in a multi-epoch run one hard batch per epoch (45 steps) has a norm that grows from 3x to
    # 60x the others' as they shrink: each time only a little above the last time.
    rng = np.random.default_rng(5)
    norms = list(noisy(100, seed=6))
    for epoch in range(40):
        block = list(noisy(45, seed=100 + epoch))
        block[int(rng.integers(0, 45))] = 3.0 * 1.08 ** epoch
        norms += block
    assert run(steps(norms)) == []


def test_spike_rules_wait_for_min_history():
    norms = [1.0] * 5 + [1000.0]
    assert run(steps(norms)) == []


# ------------------------------------------------------------------------------ alarms once


def test_single_spike_raises_one_alarm_and_its_end():
    norms = list(noisy(300, seed=7))
    norms[200] = 25.0 * statistics.median(norms[:200])
    events = run(steps(norms))
    [alarm] = alarms(events)
    assert alarm["step"] == 201 and alarm["reason"] == "grad_norm_spike" and alarm["field"] == "grad_norm"
    assert alarm["value"] == pytest.approx(norms[200])
    assert alarm["baseline"] == pytest.approx(statistics.median(norms[:200]), rel=0.05)
    assert alarm["ts"] == 1201.0 and "x its running median" in alarm["message"]
    [end] = ends(events)
    assert end["start"] == end["step"] == 201 and end["flagged"] == 1
    assert end["reasons"] == {"grad_norm_spike": 1}
    # emitted once quiet_steps steps have passed without a flag, not at the end of the run
    assert events.index(end) == 1


def test_end_comes_after_quiet_steps():
    norms = list(noisy(400, seed=8))
    norms[100] = 100.0
    rule = AlarmRule(AlarmConfig(quiet_steps=10))
    emitted = {}
    for r in steps(norms):
        for e in rule.update(r):
            emitted[e["kind"]] = r["step"]
    assert emitted == {"alarm": 101, "alarm_end": 112}  # steps 102..111 quiet, closed at 112


def test_burst_is_one_incident():
    norms = list(noisy(300, seed=9))
    for i in (150, 151, 153, 156, 160):
        norms[i] = 40.0
    events = run(steps(norms))
    assert len(alarms(events)) == 1 and alarms(events)[0]["step"] == 151
    [end] = ends(events)
    assert (end["start"], end["step"], end["flagged"]) == (151, 161, 5)


def test_two_spikes_far_apart_are_two_incidents():
    norms = list(noisy(500, seed=10))
    norms[100] = norms[400] = 50.0
    events = run(steps(norms))
    assert [a["step"] for a in alarms(events)] == [101, 401]
    assert [(e["start"], e["step"]) for e in ends(events)] == [(101, 101), (401, 401)]


def test_a_second_spike_right_after_a_first_is_still_seen():
    # A flagged norm does not raise the envelope that the next one is compared with.
    norms = list(noisy(300, seed=11))
    norms[100], norms[120] = 40.0, 35.0
    events = run(steps(norms))
    assert ends(events)[0]["flagged"] == 2


def test_nonfinite_alarms_at_once_and_a_diverged_run_is_one_incident():
    norms = [1.0, 1.1, math.nan] + [math.inf] * 30
    losses = [2.0, 1.9, math.nan] + [math.inf] * 30
    events = run(steps(norms, losses))
    [alarm] = alarms(events)
    assert alarm["step"] == 3 and alarm["reason"] == "nonfinite" and alarm["field"] == "loss"
    assert math.isnan(alarm["value"]) and "baseline" not in alarm
    [end] = ends(events)
    assert (end["start"], end["step"], end["flagged"]) == (3, 33, 31)


def test_nonfinite_norm_flag_without_a_value():
    records = steps([1.0] * 30)
    records[25] = {"type": "step", "step": 26, "loss": 1.0, "nonfinite": True}
    [alarm] = alarms(run(records))
    assert alarm["step"] == 26 and alarm["field"] == "grad_norm"


def test_loss_spike_with_an_ordinary_norm():
    rng = np.random.default_rng(12)
    losses = list(0.3 + 0.02 * rng.standard_normal(200))
    losses[150] = 4.0
    [alarm] = alarms(run(steps(noisy(200, seed=13), losses)))
    assert alarm["step"] == 151 and alarm["reason"] == "loss_spike" and alarm["field"] == "loss"
    assert alarm["baseline"] == pytest.approx(0.3, abs=0.02)


def test_negative_losses_are_judged_by_their_jump():
    losses = [-5.0 + 0.01 * (i % 7) for i in range(100)]
    losses[80] = -3.0  # a jump of 2, 30x the largest ordinary rise, but below loss_ratio x |median|
    assert alarms(run(steps([1.0] * 100, losses))) == []
    losses[80] = 1.0
    assert [a["reason"] for a in alarms(run(steps([1.0] * 100, losses)))] == ["loss_spike"]


@pytest.mark.parametrize("masked", [20, 30, 60, 500])
def test_masked_batches_at_the_start_are_not_learnt(masked):
    # Twenty steps with no gradient and a placeholder loss of 0 (every label masked) made the loss
    # median 0: the first real loss was then a loss_spike ("2.3 above its running median 0").
    rng = np.random.default_rng(masked)
    losses = [0.0] * masked + list(2.3 + 0.05 * rng.standard_normal(300))
    norms = [0.0] * masked + list(noisy(300, seed=masked))
    rule = AlarmRule()
    events = [e for r in steps(norms, losses) for e in rule.update(r)]
    assert events == []
    assert (rule.norms.seen, rule.losses.seen) == (300, 300)
    assert rule.losses.median() == pytest.approx(2.3, abs=0.05) and rule.loss_scale > 2
    # ... and the rule still sees a real fault after them
    losses[masked + 200], norms[masked + 280] = 40.0, 200.0
    assert [(a["step"], a["reason"]) for a in alarms(run(steps(norms, losses)))] == [
        (masked + 201, "loss_spike"), (masked + 281, "grad_norm_spike")]


def test_zero_norm_steps_are_judged_for_nonfinite_only_and_learnt_by_neither_series():
    norms, losses = list(noisy(100)), [2.0] * 100
    for i in range(40, 60):  # a stretch with no gradient: its losses are 0, or huge
        norms[i], losses[i] = (0.0, 0.0) if i % 2 else (1e-31, 50.0)
    rule = AlarmRule()
    assert [e for r in steps(norms, losses) for e in rule.update(r)] == []
    assert (rule.norms.seen, rule.losses.seen) == (80, 80)
    assert rule.losses.median() == 2.0
    losses[50] = math.nan  # its loss is still judged for being finite
    [alarm] = alarms(run(steps(norms, losses)))
    assert (alarm["step"], alarm["reason"], alarm["field"]) == (51, "nonfinite", "loss")


def test_zero_norm_bound():
    rule = AlarmRule()
    for r in steps([1.0] * 30, [1.0] * 30):
        rule.update(r)
    above = math.nextafter(ZERO_NORM, 1)
    for step, norm, learnt in ((31, ZERO_NORM, False), (32, -0.0, False), (33, above, True)):
        before = rule.losses.seen
        rule.update({"type": "step", "step": step, "loss": 1.0, "grad_norm": norm})
        assert (rule.losses.seen - before == 1) is learnt, (norm, learnt)
    assert is_zero_norm(0.0) and not is_zero_norm(None) and not is_zero_norm(math.nan)
    assert not is_zero_norm(-1.0)


def test_abort_opens_an_incident_or_joins_the_open_one():
    records = steps([1.0] * 30)
    abort = {"type": "event", "kind": "abort", "step": 30, "ts": 5.0, "message": "10 bad steps"}
    [alarm] = alarms(run([*records, abort]))
    assert alarm["reason"] == "abort" and alarm["step"] == 30 and "10 bad steps" in alarm["message"]
    assert "value" not in alarm and "field" not in alarm
    diverged = steps([1.0] * 20 + [math.nan] * 5)
    events = run([*diverged, {**abort, "step": 25}])
    assert [a["reason"] for a in alarms(events)] == ["nonfinite"]
    assert ends(events)[0]["reasons"] == {"nonfinite": 5, "abort": 1}


# ------------------------------------------------------------------------------ loss scaling


def scaled(norms, scales, losses=None):
    return [{**r, "loss_scale": float(s)} for r, s in zip(steps(norms, losses), scales)]


def test_routine_overflow_after_the_scale_rises_is_not_an_alarm():
    # The scale settles down from 2**24, then doubles every 100 good steps and overflows at once.
    norms, scales = [], []
    for s in range(24, 15, -1):  # settling: every step overflows, the scale halves
        norms.append(math.inf)
        scales.append(2.0 ** s)
    for cycle in range(5):
        norms += list(noisy(100, seed=cycle))
        scales += [2.0 ** 15] * 100
        norms.append(math.nan)
        scales.append(2.0 ** 16)
    records = scaled(norms, scales)
    assert all(is_overflow(r) for r in records if not math.isfinite(r["grad_norm"]))
    assert run(records) == []


def test_overflow_at_a_proven_scale_or_at_the_minimum_alarms():
    norms = list(noisy(120, seed=14))
    norms[100] = math.nan  # e.g. a NaN batch: same scale as the 100 good steps before
    [alarm] = alarms(run(scaled(norms, [1024.0] * 120)))
    assert alarm["step"] == 101 and alarm["reason"] == "nonfinite" and alarm["baseline"] == 1024.0
    norms = [math.inf] * 12
    [alarm] = alarms(run(scaled(norms, [2.0 ** -i * 2048 for i in range(12)])))
    assert alarm["step"] == 12 and "minimum loss scale" in alarm["message"]


def test_explicit_overflow_flag_counts_as_overflow():
    record = {"type": "step", "step": 1, "loss": 1.0, "grad_norm": math.inf, "overflow": True}
    assert is_overflow(record)
    assert not is_overflow({**record, "loss": math.nan})
    assert not is_overflow({"type": "step", "step": 1, "loss": 1.0, "grad_norm": math.inf})


# ------------------------------------------------------------------------- segments, order


def test_new_segment_closes_the_incident_and_starts_afresh():
    first = steps(list(noisy(100, seed=15)))
    first[90]["grad_norm"] = 60.0
    header = {"type": "header", "schema": 1, "run_id": "b"}
    # the resumed segment repeats steps 91-100 (a rollback) at a lower level: no baseline yet
    second = steps([0.01] * 5 + [1.0] * 10, start=91)
    events = run([*first, header, *second])
    assert [(e["kind"], e["step"]) for e in events] == [("alarm", 91), ("alarm_end", 91)]


def test_repeated_steps_within_a_segment_are_ignored():
    rule = AlarmRule()
    records = steps(list(noisy(40, seed=16)))
    for r in records + records[-5:]:
        rule.update(r)
    assert rule.ignored == 5
    assert rule.update({"type": "step", "step": "7", "grad_norm": 1.0}) == []


def test_rule_is_deterministic_across_chunking():
    norms = list(noisy(600, seed=17))
    norms[300] = 80.0
    records = steps(norms)
    whole = run(records)
    rule = AlarmRule()
    chunked = []
    for i in range(0, len(records), 37):
        for r in records[i:i + 37]:
            chunked += rule.update(r)
    assert chunked + rule.finish() == whole


# -------------------------------------------------------------------------- records, config


def test_events_are_strict_json_records():
    events = run(steps([1.0] * 30 + [math.nan]))
    for e in events:
        assert e["kind"] in ALARM_KINDS
        line = encode_record(e)
        json.loads(line, parse_constant=lambda t: pytest.fail(f"bare {t}"))
        back = decode_line(line)
        assert back["kind"] == e["kind"] and back["step"] == e["step"]
    assert math.isnan(decode_line(encode_record(alarms(events)[0]))["value"])
    assert alarms(events)[0]["reason"] in ALARM_REASONS


def test_config_validation_and_round_trip():
    config = AlarmConfig(window=50, quiet_steps=5)
    assert AlarmConfig.from_dict({**config.as_dict(), "from_the_future": 1}) == config
    for bad in ({"window": 0}, {"min_history": 300}, {"norm_ratio": -1.0}, {"loss_over_max": math.inf},
                {"quiet_steps": 2.0}, {"window": True}):
        with pytest.raises(ValueError):
            AlarmConfig(**bad)


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.tuples(st.floats(0.0, 100.0, allow_nan=False), st.booleans()), min_size=1,
                       max_size=60),
       window=st.integers(1, 12))
def test_baseline_matches_brute_force(values, window):
    base = RunningBaseline(window)
    for i, (v, flagged) in enumerate(values):
        base.add(v, flagged)
        recent = values[max(0, i + 1 - window):i + 1]
        assert len(base) == len(recent)
        assert base.median() == pytest.approx(statistics.median(x for x, _ in recent))
        unflagged = [x for x, f in recent if not f]
        assert base.envelope() == pytest.approx(max(unflagged) if unflagged else base.median())


# ------------------------------------------------------------------- the run's own scale (issue 22)


def _converged_run(seed: int = 0, n: int = 6000) -> tuple[list[float], list[float]]:
    """Norm and loss of a run that trains to its noise floor, like issue 22's 20,000-step MLP: the
    norm falls from ~2 to ~1e-6 and the loss from ~2 to ~1e-7; at the floor, float noise moves
    both by 10-100x every few hundred steps (the excursions main's rule paged for)."""
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    level = np.maximum(np.exp(-t / 150.0), 5e-7)
    norms = 2.0 * level * rng.lognormal(0.0, 0.4, n)
    losses = 2.0 * np.maximum(np.exp(-t / 120.0), 5e-8) * rng.lognormal(0.0, 0.3, n)
    for at in range(3000, n, 250):  # noise-floor excursions, norm and loss together
        norms[at] *= rng.uniform(30, 100)
        losses[at] *= rng.uniform(3, 10)
    return list(norms), list(losses)


def test_converged_run_noise_floor_raises_no_alarm():
    norms, losses = _converged_run()
    records = steps(norms, losses)
    assert alarms(run(records)) == []
    # the excursions are what the rule without the run's scale alarms on (the point of the floors)
    old = alarms(run(records, AlarmConfig(norm_floor=0.0, loss_floor=0.0)))
    assert len(old) >= 5 and {a["reason"] for a in old} <= {"grad_norm_spike", "loss_spike"}


def test_a_real_fault_in_a_converged_run_still_alarms_once():
    norms, losses = _converged_run()
    norms[4100], losses[4100] = 5.0, 3.0  # a x1e6 norm and a loss back to where the run began
    events = run(steps(norms, losses))
    assert [a["step"] for a in alarms(events)] == [4101]
    assert alarms(events)[0]["reason"] == "grad_norm_spike"


def test_run_scale_is_the_largest_sampled_median_and_resets_with_a_segment():
    config = AlarmConfig(window=10, min_history=4)
    rule = AlarmRule(config)
    for r in steps([8.0, 8.0, 8.0, 8.0] + [1.0] * 30, [4.0] * 34):
        rule.update(r)
    # sampled after the 4th norm (median 8) and after every 10th; the later medians are smaller
    assert rule.norm_scale == 8.0 and rule.loss_scale == 4.0
    rule.update({"type": "header", "schema": 1})
    assert rule.norm_scale == 0.0 and rule.loss_scale == 0.0


def test_huge_integers_and_numpy_scalars_are_read_as_numbers():
    """The rule reads values as every reader of a log does (``logformat.values.number``): an integer
    too big for a float (valid JSON, another writer's log) is infinite, not an OverflowError that
    stops the reader; a numpy float64 (a subclass of float, in a record built in Python) is read."""
    base = steps([1.0] * 40)
    huge_loss = {"type": "step", "step": 41, "ts": 1041.0, "loss": 10**400, "grad_norm": 1.0}
    huge_norm = {"type": "step", "step": 42, "ts": 1042.0, "loss": 1.0, "grad_norm": -10**400}
    events = run([*base, huge_loss, huge_norm])
    alarms = [(e["step"], e["reason"], e["field"], e["value"]) for e in events if e["kind"] == "alarm"]
    assert alarms == [(41, "nonfinite", "loss", math.inf)]  # (step 42 joins the open incident)
    assert events[-1]["kind"] == "alarm_end" and events[-1]["flagged"] == 2
    for rec in (huge_loss, huge_norm):  # each alarms alone too
        assert [e["reason"] for e in run([*base, rec]) if e["kind"] == "alarm"] == ["nonfinite"]
    as_numpy = [{**r, "loss": np.float64(r["loss"]), "grad_norm": np.float64(r["grad_norm"])}
                for r in steps([1.0] * 40 + [50.0])]
    assert run(as_numpy) == run(steps([1.0] * 40 + [50.0]))
    assert [e["reason"] for e in run(as_numpy) if e["kind"] == "alarm"] == ["grad_norm_spike"]
    assert is_overflow({"loss": 1.0, "grad_norm": 10**400, "loss_scale": 1024})
