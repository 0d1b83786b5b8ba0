"""gradmon's step cell on mindformers' real LlamaForCausalLM: norms against a float64 reference."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mindformers", reason="mindformers is not installed (make test-mindformers)")

from gradmon.cells import MonitoredTrainStep
from mindformers.core.clip_grad import ClipGradNorm
from mindspore import nn

from tests.with_mindformers.mf_util import batch, copy_weights, norm64, reference_grads, twins, weights


def test_tiny_llama_norm_and_clipped_update_match_float64_reference(mode):
    """Each step's norm is the float64 norm of independently computed gradients (value_and_grad on a
    twin), the update is SGD on the clipped gradients, and mindformers' own ClipGradNorm agrees."""
    net, ref = twins()
    lr, max_norm = 0.5, 1.0
    step = MonitoredTrainStep(net, nn.SGD(net.trainable_params(), lr), max_norm=max_norm)
    step.set_train()  # LlamaForCausalLM slices inputs and labels from the tokens only when training
    mf_clip = ClipGradNorm(max_norm=max_norm)
    worst = 0.0
    for seed in range(3 if mode == "GRAPH" else 2):
        tokens = batch(seed)
        grads32, grads = reference_grads(ref, tokens)
        before = weights(net)
        loss, norm = step(tokens)
        expected = norm64(grads)
        assert np.isfinite(float(loss.asnumpy().mean()))
        rel = abs(float(norm.asnumpy()) - expected) / expected
        worst = max(worst, rel)
        assert rel < 1e-5, (seed, float(norm.asnumpy()), expected)
        _, mf_norm = mf_clip(tuple(grads32))
        np.testing.assert_allclose(float(mf_norm.asnumpy()), expected, rtol=1e-5)
        coef = min(1.0, max_norm / (expected + 1e-6))
        assert coef < 0.995, "the tiny Llama's norm (1.0 to 1.4 here) must exercise clipping"
        # The update is SGD on the clipped gradients: off by < 1e-4 of its size, where the unclipped
        # update would be off by 1 - coef (> 0.5 %).
        update = [w1.astype(np.float64) - w0 for w0, w1 in zip(before, weights(net))]
        expected_update = [-lr * coef * g for g in grads]
        off = norm64([u - e for u, e in zip(update, expected_update)]) / norm64(expected_update)
        assert off < 1e-4, off
        copy_weights(net, ref)
    snap = step.gradmon_read_history()
    assert snap.total_steps == (3 if mode == "GRAPH" else 2)
    assert snap.counters["clipped"] == snap.total_steps
    print(f"{mode}: worst relative norm error vs float64 {worst:.1e}")
