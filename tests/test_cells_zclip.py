"""The spike detector: numpy reference rules, the device update against it (the stock-op update
and the fused kernel), config validation, plus the pure host helpers (ring unrolling, per-layer rows)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from gradmon.cells import HistorySnapshot, SpikeConfig
from gradmon.cells.fused_build import KernelBuildError, find_compiler
from gradmon.cells.history import BASE_FIELDS, history_fields, unroll_ring
from gradmon.cells.layer_stats import layer_rows
from gradmon.cells.spike import ema_constants, initial_state, zclip_update
from gradmon.cells.spike_kernel import SpikeDetector
from gradmon.cells.zclip_reference import NO_EARLY_RULE, TINY_NORM, ZClipState, zclip_run, zclip_step
from hypothesis import example, given, settings
from hypothesis import strategies as st
from mindspore import Tensor

from gradmon.logformat.alarms import ZERO_NORM

# ------------------------------------------------------------------------------ reference itself


def test_reference_warmup_then_flags_a_large_outlier():
    norms = [1.0 + 0.01 * (i % 5) for i in range(25)] + [1.02, 1000.0, 1.01]
    steps, state = zclip_run(norms, warmup=25, alpha=0.97, z_threshold=2.5, early=NO_EARLY_RULE)
    assert not any(s.spike for s in steps[:26]) and all(s.zscore == 0.0 for s in steps[:25])
    # with the early rule (the default) the warm-up reports a z-score too, below the threshold here
    early, _ = zclip_run(norms, warmup=25, alpha=0.97, z_threshold=2.5)
    assert not any(s.spike for s in early[:26]) and [s.zscore for s in early[:4]] == [0.0] * 4
    assert all(s.zscore < 2.5 for s in early[:25]) and early[26].spike
    spike = steps[26]
    assert spike.spike and spike.zscore > 1000
    # reciprocal target: mean + (z_thr^2 / z) * std, far below the raw norm and above the mean
    assert 1.0 < spike.target < 1.1
    assert not steps[27].spike
    assert state.count == 28


def _rising_then_flat(seed: int = 3) -> list[float]:
    """Early SGD: the norm climbs 4 % a step for 60 steps (with batch noise), then levels off."""
    rng = np.random.default_rng(seed)
    rise = list(0.3 * 1.04 ** np.arange(60) * rng.lognormal(0, 0.15, 60))
    return rise + list(rise[-1] * rng.lognormal(0, 0.15, 100))


def test_default_settings_do_not_flag_a_norm_that_is_still_rising():
    # Why the defaults changed (docs/cells.md): ZClip's 25/0.97/2.5 flag the ordinary steps of an
    # early rise (the lagging EMA keeps them a few "sigmas" above it); the defaults flag none.
    norms = _rising_then_flat()
    old, _ = zclip_run(norms, warmup=25, alpha=0.97, z_threshold=2.5, early=NO_EARLY_RULE)
    assert sum(s.spike for s in old) >= 10
    d = SpikeConfig()
    new, _ = zclip_run(norms, warmup=d.warmup, alpha=d.alpha, z_threshold=d.z_threshold)
    assert not any(s.spike for s in new)
    norms[120] *= 30  # a real outlier after the warm-up is still flagged
    new, _ = zclip_run(norms, warmup=d.warmup, alpha=d.alpha, z_threshold=d.z_threshold)
    assert [i for i, s in enumerate(new) if s.spike] == [120]


def test_early_rule_flags_a_10x_outlier_from_the_fifth_step():
    # Issue 22: the first 50 steps were undefended. Four noisy norms are enough to judge the fifth.
    d = SpikeConfig()
    rng = np.random.default_rng(0)
    base = list(rng.lognormal(0.0, 0.3, 4))
    for factor, flagged in ((10.0, True), (3.0, False)):
        steps, state = zclip_run([*base, factor * float(np.median(base))], warmup=d.warmup, alpha=d.alpha,
                                 z_threshold=d.z_threshold)
        assert [s.spike for s in steps] == [False] * 4 + [flagged]
        assert steps[4].zscore > d.z_threshold if flagged else steps[4].zscore < d.z_threshold
    spike = steps[4] if steps[4].spike else zclip_run([*base, 1000.0], warmup=d.warmup, alpha=d.alpha,
                                                      z_threshold=d.z_threshold)[0][4]
    # the target: between the median and the threshold ratio of it, near the median for a x1000 norm
    median = float(np.median(base))
    assert median < spike.target < d.early_max_ratio * median
    assert len(state.ring) == 5 and state.count == 5


def test_early_rule_threshold_is_bounded_by_the_ratios():
    d = SpikeConfig()
    calm = [1.0, 1.0, 1.0, 1.0]  # MAD 0: the threshold is early_min_ratio, not 0
    steps, _ = zclip_run([*calm, 0.99 * d.early_min_ratio, 1.01 * d.early_min_ratio], warmup=d.warmup,
                         alpha=d.alpha, z_threshold=d.z_threshold)
    assert [s.spike for s in steps[4:]] == [False, True]
    wild = [1.0, 30.0, 0.03, 1.0, 900.0, 0.001]  # MAD huge: the threshold is capped at early_max_ratio
    steps, _ = zclip_run([*wild, 1.1 * d.early_max_ratio], warmup=d.warmup, alpha=d.alpha,
                         z_threshold=d.z_threshold)
    assert steps[-1].spike


def _adam_like_start(seed: int) -> list[float]:
    """The first 60 norms of a fresh net under Adam: falling fast, with batch noise."""
    rng = np.random.default_rng(seed)
    return list(2.0 * np.exp(-np.arange(60) / 12.0) * rng.lognormal(0, 0.35, 60) + 0.05)


@pytest.mark.parametrize("seed", range(5))
def test_early_rule_is_quiet_on_a_noisy_falling_start(seed):
    d = SpikeConfig()
    steps, _ = zclip_run(_adam_like_start(seed), warmup=d.warmup, alpha=d.alpha, z_threshold=d.z_threshold)
    assert not any(s.spike for s in steps)


def test_spike_floor_opt_in_spares_norms_far_below_the_run_scale():
    # A converged run (issue 22): the norm fell from ~2 to 1e-6; float noise moves it 50x.
    norms = [2.0, 2.1, 1.9, 2.0, 2.2] + [1e-6 * (1 + 0.1 * (i % 3)) for i in range(40)] + [5e-5]
    d = SpikeConfig()
    # by default (floor 0) the excursion is a spike: under Adam it would move every weight by ~lr
    steps, state = zclip_run(norms, warmup=d.warmup, alpha=d.alpha, z_threshold=d.z_threshold)
    assert d.floor == 0.0 and steps[-1].spike
    assert state.scale == pytest.approx(2.0, rel=0.1)
    floored = SpikeConfig(floor=0.01)
    steps, _ = zclip_run(norms, warmup=d.warmup, alpha=d.alpha, z_threshold=d.z_threshold,
                         early=floored.reference_rule())
    assert not steps[-1].spike and steps[-1].zscore > d.z_threshold  # an outlier, under the floor
    steps, _ = zclip_run([*norms[:-1], 0.5], warmup=d.warmup, alpha=d.alpha, z_threshold=d.z_threshold,
                         early=floored.reference_rule())
    assert steps[-1].spike  # a norm back near the run's scale still is one


def test_reference_ignores_non_finite():
    state = ZClipState()
    for v in (1.0, 2.0, math.nan, math.inf):
        zclip_step(state, v, warmup=3, alpha=0.9, z_threshold=2.0)
    assert state.count == 2 and state.warm == [1.0, 2.0]


def test_the_alarm_rule_takes_the_detectors_zero_norms():
    # The host's alarm rule leaves out the steps the detector does not learn (logformat/alarms.py).
    assert ZERO_NORM == TINY_NORM


def test_reference_does_not_learn_zero_norms():
    state = ZClipState()
    steps = [zclip_step(state, v, warmup=5, alpha=0.9, z_threshold=2.0, loss=2.0)
             for v in (0.0, 1.0, TINY_NORM, 2.0, 0.0)]
    assert state.count == 2 and state.warm == [1.0, 2.0] and len(state.ring) == 2
    assert state.loss_count == 2 and state.loss_ring == [2.0, 2.0]  # nor the loss test
    assert [(s.zscore, s.spike, s.target) for s in steps[::2]] == [(0.0, False, 0.0), (0.0, False, TINY_NORM),
                                                                   (0.0, False, 0.0)]


@pytest.mark.parametrize("zeros", [1, 3, 5, 8, 16, 40])
@pytest.mark.parametrize("window", [1, 2, 16])
def test_reference_zero_norms_do_not_lock_the_run(zeros, window):
    # Learnt, five zero norms at the start (one with a ring of 1 or 2) left the ring's median at
    # log(1e-30): every later norm was flagged and clipped to ~1e-30, and after the warm-up ZClip went
    # on from those, for good; their zero losses made the next losses loss spikes. Zeros at the start,
    # in the warm-up and after it: nothing is flagged.
    config = SpikeConfig(mode="clip", early_window=window, early_min=min(4, window))
    rng = np.random.default_rng(zeros)
    noise = list(rng.lognormal(0.0, 0.1, 400))
    norms = [0.0] * zeros + noise[:50] + [0.0] * zeros + noise[50:250] + [0.0] * zeros * 10 + noise[250:]
    losses = [0.0 if n == 0.0 else 2.3 + 0.05 * rng.standard_normal() for n in norms]  # masked: 0 too
    steps, state = zclip_run(norms, warmup=config.warmup, alpha=config.alpha, z_threshold=config.z_threshold,
                             early=config.reference_rule(), losses=losses,
                             loss_rule=config.reference_loss_rule())
    assert not any(s.spike for s in steps)
    assert state.count == state.loss_count == 400 and 0.9 < state.mean < 1.1


def test_spike_config_validation():
    assert not SpikeConfig().enabled and SpikeConfig(mode="skip").enabled
    for bad in ({"mode": "loud"}, {"warmup": 1}, {"warmup": 2.5}, {"alpha": 1.0}, {"alpha": 0.0},
                {"z_threshold": 0.0}, {"early_window": -1}, {"early_min": 0}, {"early_min_ratio": 1.0},
                {"early_min_ratio": 9.0, "early_max_ratio": 8.0}, {"early_max_ratio": math.inf},
                {"floor": 1.0}, {"floor": -0.1}):
        with pytest.raises(ValueError):
            SpikeConfig(**bad)


# -------------------------------------------------------------- device update vs the reference


def _kernel_or_skip():
    # Only a missing compiler skips: a kernel that fails its self-test must fail these tests.
    try:
        find_compiler()
    except KernelBuildError as exc:
        return pytest.mark.skipif(True, reason=f"no C++ compiler here: {exc}")
    return pytest.mark.skipif(False, reason="")


# The op path (zclip_update, the fallback) and the fused kernel both answer to the reference.
IMPLS = ["ops", pytest.param("kernel", marks=_kernel_or_skip())]


def _device_run(norms, warmup, alpha, z_thr, config: SpikeConfig | None = None, impl: str = "ops",
                losses=None, lrs=None):
    """The device update over ``norms`` (and ``losses``: the loss test's input, 0 when not given;
    ``lrs``: the learning-rate test's, 1e-3 when not given): per step ``(zscore, spike, target,
    loss_spike, lr_spike)``, and ``(count, mean, var, scale, early ring, loss part, lr part)`` of the
    final state."""
    config = config or SpikeConfig(early_window=0, loss_window=0, lr_ratio=0)
    state = Tensor(initial_state(config))
    losses = [0.0] * len(norms) if losses is None else losses
    lrs = [1e-3] * len(norms) if lrs is None else lrs
    update = None
    if impl == "kernel":
        update = SpikeDetector(replace(config, warmup=warmup, alpha=alpha, z_threshold=z_thr), fused=True)
    out = []
    for v, loss_value, lr_value in zip(norms, losses, lrs):
        norm, loss, lr = Tensor(np.float32(v)), Tensor(np.float32(loss_value)), Tensor(np.float32(lr_value))
        finite = Tensor(bool(np.isfinite(v)))
        if update is None:
            z, spike, target, state, loss_spike, lr_spike = zclip_update(
                norm, finite, state, warmup, alpha, z_thr, config.early_rule(), loss, config.loss_rule(),
                ema_constants(alpha, z_thr), lr, config.lr_rule())
        else:
            z, spike, target, state, loss_spike, lr_spike = update(norm, finite, state, loss, lr)
        out.append((float(z.asnumpy()), bool(spike.asnumpy()), float(target.asnumpy()),
                    bool(loss_spike.asnumpy()), bool(lr_spike.asnumpy())))
    values = state.asnumpy()
    count, mean, var = values[:3].tolist()
    lr_start = len(values) - (2 if config.lr_ratio else 0)
    end = lr_start - (2 + config.loss_window if config.loss_window else 0)
    return out, (int(count), mean, var, values[3:4], values[4:end], values[end:lr_start], values[lr_start:])


@pytest.mark.parametrize("impl", IMPLS)
def test_device_zero_norm_boundary_matches_reference(impl):
    # TINY_NORM in float32 is a zero norm; the next float32 up is counted, on device and in the reference.
    tiny = np.float32(TINY_NORM)
    config = SpikeConfig(mode="detect", warmup=4, early_min=2, loss_window=0, lr_ratio=0)
    for norm, counted in ((tiny, 0), (np.nextafter(tiny, np.float32(1.0)), 1), (np.float32(0.0), 0)):
        norms = [1.0, 2.0, float(norm)]
        _, (count, *_rest) = _device_run(norms, config.warmup, config.alpha, config.z_threshold, config, impl)
        _, state = zclip_run(norms, warmup=config.warmup, alpha=config.alpha, z_threshold=config.z_threshold,
                             early=config.reference_rule())
        assert count == state.count == 2 + counted


norm_values = st.one_of(
    st.floats(0.0625, 20.0, allow_nan=False, allow_infinity=False, width=32),
    st.sampled_from([math.nan, math.inf, 500.0]),
)


@pytest.mark.parametrize("impl", IMPLS)
@settings(max_examples=60, deadline=None)
@given(norms=st.lists(norm_values, min_size=1, max_size=14),
       warmup=st.integers(2, 5), alpha=st.sampled_from([0.5, 0.9, 0.97]), z_thr=st.sampled_from([1.0, 2.5]))
def test_device_update_matches_reference(impl, norms, warmup, alpha, z_thr):
    norms = [float(np.float32(v)) for v in norms]
    ref_steps, ref_state = zclip_run(norms, warmup=warmup, alpha=alpha, z_threshold=z_thr,
                                     early=NO_EARLY_RULE)
    dev_steps, (count, mean, var, *_) = _device_run(norms, warmup, alpha, z_thr, impl=impl)
    for ref, (z, spike, target, _, _), v in zip(ref_steps, dev_steps, norms):
        if not math.isfinite(v):
            assert z == 0.0 and not spike
            continue
        # a z-score within float32 noise of the threshold may legitimately land on either side
        if abs(ref.zscore - z_thr) > 1e-3 * max(1.0, abs(ref.zscore)):
            assert spike == ref.spike
        if spike == ref.spike:
            np.testing.assert_allclose(z, ref.zscore, rtol=1e-3, atol=1e-3)
            np.testing.assert_allclose(target, ref.target, rtol=1e-4, atol=1e-6)
    if all(s.spike == d[1] for s, d in zip(ref_steps, dev_steps)):
        assert count == ref_state.count
        if ref_state.count >= warmup:
            ref_mean, ref_var = ref_state.mean, ref_state.var
        elif ref_state.warm:  # mid warm-up the device keeps the running mean and variance so far
            ref_mean = sum(ref_state.warm) / len(ref_state.warm)
            ref_var = sum((x - ref_mean) ** 2 for x in ref_state.warm) / len(ref_state.warm)
        else:
            ref_mean = ref_var = 0.0
        np.testing.assert_allclose(mean, ref_mean, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(var, ref_var, rtol=2e-3, atol=1e-5)


early_norms = st.one_of(
    st.floats(0.0625, 20.0, allow_nan=False, allow_infinity=False, width=32),
    st.sampled_from([math.nan, math.inf, 0.0, 200.0, 5000.0]),
)


@pytest.mark.parametrize("impl", IMPLS)
@settings(max_examples=15, deadline=None)
@given(norms=st.lists(early_norms, min_size=1, max_size=16), warmup=st.integers(2, 30),
       window=st.sampled_from([1, 4, 5, 16]), ratios=st.sampled_from([(4.0, 8.0), (2.0, 2.0), (1.5, 30.0)]),
       floor=st.sampled_from([0.0, 0.01, 0.5]))
@example(norms=[1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0], warmup=10, window=1, ratios=(1.5, 30.0),
         floor=0.0)  # (z of d = -0.0119 at log -69: the device 10 float32 ulps from numpy)
def test_device_early_rule_matches_reference(impl, norms, warmup, window, ratios, floor):
    config = SpikeConfig(early_window=window, early_min_ratio=ratios[0], early_max_ratio=ratios[1],
                         floor=floor, loss_window=0, lr_ratio=0)
    norms = [float(np.float32(v)) for v in norms]
    ref_steps, ref_state = zclip_run(norms, warmup=warmup, alpha=config.alpha, z_threshold=config.z_threshold,
                                     early=config.reference_rule())
    dev_steps, (count, _, _, scale, ring, *_) = _device_run(norms, warmup, config.alpha, config.z_threshold,
                                                           config, impl)
    # The early rule's z-score is z_threshold * d / t, d a difference of logs (of the norm and of the
    # ring's median, a spike's target carried from step to step), t >= log(early_min_ratio): a few
    # float32 ulps of the largest log per step (a zero norm's, log(1e-30) = -69: 7.6e-6 each) over t.
    # Found here: a zero norm, then spikes, then a zero norm again: d = -0.0119 at -69, 10 ulps apart.
    largest = max((abs(math.log(max(v, TINY_NORM))) for v in norms if math.isfinite(v)), default=1.0)
    z_atol = max(1e-3, config.z_threshold / math.log(ratios[0]) * float(np.spacing(np.float32(largest)))
                 * (2 * len(norms) + 4))
    agree = True
    for ref, (z, spike, target, _, _) in zip(ref_steps, dev_steps):
        # float32 log on device and in numpy may differ by an ulp: a verdict at the threshold may differ
        if abs(ref.zscore - config.z_threshold) > 1e-4 * max(1.0, abs(ref.zscore)):
            assert spike == ref.spike
        if spike != ref.spike:
            agree = False
            break
        np.testing.assert_allclose(z, ref.zscore, rtol=1e-3, atol=z_atol)
        np.testing.assert_allclose(target, ref.target, rtol=1e-4, atol=1e-6)
    if agree:
        assert count == ref_state.count
        filled = min(count, window)
        np.testing.assert_allclose(sorted(ring[:filled]), sorted(ref_state.ring), rtol=1e-5, atol=1e-5)
        # The scale is exp of a float32 mean of logs: its relative error is the log's absolute error,
        # a few float32 ulps of the log (7.6e-6 each near log(1e-30) = -69, where a zero norm puts it).
        if ref_state.scale <= 0.0:  # no scale yet
            assert float(scale[0]) == ref_state.scale
        else:
            log_ref = math.log(ref_state.scale)
            ulps = 32 * float(np.spacing(np.float32(abs(log_ref))))
            assert abs(math.log(float(scale[0])) - log_ref) <= 1e-4 + ulps


loss_values = st.one_of(
    st.floats(0.5, 3.0, allow_nan=False, allow_infinity=False, width=32),
    st.sampled_from([math.nan, math.inf, 0.0, -1.0, 1e-7, 400.0, 1e6]),
)


lr_values = st.one_of(
    st.floats(float(np.float32(1e-4)), float(np.float32(2e-3)), allow_nan=False, allow_infinity=False,
              width=32),
    st.sampled_from([math.nan, math.inf, 0.0, -1e-3, 0.05, 0.1, 1e-6]),
)


@settings(max_examples=12, deadline=None)
@given(steps=st.lists(st.tuples(early_norms, loss_values, lr_values), min_size=1, max_size=16),
       warmup=st.integers(2, 12), window=st.sampled_from([1, 3, 16]), min_history=st.integers(1, 4),
       ratio=st.sampled_from([2.0, 150.0]), floor=st.sampled_from([0.0, 0.01, 0.5]),
       early_window=st.sampled_from([0, 4]), alpha=st.sampled_from([0.99, 0.9]))
def test_device_loss_test_matches_reference_and_kernel_equals_op_path(steps, warmup, window, min_history,
                                                                      ratio, floor, early_window, alpha):
    """The op path and the kernel give the same bits (flags, targets, the whole state; the early rule's
    exp included), and the loss and learning-rate tests the reference's verdicts and state."""
    config = SpikeConfig(mode="detect", warmup=warmup, alpha=alpha, early_window=early_window,
                         early_min=2, loss_window=window, loss_min=min_history, loss_ratio=ratio,
                         loss_floor=floor)
    norms = [float(np.float32(n)) for n, _, _ in steps]
    losses = [float(np.float32(loss)) for _, loss, _ in steps]
    lrs = [float(np.float32(lr)) for _, _, lr in steps]
    ops_steps, ops_state = _device_run(norms, warmup, config.alpha, config.z_threshold, config, "ops", losses,
                                       lrs)
    ker_steps, ker_state = _device_run(norms, warmup, config.alpha, config.z_threshold, config, "kernel",
                                       losses, lrs)
    assert ops_steps == ker_steps or all(  # NaN targets compare unequal as floats
        a[1:2] + a[3:] == b[1:2] + b[3:] and np.array_equal(a[::2], b[::2], equal_nan=True)
        for a, b in zip(ops_steps, ker_steps))
    for a, b in zip(ops_state[3:], ker_state[3:]):
        np.testing.assert_array_equal(a, b)
    assert ops_state[:3] == ker_state[:3]
    ref_steps, ref_state = zclip_run(norms, warmup=warmup, alpha=config.alpha,
                                     z_threshold=config.z_threshold, early=config.reference_rule(),
                                     losses=losses, loss_rule=config.reference_loss_rule(), lrs=lrs,
                                     lr_rule=config.reference_lr_rule())
    assert [s.loss_spike for s in ref_steps] == [d[3] for d in ker_steps]
    assert [s.lr_spike for s in ref_steps] == [d[4] for d in ker_steps]
    assert ker_state[6].tolist() == [ref_state.lr_count, np.float32(ref_state.lr_top)]
    assert all(s.spike >= s.loss_spike for s in ref_steps)
    count, scale, ring = ker_state[5][0], ker_state[5][1], ker_state[5][2:]
    assert count == ref_state.loss_count
    np.testing.assert_array_equal(sorted(ring[:min(int(count), window)]), sorted(ref_state.loss_ring))
    assert scale == np.float32(ref_state.loss_scale)


def test_loss_test_needs_the_loss_and_validates():
    state = Tensor(initial_state(SpikeConfig()))
    with pytest.raises(ValueError, match="needs the step's loss"):
        zclip_update(Tensor(np.float32(1.0)), Tensor(True), state, 10, 0.99, 7.5, SpikeConfig().early_rule(),
                     None, SpikeConfig().loss_rule())
    for bad in ({"loss_window": -1}, {"loss_min": 0}, {"loss_ratio": 0.0}, {"loss_ratio": math.inf},
                {"loss_floor": -0.1}):
        with pytest.raises(ValueError, match="spike_loss"):
            SpikeConfig(**bad)


def test_reference_loss_test_flags_the_loss_the_norm_misses():
    """A loss 400x its recent median with an ordinary norm: a spike, clipped to the norm's level; a
    converged run's 1000x at loss 1e-7 is under the floor; with the default ratio 150 a 79x loss
    (the suite's largest clean one) is not a spike."""
    norms = [1.0 + 0.05 * (i % 3) for i in range(30)]
    losses = [2.0 - 0.01 * i for i in range(30)]
    for at, factor, expected in ((20, 400.0, True), (20, 79.0, False)):
        bumped = list(losses)
        bumped[at] *= factor
        steps, _ = zclip_run(norms, warmup=10, alpha=0.9, z_threshold=7.5, losses=bumped)
        assert [s.loss_spike for s in steps] == [i == at and expected for i in range(30)]
        assert steps[at].spike == expected and steps[at].zscore < 7.5
        if expected:
            assert steps[at].target <= norms[at]
    converged = [2.0] * 10 + [1e-7] * 20
    converged[25] = 1e-4
    steps, state = zclip_run(norms, warmup=10, alpha=0.9, z_threshold=7.5, losses=converged)
    assert not any(s.spike for s in steps) and state.loss_scale == pytest.approx(2.0)


def test_state_shape_follows_the_early_window():
    d = SpikeConfig()
    assert initial_state(d).shape == (4 + d.early_window + 2 + d.loss_window + 2,)  # ... + [lr_count, lr_top]
    off = SpikeConfig(early_window=0, loss_window=0, lr_ratio=0)
    assert initial_state(off).shape == (3,) and off.early_rule() == () and off.loss_rule() == ()
    assert off.lr_rule() == ()
    assert initial_state(SpikeConfig(early_window=0)).shape == (3 + 2 + d.loss_window + 2,)
    assert initial_state(SpikeConfig(lr_ratio=0)).shape == (4 + d.early_window + 2 + d.loss_window,)


# --------------------------------------------------------------------------------- ring unroll


def _ring_after(steps: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """What the device ring holds after ``steps`` steps whose loss column is the step number."""
    fields = BASE_FIELDS
    ring = np.zeros((size, len(fields)), np.float32)
    for s in range(1, steps + 1):
        ring[(s - 1) % size, 0] = s
    counts = np.array([steps, 1, 2, 3, 4], np.int32)
    return ring, counts


@pytest.mark.parametrize(("steps", "size"), [(0, 4), (3, 4), (4, 4), (5, 4), (11, 4), (9, 1)])
def test_unroll_ring_oldest_first_with_wraparound(steps, size):
    ring, counts = _ring_after(steps, size)
    snap = unroll_ring(ring, counts, BASE_FIELDS)
    assert isinstance(snap, HistorySnapshot)
    n = min(steps, size)
    assert snap.total_steps == steps and snap.rows.shape == (n, len(BASE_FIELDS))
    assert snap.first_step == steps - n + 1
    assert snap.column("loss").tolist() == list(range(steps - n + 1, steps + 1))
    assert snap.counters == {"clipped": 1, "spikes": 2, "skipped": 3, "nonfinite": 4}


def test_history_fields_optional_columns():
    assert history_fields(False, False) == BASE_FIELDS
    assert history_fields(True, True)[-2:] == ("loss_scale", "grad_norm_local")


# ---------------------------------------------------------------------------------- layer rows


def test_layer_rows_sorted_topk_and_ratio():
    rows = layer_rows(["a.w", "a.b", "b.w"], [9.0, 1.0, 16.0], [4.0, 0.0, 64.0], lr=0.1, top_k=2)
    assert [r["name"] for r in rows] == ["b.w", "a.w"]
    assert rows[0] == {"name": "b.w", "grad_norm": 4.0, "param_norm": 8.0,
                       "update_ratio": pytest.approx(0.05)}
    everything = layer_rows(["a.w", "a.b", "b.w"], [9.0, 1.0, 16.0], [4.0, 0.0, 64.0], lr=0.1, top_k=None)
    assert everything[-1]["update_ratio"] == math.inf  # zero weights, non-zero gradient


def test_layer_rows_groups_and_nan_first():
    rows = layer_rows(["a.w", "a.b", "b.w"], [9.0, 16.0, math.nan], [1.0, 3.0, 1.0], lr=1.0,
                      groups=["a.*", "b.*", "zzz.*"])
    assert [r["name"] for r in rows] == ["b.*", "a.*"]
    assert math.isnan(rows[0]["grad_norm"])
    assert rows[1]["grad_norm"] == 5.0 and rows[1]["param_norm"] == 2.0
    with pytest.raises(ValueError):
        layer_rows(["a"], [1.0, 2.0], [1.0], lr=1.0)
