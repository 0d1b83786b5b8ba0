"""GradmonTrainStep / GradmonTrainStepWithLossScale built by mindformers' build_wrapper, as its Trainer
builds a runner_wrapper (the YAML keys plus the Trainer's own arguments)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mindformers", reason="mindformers is not installed (make test-mindformers)")

from gradmon.cells import MonitoredTrainStep, MonitoredTrainStepWithLossScale
from mindformers.tools.register import MindFormerModuleType, MindFormerRegister
from mindformers.wrapper import build_wrapper
from mindspore import nn

import gradmon.integrations.mindformers as integration
from gradmon import LiveMonitor
from tests.with_mindformers.conftest import needs_mindformers_layout
from tests.with_mindformers.mf_util import TRAINER_DEFAULTS, batch, norm64, reference_grads, twins


def _build(section: dict, net=None, **trainer_arguments):
    """``build_wrapper`` as the Trainer calls it; ``trainer_arguments`` are top-level YAML settings
    (e.g. calculate_per_token_loss), which the Trainer passes over the section's keys."""
    from examples.mindformers.tiny_llama import tiny_llama

    net = net if net is not None else tiny_llama()
    optimizer = nn.AdamWeightDecay(net.trainable_params(), learning_rate=1e-3)
    return build_wrapper(dict(section), default_args={"network": net, "optimizer": optimizer,
                                                      **TRAINER_DEFAULTS, **trainer_arguments})


def test_registered_under_their_names():
    get = MindFormerRegister.get_cls
    assert get(MindFormerModuleType.WRAPPER, "GradmonTrainStep") is integration.GradmonTrainStep
    assert get(MindFormerModuleType.WRAPPER, "GradmonTrainStepWithLossScale") is \
        integration.GradmonTrainStepWithLossScale
    callback = get(MindFormerModuleType.CALLBACK, "LiveMonitor")
    assert callback is integration.MindFormersLiveMonitor and issubclass(callback, LiveMonitor)


def _settings(monitor: LiveMonitor):
    # LiveMonitor keeps its options in .settings since the host branch's split, as attributes before.
    return getattr(monitor, "settings", monitor)


def test_live_monitor_writes_under_mindformers_output_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCAL_DEFAULT_PATH", str(tmp_path / "out"))  # what set_output_path(output_dir) sets
    build = MindFormerRegister.get_instance_from_cfg
    monitor = _settings(build({"type": "LiveMonitor"}, MindFormerModuleType.CALLBACK))
    assert monitor.log_file == str(tmp_path / "out" / "gradmon" / "metrics.jsonl")
    monitor = _settings(build({"type": "LiveMonitor", "log_file": "runs/a.jsonl", "log_interval": 5},
                              MindFormerModuleType.CALLBACK))
    assert monitor.log_file == str(tmp_path / "out" / "runs" / "a.jsonl") and monitor.log_interval == 5


@pytest.mark.parametrize(("section", "trainer_arguments", "message"), [
    ({"type": "GradmonTrainStep", "scale_sense": 1024}, {}, "GradmonTrainStepWithLossScale"),
    ({"type": "GradmonTrainStep"}, {"calculate_per_token_loss": True}, "per-token"),
    ({"type": "GradmonTrainStep"}, {"use_skip_data_by_global_norm": True}, "spike_mode: skip"),
    ({"type": "GradmonTrainStep", "local_norm": True}, {}, "layer_stats"),
    ({"type": "GradmonTrainStepWithLossScale"}, {}, "needs scale_sense"),
])
def test_unsupported_mindformers_settings_are_refused_with_what_to_use(section, trainer_arguments, message):
    with pytest.raises(ValueError, match=message):
        _build(section, **trainer_arguments)


@needs_mindformers_layout
def test_mindformers_clip_settings_become_max_norm_and_unknown_options_are_named():
    cell = _build({"type": "GradmonTrainStep", "use_clip_grad": True, "max_grad_norm": 0.5,
                   "scale_sense": 1.0, "spike_mode": "detect"})
    assert isinstance(cell, MonitoredTrainStep)
    assert cell.options.max_norm == 0.5 and cell.options.spike_mode == "detect"
    assert cell.options.output_layout == "mindformers"
    with pytest.raises(TypeError, match=r"max_nrom.*known options"):
        _build({"type": "GradmonTrainStep", "max_nrom": 1.0})


@needs_mindformers_layout
def test_loss_scale_wrapper_from_yaml_section_reports_unscaled_norm(graph_mode):
    """scale_sense as mindformers' YAML writes it (a DynamicLossScaleUpdateCell section): the step
    returns mindformers' tuple, and its norm is the unscaled float64 norm of the gradients."""
    net, ref = twins()
    cell = _build({"type": "GradmonTrainStepWithLossScale", "max_norm": 1.0,
                   "scale_sense": {"type": "DynamicLossScaleUpdateCell", "loss_scale_value": 1024,
                                   "scale_factor": 2, "scale_window": 1000}}, net=net)
    assert isinstance(cell, MonitoredTrainStepWithLossScale)
    assert isinstance(cell.loss_scaling_manager, nn.DynamicLossScaleUpdateCell)
    cell.set_train()
    tokens = batch(0)
    _, grads = reference_grads(ref, tokens)
    loss, overflow, scale, lr, norm = cell(tokens)
    assert not bool(overflow.asnumpy()) and float(scale.asnumpy().reshape(-1)[0]) == 1024.0
    np.testing.assert_allclose(float(lr.asnumpy()), 1e-3, rtol=1e-6)
    np.testing.assert_allclose(float(norm.asnumpy()), norm64(grads), rtol=1e-5)
    assert np.isfinite(float(loss.asnumpy().mean()))


def test_mindformers_own_wrapper_does_not_run_on_cpu(graph_mode):
    """Why gradmon's wrapper is the way to the norm on CPU: MFTrainOneStepCell's overflow check is an
    Ascend kernel (with or without use_clip_grad). If this starts passing, update docs/mindformers.md."""
    from mindformers.wrapper import MFTrainOneStepCell

    from examples.mindformers.tiny_llama import tiny_llama

    net = tiny_llama()
    cell = MFTrainOneStepCell(net, nn.AdamWeightDecay(net.trainable_params()), use_clip_grad=True)
    cell.set_train()
    with pytest.raises(RuntimeError, match=r"Unsupported op \[NPUGetFloatStatusV2\] on CPU"):
        cell(batch(0))
