"""gradmon's adapter to mindformers 2.x's PyNative Trainer and its spike defence, driven by a loop that
follows that Trainer (tests/trainer_loop.py) with duck-typed handler, state and config: real MindSpore
training in PYNATIVE mode on CPU, no mindformers. tests/with_mindformers2/ runs the same against
mindformers 2.1's real CallbackHandler, TrainerState and TrainConfig (make test-mindformers2)."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn
from mindspore.train import Model

from gradmon import LiveMonitor
from gradmon.integrations.trainer_callback import TrainerLiveMonitor
from gradmon.integrations.trainer_defence import SpikeDefence
from gradmon.logformat.reader import read_records
from tests.trainer_loop import LoopTrainer, duck_config, make_batch


@pytest.fixture(autouse=True)
def pynative():
    old = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    yield
    ms.set_context(mode=old)


def records(path):
    return list(read_records(path))


def steps_of(recs):
    return [r for r in recs if r["type"] == "step"]


def events_of(recs, kind):
    return [r for r in recs if r["type"] == "event" and r["kind"] == kind]


class DefendedLoop(SpikeDefence, LoopTrainer):
    """The spike defence mixed into the loop as into mindformers' Trainer."""


def test_log_has_the_loops_norms_losses_rates_and_the_trainers_settings(tmp_path):
    log = tmp_path / "metrics.jsonl"
    loop = LoopTrainer(duck_config(steps=6, max_norm=1.0), callbacks=[TrainerLiveMonitor(log)], epoch_step=4)
    loop.train()
    recs = records(log)
    header, steps = recs[0], steps_of(recs)
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5, 6]
    assert [r["epoch"] for r in steps] == [1, 1, 1, 1, 2, 2]
    assert [r["grad_norm"] for r in steps] == pytest.approx(loop.norms, rel=1e-6)
    assert [r["loss"] for r in steps] == pytest.approx(loop.losses, rel=1e-6)
    assert [r["lr"] for r in steps] == pytest.approx(loop.lrs, rel=1e-6)
    assert [bool(r.get("clipped")) for r in steps] == [n > 1.0 for n in loop.norms]
    assert all(r["throughput"] == pytest.approx(16 / r["step_time"]) for r in steps)
    trainer = header["trainer"]
    assert trainer["max_norm"] == 1.0 and trainer["use_skip_step_on_nan"] is False
    assert trainer["global_batch_size"] == 16
    assert trainer["parallel_layout"]["pipeline_parallel"] == 1
    assert (header["max_norm"], header["initial_step_from"]) == (1.0, "trainer_state")
    assert header["steps_per_epoch"] == 4
    assert recs[-1]["type"] == "end" and recs[-1]["status"] == "finished"


def test_nan_steps_are_skipped_in_the_log_and_keep_the_rate(tmp_path):
    log = tmp_path / "metrics.jsonl"
    loop = LoopTrainer(duck_config(steps=5, use_skip_step_on_nan=True), callbacks=[TrainerLiveMonitor(log)],
                       batches=lambda step: make_batch(step, nan=step in (1, 2)))
    loop.train()
    steps = steps_of(records(log))
    assert [bool(r.get("skipped")) for r in steps] == [False, True, True, False, False]
    assert all(steps[i]["skip_reason"] == "nonfinite" and steps[i]["nonfinite"] for i in (1, 2))
    assert loop.state.skipped_steps == 2
    # A skipped step does not advance the optimizer's global_step: steps 2-4 use the same rate.
    assert [r["lr"] for r in steps] == pytest.approx(loop.lrs, rel=1e-6)
    assert steps[1]["lr"] == steps[3]["lr"] != steps[4]["lr"]
    assert len(events_of(records(log), "nonfinite")) == 2


def test_abort_after_stops_the_loop(tmp_path):
    log = tmp_path / "metrics.jsonl"
    loop = LoopTrainer(duck_config(steps=20, use_skip_step_on_nan=True),
                       callbacks=[TrainerLiveMonitor(log, abort_after=2)],
                       batches=lambda step: make_batch(step, nan=step >= 3))
    loop.train()
    recs = records(log)
    assert loop.state.global_step == 5 and len(loop.norms) == 5  # steps 4 and 5 bad: stopped after 5
    assert events_of(recs, "abort")[0]["step"] == 5
    assert recs[-1]["status"] == "aborted"


def _raising_loop(log, mixin=False):
    cls = DefendedLoop if mixin else LoopTrainer
    extra = {"spike_mode": "detect"} if mixin else {}
    return cls(duck_config(steps=20, use_skip_step_on_nan=True, max_consecutive_skipped_steps=2),
               callbacks=[TrainerLiveMonitor(log)], batches=lambda step: make_batch(step, nan=step >= 3),
               **extra)


def test_an_exception_ends_the_log_as_failed_when_the_trainer_goes(tmp_path):
    log = tmp_path / "metrics.jsonl"
    loop = _raising_loop(log)
    with pytest.raises(RuntimeError, match="SkipStepOnNaN"):
        loop.train()  # no on_train_end after the raise, as in mindformers 2.1
    assert "end" not in [r["type"] for r in records(log)]  # still open while the trainer lives
    del loop
    gc.collect()
    recs = records(log)
    assert recs[-1]["type"] == "end" and recs[-1]["status"] == "failed"
    assert [r["step"] for r in steps_of(recs)] == [1, 2, 3, 4]  # the steps before the failing one


def test_the_mixins_train_ends_the_log_at_once(tmp_path):
    log = tmp_path / "metrics.jsonl"
    loop = _raising_loop(log, mixin=True)
    with pytest.raises(RuntimeError, match="SkipStepOnNaN"):
        loop.train()
    assert records(log)[-1]["status"] == "failed"


def test_an_uncaught_exception_ends_the_log_as_failed(tmp_path):
    log = tmp_path / "metrics.jsonl"
    script = textwrap.dedent(f"""
        import mindspore as ms
        ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
        from tests.trainer_loop import LoopTrainer, duck_config, make_batch
        from gradmon.integrations.trainer_callback import TrainerLiveMonitor
        loop = LoopTrainer(duck_config(steps=20, use_skip_step_on_nan=True, max_consecutive_skipped_steps=1),
                           callbacks=[TrainerLiveMonitor({str(log)!r})],
                           batches=lambda step: make_batch(step, nan=step >= 2))
        loop.train()
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=".")
    assert done.returncode == 1 and "SkipStepOnNaN" in done.stderr
    recs = records(log)
    assert recs[-1]["type"] == "end" and recs[-1]["status"] == "failed"


def test_spike_defence_flags_clips_and_alarms_once_on_a_loss_spike(tmp_path):
    log = tmp_path / "metrics.jsonl"
    monitor = TrainerLiveMonitor(log, alarm_config={"min_history": 8})
    loop = DefendedLoop(duck_config(steps=13, max_norm=100.0), callbacks=[monitor],
                        batches=lambda step: make_batch(step, scale=1000.0 if step == 10 else 1.0),
                        spike_mode="clip", spike_warmup=8)
    loop.train()
    recs = records(log)
    steps = steps_of(recs)
    assert recs[0]["spike_mode"] == "clip" and recs[0]["trainer"]["spike"]["warmup"] == 8
    assert [r["step"] for r in steps if r.get("spike")] == [11]
    spike = steps[10]
    assert spike["clipped"] and spike["clip_coef"] < 0.01 and spike["zscore"] > 5
    assert spike["grad_norm"] == pytest.approx(loop.norms[10], rel=1e-6)  # the norm before any clip
    assert spike["loss"] > 100 * steps[9]["loss"]
    assert len(events_of(recs, "alarm")) == 1 and len(events_of(recs, "spike")) == 1


def test_spike_defence_clips_an_early_fault_inside_the_warm_up(tmp_path):
    # The default warm-up is 100 steps: a x1000 batch at the 8th step is judged by the early rule
    # (median/MAD of the first log-norms), as in MonitoredTrainStep, not waved through.
    log = tmp_path / "metrics.jsonl"
    loop = DefendedLoop(duck_config(steps=10, max_norm=100.0), callbacks=[TrainerLiveMonitor(log)],
                        batches=lambda step: make_batch(step, scale=1000.0 if step == 7 else 1.0),
                        spike_mode="clip")
    loop.train()
    recs = records(log)
    steps = steps_of(recs)
    assert recs[0]["trainer"]["spike"]["warmup"] == 100 and recs[0]["trainer"]["spike"]["early_window"] == 16
    assert [r["step"] for r in steps if r.get("spike")] == [8]
    assert steps[7]["clipped"] and steps[7]["clip_coef"] < 0.05


def _weights_change(mode, tmp_path):
    seen = []

    class Probe(DefendedLoop):
        def training_step(self, step):
            before = self.weights()
            out = super().training_step(step)
            seen.append(max(float(np.abs(a - b).max()) for a, b in zip(before, self.weights())))
            return out

    monitor = TrainerLiveMonitor(tmp_path / f"{mode}.jsonl")
    loop = Probe(duck_config(steps=9, max_norm=100.0), callbacks=[monitor],
                 batches=lambda step: make_batch(step, scale=1000.0 if step == 7 else 1.0),
                 spike_mode=mode, spike_warmup=6)
    loop.train()
    return seen, steps_of(records(tmp_path / f"{mode}.jsonl"))


def test_spike_skip_leaves_the_weights_and_detect_only_flags(tmp_path):
    skip_moves, skip_steps = _weights_change("skip", tmp_path)
    detect_moves, detect_steps = _weights_change("detect", tmp_path)
    assert [r["step"] for r in skip_steps if r.get("spike")] == [8]
    assert skip_steps[7]["skipped"] and skip_steps[7]["skip_reason"] == "spike"
    assert skip_moves[7] == 0.0 and skip_moves[6] > 0.0
    assert detect_steps[7]["spike"] and not detect_steps[7].get("skipped") and detect_moves[7] > 0.0
    # the rate of the step after a skipped one is the skipped step's (global_step did not advance)
    assert skip_steps[8]["lr"] == skip_steps[7]["lr"] != detect_steps[8]["lr"]


def test_the_mixin_refuses_no_defence():
    with pytest.raises(ValueError, match="spike_mode"):
        DefendedLoop(duck_config(steps=1), callbacks=[], spike_mode="off")


def test_the_same_class_runs_under_model_train(tmp_path):
    log = tmp_path / "metrics.jsonl"
    net = nn.Dense(8, 1)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.01))
    data = ms.dataset.NumpySlicesDataset(
        {"x": np.ones((4, 8), np.float32), "y": np.ones((4, 1), np.float32)}, shuffle=False).batch(2)
    Model(step).train(1, data, callbacks=[TrainerLiveMonitor(log)], dataset_sink_mode=False)
    recs = records(log)
    assert [r["step"] for r in steps_of(recs)] == [1, 2] and "trainer" not in recs[0]
    assert recs[-1]["status"] == "finished"


def test_plain_live_monitor_under_the_pynative_trainer_names_the_adapter(tmp_path):
    loop = LoopTrainer(duck_config(steps=1), callbacks=[LiveMonitor(tmp_path / "m.jsonl")])
    with pytest.raises(TypeError, match="MindFormersLiveMonitor"):
        loop.train()


def test_runner_wrapper_in_a_pynative_config_warns(tmp_path):
    cfg = duck_config(steps=1, runner_wrapper={"type": "GradmonTrainStep"})
    with pytest.warns(UserWarning, match="runner_wrapper .GradmonTrainStep. is ignored"):
        LoopTrainer(cfg, callbacks=[TrainerLiveMonitor(tmp_path / "m.jsonl")]).train()
    with pytest.warns(UserWarning, match="GradmonTrainer"):
        DefendedLoop(cfg, callbacks=[], spike_mode="detect")


def test_a_resumed_trainer_continues_the_numbering(tmp_path):
    class Resumed(LoopTrainer):
        def _init_train_state(self):
            state = super()._init_train_state()
            state.global_step = 4  # as _load_checkpoint restores it
            return state

    log = tmp_path / "metrics.jsonl"
    Resumed(duck_config(steps=6), callbacks=[TrainerLiveMonitor(log)], epoch_step=4).train()
    recs = records(log)
    assert (recs[0]["initial_step"], recs[0]["initial_step_from"]) == (4, "trainer_state")
    assert [(r["step"], r["epoch"]) for r in steps_of(recs)] == [(5, 2), (6, 2)]
