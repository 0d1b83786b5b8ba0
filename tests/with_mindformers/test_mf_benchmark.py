"""The step-overhead benchmark's fourth model, the tiny Llama, in a smoke-sized run."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

pytest.importorskip("mindformers", reason="mindformers is not installed (make test-mindformers)")

from benchmarks.step_overhead import model_unavailable_reason, plan

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_tiny_llama_step_overhead_smoke(tmp_path):
    assert model_unavailable_reason("tiny_llama") is None
    item = next(i for i in plan(smoke=True) if i["model"] == "tiny_llama")
    out = tmp_path / "step.json"
    args = ["--mode", item["mode"], "--model", "tiny_llama", "--variants", ",".join(item["variants"]),
            "--settings", json.dumps({**item["settings"], "device": "CPU"}), "--out", str(out)]
    proc = subprocess.run([sys.executable, "-m", "benchmarks.step_overhead", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=item["timeout"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["model"] == "tiny_llama" and result["params"] > 100_000
    assert not result["unavailable"], result["unavailable"]
    variants = result["variants"]
    assert variants["plain"]["ms_per_step"]["median"] > 0
    for name in item["variants"]:
        ratio = variants[name]["ratio"]["median"]
        assert math.isfinite(ratio) and ratio > 0, (name, ratio)
