"""gradmon under mindformers 2.1's PyNative callback protocol: its real ``CallbackHandler``,
``TrainConfig``, ``TrainerState``, ``LossCallback`` and callback registry, driven by a loop that follows
the PyNative Trainer's ``_inner_train_loop`` (tests/trainer_loop.py; PYNATIVE on CPU)."""

from __future__ import annotations

import gc
import json

import pytest

from tests.with_mindformers2.conftest import load_trainer_state, mindformers_major

if mindformers_major() < 2:
    pytest.skip("mindformers 2.x is not installed (make test-mindformers2)", allow_module_level=True)

import mindspore as ms
from mindformers.parallel_core.transformer_config import TransformerConfig
from mindformers.pynative.callback import CallbackHandler, LossCallback, MonitorCallback, TrainerCallback
from mindformers.pynative.callback import loss_callback as loss_callback_module
from mindformers.pynative.config import TrainConfig
from mindformers.tools.register import MindFormerModuleType, MindFormerRegister

import gradmon.integrations.mindformers as gm_mf  # registers LiveMonitor in mindformers
from gradmon.integrations.trainer_defence import SpikeDefence
from gradmon.logformat.reader import read_records
from gradmon.monitor import segment as segment_module
from tests.trainer_loop import LoopTrainer, make_batch

TrainerState = load_trainer_state()


@pytest.fixture(autouse=True)
def pynative():
    old = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    yield
    ms.set_context(mode=old)


class LossLines:
    """Stands in for loss_callback's logger: keeps the lines LossCallback writes."""

    def __init__(self):
        self.lines = []

    def info(self, msg, *args):
        self.lines.append(msg % args if args else msg)

    def warning(self, msg, *args):
        pass


# What TrainConfig requires besides: names of the parts the loop supplies itself (model, data, optimizer).
REQUIRED = {"optimizer": {"type": "AdamW"}, "lr_scheduler": {"type": "ConstantWarmUpLR"},
            "train_dataset": {"dataloader": {"type": "HFDataLoader"}},
            "model": {"model_type": "regression", "architectures": "RegressionLoss"}}


def pynative_config(**sections):
    return TrainConfig.from_dict({**REQUIRED, **sections})


def train_config(log, *, steps, callback=None, **training):
    training = {"steps": steps, "global_batch_size": 16, "local_batch_size": 16, **training}
    return pynative_config(training=training, parallelism={"pipeline_parallel": 1},
                           callbacks=[{"type": "LiveMonitor", "log_file": str(log), **(callback or {})}])


def handler_from(config, extra=()):
    """The callbacks as the Trainer builds them (_create_callback_handler): its built-ins, the
    ``callbacks=`` list, then one per YAML entry through the registry (pynative/trainer/utils.py's
    _build_callback, which needs hyper_parallel to import: the same registry call here)."""
    built = [MindFormerRegister.get_instance_from_cfg(c.to_dict(), MindFormerModuleType.CALLBACK)
             for c in config.callbacks]

    def make(callbacks=None, **kwargs):
        return CallbackHandler(callbacks=[MonitorCallback(), LossCallback(), *extra, *built], **kwargs)

    return make, built


class Loop(LoopTrainer):
    """The loop on mindformers' classes; the model answers LossCallback's questions as a GPT model does."""

    def __init__(self, config, handler, **kwargs):
        super().__init__(config, callbacks=[], handler_cls=handler, state_cls=TrainerState, **kwargs)
        tc = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=2, seq_length=8,
                               vocab_size=32, ffn_hidden_size=32)
        self.network.get_gpt_transformer_config = lambda: tc


class DefendedLoop(SpikeDefence, Loop):
    pass


def records(path):
    return list(read_records(path))


def steps_of(recs):
    return [r for r in recs if r["type"] == "step"]


def test_the_yaml_entry_builds_one_class_for_both_trainers(tmp_path):
    config = train_config(tmp_path / "m.jsonl", steps=1)
    _, (monitor,) = handler_from(config)
    assert isinstance(monitor, gm_mf.MindFormersLiveMonitor) and isinstance(monitor, TrainerCallback)
    assert isinstance(monitor, ms.train.Callback)  # the legacy Trainer's Model.train takes it too


def test_log_beside_loss_callback(tmp_path, monkeypatch):
    lines = LossLines()
    monkeypatch.setattr(loss_callback_module, "logger", lines)
    log = tmp_path / "metrics.jsonl"
    config = train_config(log, steps=6, max_norm=1.0)
    handler, _ = handler_from(config)
    loop = Loop(config, handler, epoch_step=3)
    loop.train()
    recs = records(log)
    steps = steps_of(recs)
    loss_lines = [line for line in lines.lines if line.startswith("{ step:")]
    assert len(loss_lines) == 6
    for record, line, norm, loss in zip(steps, loss_lines, loop.norms, loop.losses):
        assert record["grad_norm"] == pytest.approx(norm, rel=1e-6)
        assert record["loss"] == pytest.approx(loss, rel=1e-6)
        assert f"grad_norm: {norm:10.6f}" in line and f"loss: {loss:10.6f}" in line
    assert [r["lr"] for r in steps] == pytest.approx(loop.lrs, rel=1e-6)
    header = recs[0]
    assert header["trainer"]["max_norm"] == 1.0 and header["trainer"]["global_batch_size"] == 16
    assert header["trainer"]["parallel_layout"] == {"data_parallel": 1, "tensor_parallel": 1,
                                                    "pipeline_parallel": 1, "context_parallel": 1,
                                                    "expert_parallel": 1}
    assert recs[-1]["status"] == "finished"
    # For the lead's note: both logs of the same steps.
    (tmp_path / "side_by_side.txt").write_text(
        "\n".join(loss_lines) + "\n" + "\n".join(json.dumps(r) for r in steps) + "\n")
    print("\n".join(loss_lines))
    print("\n".join(json.dumps({k: r[k] for k in ("step", "loss", "grad_norm", "lr", "clipped") if k in r})
                    for r in steps))


def test_nan_steps_logged_skipped(tmp_path):
    log = tmp_path / "metrics.jsonl"
    config = train_config(log, steps=5, use_skip_step_on_nan=True)
    handler, _ = handler_from(config)
    loop = Loop(config, handler, batches=lambda step: make_batch(step, nan=step in (1, 2)))
    loop.train()
    steps = steps_of(records(log))
    assert [bool(r.get("skipped")) for r in steps] == [False, True, True, False, False]
    assert loop.state.skipped_steps == 2 and steps[1]["skip_reason"] == "nonfinite"
    assert records(log)[0]["trainer"]["use_skip_step_on_nan"] is True


def test_a_loss_spike_raises_one_alarm_and_the_defence_clips_it(tmp_path):
    log = tmp_path / "metrics.jsonl"
    config = train_config(log, steps=13, max_norm=100.0, callback={"alarm_config": {"min_history": 8}})
    handler, _ = handler_from(config)
    loop = DefendedLoop(config, handler, spike_mode="clip", spike_warmup=8,
                        batches=lambda step: make_batch(step, scale=1000.0 if step == 10 else 1.0))
    loop.train()
    recs = records(log)
    steps = steps_of(recs)
    assert [r["step"] for r in steps if r.get("spike")] == [11] and steps[10]["clipped"]
    assert [r["grad_norm"] for r in steps] == pytest.approx(loop.norms, rel=1e-6)
    alarms = [r for r in recs if r["type"] == "event" and r["kind"] == "alarm"]
    assert len(alarms) == 1 and alarms[0]["step"] == 11


def test_abort_after_stops_the_loop(tmp_path):
    log = tmp_path / "metrics.jsonl"
    config = train_config(log, steps=20, use_skip_step_on_nan=True, callback={"abort_after": 2})
    handler, _ = handler_from(config)
    loop = Loop(config, handler, batches=lambda step: make_batch(step, nan=step >= 3))
    loop.train()
    assert loop.state.global_step == 5 and records(log)[-1]["status"] == "aborted"


def test_an_exception_ends_the_log_as_failed(tmp_path):
    log = tmp_path / "metrics.jsonl"
    config = train_config(log, steps=20, use_skip_step_on_nan=True, max_consecutive_skipped_steps=2)
    handler, _ = handler_from(config)
    loop = Loop(config, handler, batches=lambda step: make_batch(step, nan=step >= 3))
    with pytest.raises(RuntimeError, match="SkipStepOnNaN"):
        loop.train()
    del loop
    gc.collect()
    assert records(log)[-1]["status"] == "failed"


@pytest.mark.parametrize(("rank", "writes"), [(0, False), (2, False), (3, True)])
def test_writer_rank_is_the_last_pipeline_stage(tmp_path, monkeypatch, rank, writes):
    # One process stands in for each rank of a 4-rank job with pipeline_parallel: 2.
    monkeypatch.setattr(segment_module, "distributed", lambda: (rank, 4))
    log = tmp_path / "metrics.jsonl"
    config = pynative_config(training={"steps": 2, "global_batch_size": 16},
                             parallelism={"pipeline_parallel": 2},
                             callbacks=[{"type": "LiveMonitor", "log_file": str(log)}])
    handler, _ = handler_from(config)
    Loop(config, handler).train()
    assert log.exists() is writes
    if writes:
        header = records(log)[0]
        assert header["rank"] == 3 and header["trainer"]["parallel_layout"]["pipeline_parallel"] == 2


def test_runner_wrapper_in_a_pynative_config_warns(tmp_path):
    config = pynative_config(training={"steps": 1}, runner_wrapper={"type": "GradmonTrainStep"},
                             callbacks=[{"type": "LiveMonitor", "log_file": str(tmp_path / "m.jsonl")}])
    assert config.runner_wrapper.type == "GradmonTrainStep"  # accepted and kept by TrainConfig, unused
    handler, _ = handler_from(config)
    with pytest.warns(UserWarning, match="runner_wrapper .GradmonTrainStep. is ignored"):
        Loop(config, handler).train()
    assert records(tmp_path / "m.jsonl")[0]["trainer"]["ignored"] == ["runner_wrapper"]


def test_gradmon_trainer_says_why_it_is_missing():
    with pytest.raises(ImportError, match=r"hyper_parallel|PyNative Trainer"):
        gm_mf.GradmonTrainer  # noqa: B018 - the attribute access is the test
