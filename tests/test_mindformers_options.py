"""The rules that turn mindformers' runner_wrapper arguments into gradmon's cell options (pure), and
gradmon without mindformers. The real mindformers runs in tests/with_mindformers/ (make test-mindformers)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import numpy as np
import pytest

from gradmon.integrations.mindformers_options import TRAINER_ARGUMENTS, log_file_under, wrapper_options

# What mindformers 1.8's Trainer passes to every wrapper (parallel_config dropped by build_wrapper).
TRAINER = {"calculate_per_token_loss": False, "global_norm_spike_threshold": 1.0, "print_separate_loss": True,
           "use_skip_data_by_global_norm": False, "lr_scheduler": object(), "grouped_lr_scheduler": None}


class FakeTensor:
    """What the rules read of a MindSpore Tensor: ``asnumpy()``."""

    def __init__(self, value):
        self.value = np.asarray(value)

    def asnumpy(self):
        return self.value


def test_gradmon_options_pass_and_the_trainers_arguments_are_dropped():
    arguments = {**TRAINER, "max_norm": 1.0, "spike_mode": "clip"}
    options, scale = wrapper_options("W", arguments, loss_scale=False)
    assert options == {"max_norm": 1.0, "spike_mode": "clip", "output_layout": "mindformers"}
    assert scale is None
    assert set(TRAINER) <= TRAINER_ARGUMENTS


def test_output_layout_can_be_chosen():
    options, _ = wrapper_options("W", {"output_layout": "gradmon"}, loss_scale=False)
    assert options == {"output_layout": "gradmon"}


@pytest.mark.parametrize(("arguments", "max_norm"), [
    ({"use_clip_grad": True}, 1.0),  # mindformers' default max_grad_norm
    ({"use_clip_grad": True, "max_grad_norm": 0.25}, 0.25),
    ({"use_clip_grad": False, "max_grad_norm": 0.25}, None),
])
def test_mindformers_clip_switch_becomes_max_norm(arguments, max_norm):
    options, _ = wrapper_options("W", arguments, loss_scale=False)
    assert options.get("max_norm") == max_norm
    assert "use_clip_grad" not in options and "max_grad_norm" not in options


def test_both_clip_spellings_at_once_are_refused():
    with pytest.raises(ValueError, match="either max_norm or use_clip_grad"):
        wrapper_options("W", {"use_clip_grad": True, "max_norm": 2.0}, loss_scale=False)


@pytest.mark.parametrize("scale", [1, 1.0, np.float32(1.0), FakeTensor(1), FakeTensor([1.0])])
def test_plain_cell_accepts_a_scale_of_one(scale):
    options, kept = wrapper_options("W", {"scale_sense": scale}, loss_scale=False)
    assert kept is None and "scale_sense" not in options


@pytest.mark.parametrize("scale", [1024, FakeTensor(2.0), FakeTensor([1.0, 1.0]), True, "1", object()])
def test_plain_cell_refuses_other_scales_naming_the_loss_scale_wrapper(scale):
    with pytest.raises(ValueError, match="GradmonTrainStepWithLossScale"):
        wrapper_options("GradmonTrainStep", {"scale_sense": scale}, loss_scale=False)


def test_loss_scale_cell_needs_and_returns_its_scale():
    cell = object()
    options, scale = wrapper_options("L", {"scale_sense": cell, "max_norm": 1.0}, loss_scale=True)
    assert scale is cell and options == {"max_norm": 1.0, "output_layout": "mindformers"}
    with pytest.raises(ValueError, match="needs scale_sense"):
        wrapper_options("L", {}, loss_scale=True)


@pytest.mark.parametrize(("name", "hint"), [
    ("calculate_per_token_loss", "MFTrainOneStepCell"),
    ("use_skip_data_by_global_norm", "spike_mode: skip"),
    ("local_norm", "layer_stats"),
])
def test_features_gradmon_lacks_are_refused_with_what_to_use(name, hint):
    with pytest.raises(ValueError, match=hint) as info:
        wrapper_options("GradmonTrainStep", {**TRAINER, name: True}, loss_scale=False)
    assert str(info.value).startswith("GradmonTrainStep")
    options, _ = wrapper_options("W", {**TRAINER, name: False}, loss_scale=False)  # off: nothing to do
    assert name not in options


def test_arguments_are_not_modified():
    arguments = {**TRAINER, "use_clip_grad": True, "scale_sense": 1}
    before = dict(arguments)
    wrapper_options("W", arguments, loss_scale=False)
    assert arguments == before


def test_live_monitor_log_is_under_mindformers_output_dir(tmp_path, monkeypatch):
    root = str(tmp_path / "output")
    assert log_file_under(root) == str(tmp_path / "output" / "gradmon" / "metrics.jsonl")
    assert log_file_under(root, "runs/a.jsonl") == str(tmp_path / "output" / "runs" / "a.jsonl")
    assert log_file_under(root, tmp_path / "abs.jsonl") == str(tmp_path / "abs.jsonl")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert log_file_under(root, "~/m.jsonl") == str(tmp_path / "home" / "m.jsonl")


def test_gradmon_never_imports_mindformers():
    code = ("import sys, gradmon, gradmon.cli, gradmon.integrations.mindformers_options\n"
            "from gradmon import LiveMonitor, MonitoredTrainStep\n"
            "assert 'mindformers' not in sys.modules, 'gradmon imported mindformers'\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.skipif(importlib.util.find_spec("mindformers") is not None, reason="mindformers is installed")
def test_the_integration_says_what_to_install_without_mindformers():
    with pytest.raises(ImportError, match=r"needs mindformers.*docs/mindformers\.md"):
        import gradmon.integrations.mindformers  # noqa: F401
