"""mindformers' own monitors beside gradmon's cell (mindformers' output layout), and LiveMonitor on it."""

from __future__ import annotations

import json

import mindspore as ms
import numpy as np
import pytest

pytest.importorskip("mindformers", reason="mindformers is not installed (make test-mindformers)")

from mindformers.core.callback import MFLossMonitor, TrainingStateMonitor
from mindformers.wrapper import build_wrapper
from mindspore import nn
from mindspore.train import Model

import gradmon.integrations.mindformers  # registers GradmonTrainStep in mindformers
from examples.mindformers.tiny_llama import counting_tokens, tiny_llama
from gradmon import LiveMonitor
from gradmon.logformat.reader import read_records
from tests.with_mindformers.conftest import needs_mindformers_layout
from tests.with_mindformers.mf_util import TRAINER_DEFAULTS, mf_loss_monitor_lines

pytestmark = needs_mindformers_layout

STEPS, BATCH, LR = 3, 4, 1e-3


def _train(callbacks, epochs: int = 1, **options):
    """The tiny Llama in GradmonTrainStep built as mindformers' Trainer builds a runner_wrapper."""
    net = tiny_llama()
    optimizer = nn.AdamWeightDecay(net.trainable_params(), learning_rate=LR)
    wrapper = build_wrapper({"type": "GradmonTrainStep", "max_norm": 1.0, **options},
                            default_args={"network": net, "optimizer": optimizer, **TRAINER_DEFAULTS})
    data = ms.dataset.NumpySlicesDataset({"input_ids": counting_tokens(STEPS * BATCH)}, shuffle=False)
    Model(wrapper).train(epochs, data.batch(BATCH), callbacks=callbacks, dataset_sink_mode=False)
    return wrapper


def _state_monitor(threshold: float) -> TrainingStateMonitor:
    return TrainingStateMonitor(origin_epochs=1, dataset_size=STEPS, config={
        "check_for_global_norm": True, "global_norm_spike_threshold": threshold})


@pytest.mark.parametrize("history_size", [1024, 0], ids=["history", "outputs"])
def test_mindformers_monitors_show_gradmons_norm_and_live_monitor_logs_it(graph_mode, tmp_path, capfd,
                                                                             monkeypatch, history_size):
    """With history_size=0 LiveMonitor reads the norm and lr from the (loss, overflow, scale, lr,
    grad_norm) tuple itself, as it reads mindformers' own cells; else from the device history."""
    monkeypatch.setenv("LOCAL_DEFAULT_PATH", str(tmp_path / "mf"))  # TrainingStateMonitor's records
    log = tmp_path / "run" / "metrics.jsonl"
    callbacks = [MFLossMonitor(learning_rate=LR, origin_epochs=1, dataset_size=STEPS),
                 _state_monitor(threshold=100.0), LiveMonitor(log)]
    wrapper = _train(callbacks, history_size=history_size)
    assert isinstance(wrapper, gradmon.integrations.mindformers.GradmonTrainStep)
    assert wrapper.history_size == history_size

    steps = [r for r in read_records(str(log)) if r["type"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    assert all(np.isfinite(r["grad_norm"]) and r["grad_norm"] > 0 for r in steps)
    np.testing.assert_allclose([r["lr"] for r in steps], LR, rtol=1e-6)
    captured = capfd.readouterr()
    printed = mf_loss_monitor_lines(captured.out + captured.err)
    assert sorted(printed) == list(range(1, STEPS + 1)), printed
    for record in steps:
        lr, norm = printed[record["step"]]
        assert norm != "None"
        np.testing.assert_allclose(float(norm), record["grad_norm"], rtol=1e-6)
        np.testing.assert_allclose(float(lr), LR, rtol=1e-6)


def test_training_state_monitor_stops_on_gradmons_norm_over_its_threshold(graph_mode, tmp_path, monkeypatch):
    """The global-norm check reads the norm from the cell's outputs: a threshold under the first
    step's norm stops the run at step 1, and its record holds that norm."""
    monkeypatch.setenv("LOCAL_DEFAULT_PATH", str(tmp_path / "mf"))
    log = tmp_path / "run" / "metrics.jsonl"
    with pytest.raises(RuntimeError, match="TREError"):
        _train([LiveMonitor(log), _state_monitor(threshold=0.5)])
    record = json.loads((tmp_path / "mf" / "abnormal_global_norm.json").read_text())
    steps = [r for r in read_records(str(log)) if r["type"] == "step"]
    assert list(record) == ["1"] and steps[0]["step"] == 1
    np.testing.assert_allclose(record["1"], [steps[0]["grad_norm"]], rtol=1e-6)
