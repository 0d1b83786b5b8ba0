"""The YAML path: mindformers' Trainer builds gradmon's wrapper and LiveMonitor from tiny_llama.yaml.

Each run is a fresh process, as a user's launch is (mindformers keeps global state between Trainers):
``examples/mindformers/train.py`` (the Python route: one import registers gradmon), and a launcher
that never imports gradmon, as ``run_mindformer.py --register_path`` does (the ``auto_register`` route).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("mindformers", reason="mindformers is not installed (make test-mindformers)")

from examples.mindformers.tiny_llama import CONFIG, HERE, write_dataset
from gradmon.logformat.reader import read_records
from tests.with_mindformers.conftest import needs_mindformers_layout
from tests.with_mindformers.mf_util import mf_loss_monitor_lines

pytestmark = needs_mindformers_layout

ROOT = os.path.dirname(os.path.dirname(HERE))
TIMEOUT_S = 420

# What run_mindformer.py does with --register_path and a config (train mode), without gradmon's import.
PLAIN_LAUNCHER = """
import os, sys
config_path, register_path, output_dir, dataset_dir, mode = sys.argv[1:6]
os.environ["REGISTER_PATH"] = register_path
sys.path.append(register_path)
from mindformers import MindFormerConfig, Trainer, build_context
from mindformers.utils.file_utils import set_output_path
config = MindFormerConfig(config_path)
config.output_dir, config.context.mode = output_dir, int(mode)
config.train_dataset.data_loader.dataset_dir = dataset_dir
set_output_path(config.output_dir)
build_context(config)
Trainer(config).train()
assert "gradmon.integrations.mindformers" in sys.modules  # imported by auto_register, not by this file
"""


def _run(args: list[str], cwd) -> str:
    env = {**os.environ, "PYTHONPATH": ROOT, "GLOG_v": "3"}
    proc = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    return output


def _check_run(output: str, log: str, steps: int) -> list[dict]:
    """gradmon's log has every step with its norm (clipped to 1.0 when over it) and the learning rate
    of the YAML's schedule (no warm-up step in so short a run: cosine decay from 1e-3); MFLossMonitor
    printed the same norm and rate (not None)."""
    records = list(read_records(log))
    header = records[0]
    assert header["type"] == "header"
    assert header["cell_config"]["output_layout"] == "mindformers"
    assert header["cell_config"]["max_norm"] == 1.0 and header["cell_config"]["spike_mode"] == "clip"
    rows = [r for r in records if r["type"] == "step"]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    lrs = [r["lr"] for r in rows]
    assert lrs[0] == pytest.approx(1e-3) and all(b < a for a, b in zip(lrs, lrs[1:])), lrs
    for row in rows:
        assert np.isfinite(row["grad_norm"]) and row["grad_norm"] > 0
        assert row.get("clipped", False) == (row["grad_norm"] > 1.0)
    printed = mf_loss_monitor_lines(output)
    assert sorted(printed) == list(range(1, steps + 1)), output[-3000:]
    for row in rows:
        lr, norm = printed[row["step"]]
        np.testing.assert_allclose(float(norm), row["grad_norm"], rtol=1e-6)
        np.testing.assert_allclose(float(lr), row["lr"], rtol=1e-6, atol=1e-12)
    return rows


def test_yaml_config_trains_with_gradmon_from_python(tmp_path):
    data = tmp_path / "data"
    write_dataset(str(data), samples=32)  # batch 4: 8 steps
    work = tmp_path / "work"  # the working directory is not output_dir's parent: the log follows output_dir
    work.mkdir()
    output = _run([os.path.join(HERE, "train.py"), CONFIG, "--output-dir", str(tmp_path / "mf_output"),
                   "--dataset-dir", str(data)], cwd=work)
    _check_run(output, str(tmp_path / "mf_output" / "gradmon" / "metrics.jsonl"), steps=8)
    assert not (work / "output" / "gradmon").exists()


def test_yaml_config_with_auto_register_needs_no_gradmon_import(tmp_path):
    """mindformers' own route for outside classes, in PYNATIVE mode: ``auto_register`` in the YAML and
    ``REGISTER_PATH`` at examples/mindformers (where gradmon_register.py imports the integration)."""
    data = tmp_path / "data"
    write_dataset(str(data), samples=12)  # 3 steps
    with open(CONFIG, encoding="utf-8") as f:
        text = f.read()
    marker = "  type: GradmonTrainStep\n"
    assert marker in text
    config = tmp_path / "auto_register.yaml"
    config.write_text(text.replace(marker, "  auto_register: gradmon_register.GradmonTrainStep\n" + marker))
    launcher = tmp_path / "launch.py"
    launcher.write_text(PLAIN_LAUNCHER)
    output = _run([str(launcher), str(config), HERE, str(tmp_path / "output"), str(data), "1"], cwd=tmp_path)
    rows = _check_run(output, str(tmp_path / "output" / "gradmon" / "metrics.jsonl"), steps=3)
    assert len(rows) == 3
