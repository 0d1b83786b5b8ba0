"""The pure half of gradmon's adapter to mindformers 2.x's PyNative Trainer
(gradmon/integrations/trainer_state.py): its config and state duck-typed, no MindSpore, no mindformers."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from gradmon.integrations.trainer_state import (
    TrainerStepHistory,
    clip_coefficient,
    parallel_layout,
    runner_wrapper_warning,
    step_epoch,
    trainer_settings,
)


def config(**parallelism):
    training = SimpleNamespace(max_norm=0.5, use_skip_step_on_nan=True, max_consecutive_skipped_steps=3,
                               global_batch_size=64, local_batch_size=4)
    par = {"tensor_parallel": 1, "pipeline_parallel": 1, "context_parallel": 1, "expert_parallel": 1,
           "data_parallel_shard": -1, **parallelism}
    return SimpleNamespace(training=training, parallelism=SimpleNamespace(**par))


STATE = SimpleNamespace(global_batch_size=64, num_accumulation_steps=2, max_steps=100, skipped_steps=0)


def test_settings_carry_clip_skip_batch_and_layout():
    s = trainer_settings(config(tensor_parallel=2, pipeline_parallel=2), STATE, world_size=8)
    assert s["max_norm"] == 0.5 and s["use_skip_step_on_nan"] is True
    assert s["max_consecutive_skipped_steps"] == 3
    assert (s["global_batch_size"], s["local_batch_size"], s["num_accumulation_steps"]) == (64, 4, 2)
    assert s["parallel_layout"] == {"data_parallel": 2, "tensor_parallel": 2, "pipeline_parallel": 2,
                                    "context_parallel": 1, "expert_parallel": 1}
    assert "spike" not in s and "ignored" not in s


def test_layout_reads_mappings_and_the_stored_data_parallel_degree():
    cfg = {"parallelism": {"tensor_parallel": 4, "data_parallel": 3, "data_parallel_shard": 2}}
    assert parallel_layout(cfg, 16) == {"data_parallel": 3, "tensor_parallel": 4, "pipeline_parallel": 1,
                                        "context_parallel": 1, "expert_parallel": 1, "data_parallel_shard": 2}
    assert parallel_layout(None, 4)["data_parallel"] == 4  # no section: all data parallel


def test_spike_settings_on_the_state_go_into_the_header():
    state = SimpleNamespace(**vars(STATE), gradmon_spike={"mode": "clip", "warmup": 10})
    assert trainer_settings(config(), state, 1)["spike"] == {"mode": "clip", "warmup": 10}


def test_runner_wrapper_warning_names_what_to_use():
    cfg = config()
    assert runner_wrapper_warning(cfg) is None
    cfg.runner_wrapper = SimpleNamespace(type="GradmonTrainStep", max_norm=1.0)
    text = runner_wrapper_warning(cfg)
    assert "runner_wrapper (GradmonTrainStep) is ignored" in text
    assert "GradmonTrainer" in text and "{type: LiveMonitor}" in text and "training.max_norm" in text
    assert trainer_settings(cfg, STATE, 1)["ignored"] == ["runner_wrapper"]
    assert "runner_wrapper is ignored" in runner_wrapper_warning({"runner_wrapper": {}})


@pytest.mark.parametrize(("step", "length", "epoch"), [(1, 10, 1), (10, 10, 1), (11, 10, 2), (5, 0, None)])
def test_step_epoch(step, length, epoch):
    assert step_epoch(step, length) == epoch


def test_clip_coefficient_is_the_trainers():
    assert clip_coefficient(2.0, 1.0) == pytest.approx(1.0 / (2.0 + 1e-6))
    assert clip_coefficient(0.5, 1.0) == 1.0
    assert clip_coefficient(math.nan, 1.0) == 1.0 and clip_coefficient(3.0, None) == 1.0


class FakeTensor:
    """What the history reads of a device tensor: ``asnumpy()``, and it counts the reads."""

    reads = 0

    def __init__(self, value):
        self.value = np.float32(value)

    def asnumpy(self):
        FakeTensor.reads += 1
        return np.asarray(self.value)


def rows(history):
    snap = history.gradmon_read_history()
    return snap, [dict(zip(snap.fields, row)) for row in snap.rows]


def test_history_keeps_tensors_until_read_and_flags_each_step():
    history = TrainerStepHistory(max_norm=1.0, skip_nonfinite=True)
    FakeTensor.reads = 0
    history.record(1, loss=FakeTensor(2.0), grad_norm=FakeTensor(0.5), skipped=False)
    history.record(2, loss=FakeTensor(2.0), grad_norm=FakeTensor(4.0), skipped=False)
    history.record(3, loss=FakeTensor(np.nan), grad_norm=FakeTensor(np.nan), skipped=True)
    assert FakeTensor.reads == 0  # nothing read before the monitor reads
    snap, (a, b, c) = rows(history)
    assert snap.total_steps == 3 and "zscore" not in snap.fields
    assert (a["loss"], a["grad_norm"]) == (2.0, 0.5)
    assert (a["clipped"], a["skipped"], a["nonfinite"]) == (0.0, 0.0, 0.0)
    assert b["clipped"] == 1.0 and b["clip_coef"] == pytest.approx(0.25, rel=1e-5)
    assert c["skipped"] == 1.0 and c["nonfinite"] == 1.0 and c["clipped"] == 0.0
    assert history.gradmon_read_history().rows == []  # read once


def test_history_without_loss_on_a_stage_that_has_none():
    history = TrainerStepHistory(max_norm=1.0, skip_nonfinite=False)
    history.record(1, loss=None, grad_norm=0.3, skipped=False)
    snap, (row,) = rows(history)
    assert "loss" not in snap.fields and row["grad_norm"] == pytest.approx(0.3)


def test_history_takes_the_spike_defences_outcome():
    history = TrainerStepHistory(max_norm=10.0, skip_nonfinite=True, spike_mode="clip")
    history.record(1, loss=1.0, grad_norm=8.0, skipped=False,
                   defence={"step": 1, "spike": True, "zscore": FakeTensor(7.5), "skipped": False,
                            "clip_coef": 0.2})
    history.record(2, loss=1.0, grad_norm=9.0, skipped=False,
                   defence={"step": 2, "spike": True, "zscore": 9.0, "skipped": True})
    _, (clip, skip) = rows(history)
    assert history.gradmon_config()["spike_mode"] == "clip"
    assert (clip["spike"], clip["clipped"], clip["zscore"], clip["clip_coef"]) == (1.0, 1.0, 7.5, 0.2)
    assert (skip["spike"], skip["skipped"], skip["clipped"], skip["clip_coef"]) == (1.0, 1.0, 0.0, 1.0)


def test_an_unread_history_stays_bounded():
    history = TrainerStepHistory(max_norm=None, skip_nonfinite=False, limit=3)
    for step in range(1, 11):
        history.record(step, loss=1.0, grad_norm=1.0, skipped=False)
    snap = history.gradmon_read_history()
    assert len(snap.rows) == 3 and snap.total_steps == 10
