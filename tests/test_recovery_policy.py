"""Automatic recovery's policy alone (gradmon/monitor/recovery.py): no MindSpore."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gradmon.monitor.recovery import (
    GiveUp,
    LossRise,
    Recovery,
    RecoveryPolicy,
    RollbackPlan,
    recovery_of,
    rollback_event,
)


def step(i: int, **kw) -> dict:
    rec = {"type": "step", "step": i, "loss": 1.0, "grad_norm": 1.0 + 0.01 * (i % 7)}
    rec.update(kw)
    return rec


def run(policy: RecoveryPolicy, steps, snap_every=True) -> None:
    """Feed steps; take a (fake) snapshot whenever one is due and allowed, as the driver does."""
    for rec in steps:
        policy.count_batches(1)
        policy.observe(rec)
        if snap_every and policy.snapshot_due(rec["step"]) and policy.may_snapshot():
            policy.add_snapshot(rec["step"], f"snap@{rec['step']}")


def test_settings_are_checked():
    assert recovery_of(None) is None and recovery_of(False) is None
    assert recovery_of(True) == Recovery()
    assert recovery_of({"every": 7}).every == 7
    assert Recovery(on_alarm="nonfinite").on_alarm == ("nonfinite",)
    with pytest.raises(ValueError, match="every"):
        Recovery(every=0)
    with pytest.raises(ValueError, match="unknown alarm reason"):
        Recovery(on_alarm=("abort",))
    with pytest.raises(ValueError, match="no trigger"):
        Recovery(on_alarm=False, skipped_steps=None)
    with pytest.raises(TypeError, match="recovery must be"):
        recovery_of(3)


def test_ring_keeps_the_newest_snapshots_every_m_steps():
    policy = RecoveryPolicy(Recovery(every=10, keep=2))
    run(policy, [step(i) for i in range(1, 36)])
    # the first step seen, then each multiple of 10; only the newest 2 kept
    assert policy.snapshot_steps() == [20, 30]


def test_a_nonfinite_step_rolls_back_to_the_snapshot_before_it():
    policy = RecoveryPolicy(Recovery(every=10, keep=3))
    bad = step(26, loss=math.nan, grad_norm=math.nan, nonfinite=True)
    run(policy, [step(i) for i in range(1, 26)] + [bad])
    trigger = policy.trigger
    assert (trigger.reason, trigger.detail, trigger.incident_step) == ("alarm", "nonfinite", 26)
    plan = policy.plan(trigger)
    assert isinstance(plan, RollbackPlan) and (plan.step, plan.snapshot, plan.rollbacks) == (20, "snap@20", 1)
    assert plan.hold == Recovery().skip_batches


def test_no_snapshot_while_an_incident_is_open_or_a_trigger_is_pending():
    policy = RecoveryPolicy(Recovery(every=10, keep=3, skipped_steps=None))
    run(policy, [step(i) for i in range(1, 30)] + [step(30, loss=math.inf, nonfinite=True)])
    assert policy.snapshot_steps() == [1, 10, 20]  # not 30: that step was bad


def test_the_snapshot_must_be_from_before_the_incident_start():
    # 3 skipped steps from 19 on: the snapshot after step 20 holds the incident, 10 does not.
    policy = RecoveryPolicy(Recovery(every=10, keep=3, on_alarm=False, skipped_steps=3))
    recs = [step(i) for i in range(1, 19)] + [step(i, skipped=True, spike=True) for i in (19, 20, 21)]
    run(policy, recs)
    assert policy.trigger.reason == "skipped" and policy.trigger.incident_step == 19
    assert policy.snapshot_steps() == [1, 10]  # 20 was not clean either
    plan = policy.plan(policy.trigger)
    assert plan.step == 10


def test_user_rule_and_rollback_restores_the_trigger_state():
    rule = lambda r: "loss above 5" if r["loss"] > 5 else None  # noqa: E731
    policy = RecoveryPolicy(Recovery(every=10, keep=3, on_alarm=False, skipped_steps=None, rule=rule))
    run(policy, [step(i) for i in range(1, 33)] + [step(33, loss=9.0)])
    assert (policy.trigger.reason, policy.trigger.detail, policy.trigger.step) == ("rule", "loss above 5", 33)
    plan = policy.plan(policy.trigger)
    policy.rolled_back(plan)
    assert policy.trigger is None and policy.snapshot_steps() == [10, 20, 30]
    assert plan.step == 30 and not policy.snapshot_due(31) and policy.snapshot_due(40)
    event = rollback_event(plan, from_step=33, ts=1.0)
    assert event["kind"] == "rollback" and event["step"] == event["restored_step"] == 30
    assert event["batches_skipped"] == 3 + plan.hold and event["reason"] == "rule"
    assert "loss above 5" in event["message"] and "snapshot after step 30" in event["message"]


def test_the_alarm_rule_state_comes_back_with_the_snapshot():
    # The rule needs min_history finite norms before it judges spikes: after a rollback it goes on
    # from the snapshot's state, so a spike right after the rollback is still caught.
    policy = RecoveryPolicy(Recovery(every=50, keep=2, skipped_steps=None))
    run(policy, [step(i) for i in range(1, 101)])
    run(policy, [step(101, grad_norm=500.0)], snap_every=False)
    assert policy.trigger is not None and policy.trigger.detail == "grad_norm_spike"
    policy.rolled_back(policy.plan(policy.trigger))
    run(policy, [step(101, grad_norm=600.0)], snap_every=False)
    assert policy.trigger is not None and policy.trigger.incident_step == 101


def test_the_cap_gives_up_with_a_message_and_holds_double():
    policy = RecoveryPolicy(Recovery(every=10, keep=2, skip_batches=4, max_rollbacks=2, window=100))
    run(policy, [step(i) for i in range(1, 21)])
    holds = []
    for _ in range(2):
        policy.observe(step(21, loss=math.nan, nonfinite=True))
        plan = policy.plan(policy.trigger)
        assert isinstance(plan, RollbackPlan)
        holds.append(plan.hold)
        policy.rolled_back(plan)
        policy.count_batches(1)
    assert holds == [4, 8]
    policy.observe(step(21, loss=math.nan, nonfinite=True))
    verdict = policy.plan(policy.trigger)
    assert isinstance(verdict, GiveUp)
    assert "recovery gave up at step 21" in verdict.message and "max_rollbacks=2" in verdict.message
    # Outside the window the count starts again.
    policy.count_batches(200)
    assert isinstance(policy.plan(policy.trigger), RollbackPlan)


def test_no_snapshot_old_enough_gives_up():
    policy = RecoveryPolicy(Recovery(every=10))
    policy.observe(step(1, loss=math.nan, nonfinite=True))
    verdict = policy.plan(policy.trigger)
    assert isinstance(verdict, GiveUp) and "no snapshot from before step 1" in verdict.message


def test_loss_rise_names_where_the_rise_began_and_comes_back_with_the_snapshot():
    from gradmon.monitor.recovery import LossRise

    policy = RecoveryPolicy(Recovery(every=50, keep=2, on_alarm=False, skipped_steps=None,
                                     rule=LossRise(factor=1.5, recent=5, window=50, min_history=20)))
    run(policy, [step(i, loss=1.0 + 0.01 * (i % 3)) for i in range(1, 61)])
    assert policy.trigger is None
    run(policy, [step(i, loss=2.5) for i in range(61, 64)], snap_every=False)
    trigger = policy.trigger
    assert trigger is not None and trigger.reason == "rule" and "median" in trigger.detail
    assert trigger.incident_step == 61 and trigger.step == 62  # the first of the last 5 above 1.5x
    plan = policy.plan(trigger)
    assert plan.step == 50
    policy.rolled_back(plan)
    # The rule's window is back at step 50: normal losses after the rollback do not fire it.
    run(policy, [step(i, loss=1.0) for i in range(51, 60)], snap_every=False)
    assert policy.trigger is None


@pytest.mark.parametrize("masked", [50, 60, 150])
def test_loss_rise_leaves_out_steps_with_no_gradient(masked):
    # Masked batches (loss 0, norm 0) at the start: once the window held as many real losses as
    # zeros, its median was half the real level, and the real losses read as a 2x rise.
    from gradmon.monitor.recovery import LossRise

    rule = LossRise()
    fired = [s for s in range(1, masked + 300)
             if rule(step(s, loss=0.0, grad_norm=0.0) if s <= masked else step(s, loss=2.3 + 0.01 * (s % 5)))]
    assert fired == []
    assert rule(step(masked + 300, loss=2.3, grad_norm=1e-31)) is None  # (a zero norm: not even looked at)
    assert rule(step(masked + 300, loss=2.3, grad_norm=10**400)) is None  # (an int too big for a float)
    fired = [s for s in range(masked + 301, masked + 320) if rule(step(s, loss=5.0))]
    assert fired and fired[0] == masked + 305  # a real rise still fires (its 5th step: mean of 10 > 1.5x)


def test_data_parallel_agreement_from_summed_votes():
    # Two ranks, the same ring; only one saw a trigger (its loss rule). What the sum decides is the
    # same on both: roll back, to the snapshot the triggering rank chose.
    from gradmon.monitor.rollback import agree_from_sums, local_vote

    def ranks():
        policies = [RecoveryPolicy(Recovery(every=10, keep=3, on_alarm=False, skipped_steps=None,
                                            rule=lambda r: None)) for _ in range(2)]
        for p in policies:
            run(p, [step(i) for i in range(1, 26)])
        return policies

    quiet, loud = ranks()
    from gradmon.monitor.recovery import Trigger

    loud.trigger = Trigger("rule", "rank 1's rule", 23, 25)
    sums = local_vote(quiet, None, False) + local_vote(loud, loud.trigger, True)
    t0, unclean0 = agree_from_sums(quiet, None, sums, 25)
    t1, unclean1 = agree_from_sums(loud, loud.trigger, sums, 25)
    assert unclean0 and unclean1 and t1 is loud.trigger
    assert t0.reason == "rank" and "rule" in t0.detail
    assert quiet.plan(t0).step == loud.plan(t1).step == 20
    # Two triggers wanting different snapshots: both take the older one.
    other = Trigger("alarm", "nonfinite", 15, 25)
    sums = local_vote(quiet, other, True) + local_vote(loud, loud.trigger, True)
    t0, _ = agree_from_sums(quiet, other, sums, 25)
    t1, _ = agree_from_sums(loud, loud.trigger, sums, 25)
    assert quiet.plan(t0).step == loud.plan(t1).step == 10
    # Nobody: no trigger, clean.
    assert agree_from_sums(quiet, None, local_vote(quiet, None, False) * 2, 25) == (None, False)


def test_a_rule_that_cannot_be_copied_still_works():
    import threading

    class Locked:
        def __init__(self):
            self.lock = threading.Lock()  # deepcopy refuses a lock

        def __call__(self, record):
            return "late" if record["step"] == 25 else None

    policy = RecoveryPolicy(Recovery(every=10, on_alarm=False, skipped_steps=None, rule=Locked()))
    run(policy, [step(i) for i in range(1, 26)])
    assert policy.trigger.reason == "rule" and policy.plan(policy.trigger).step == 20


def test_loss_rise_reads_numbers_as_the_alarm_rule_does():
    """A loss that is no finite number (an integer too big for a float, a bool, text) is not taken,
    and raises nothing; a numpy float64 loss is taken as a float."""
    rule = LossRise(recent=5, window=20, min_history=10)
    for s in range(1, 31):
        assert rule(step(s, loss=2.0)) is None
    for bad in (10**400, -10**400, True, "2.0", None, math.nan):
        assert rule(step(31, loss=bad)) is None
    assert rule._recent[-1] == (30, 2.0)  # (none of them was taken)
    fired = [s for s in range(31, 40) if rule(step(s, loss=np.float64(5.0)))]
    assert fired[0] == 32  # (numpy floats: at their 2nd step the mean of 5 is 3.2, over 1.5 x 2.0)
