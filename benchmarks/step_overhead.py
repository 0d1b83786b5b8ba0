"""Section ``step``: what the monitored training step costs against a plain ``TrainOneStepCell``.

Every (mode, model) pair runs in its own child process (``python -m benchmarks.step_overhead``):
MindSpore's execution mode is process-wide, the memory of a 22M-parameter model is returned when
the child exits, and a crash in one pair does not stop the suite. Inside a child all variants wrap
the *same* network and optimizer (same parameter memory, so cache effects are equal) and are timed
with bracketed interleaving (see :mod:`benchmarks.interleave`).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from benchmarks.child import run_child

MAX_NORM = 1.0
FORENSICS_STEPS = 8

# name -> (description, MonitoredTrainStep keyword arguments); max_norm filled in at build time.
GM_VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "gm_norm_h0": (
        "MonitoredTrainStep norm only: history_size=0, skip_nonfinite=False",
        {"history_size": 0, "skip_nonfinite": False},
    ),
    "gm_norm": (
        "MonitoredTrainStep norm + default device history, skip_nonfinite=False",
        {"skip_nonfinite": False},
    ),
    "gm_default": ("MonitoredTrainStep with all defaults (history, skip_nonfinite=True)", {}),
    "gm_clip": ("defaults + fixed clip max_norm", {"max_norm": MAX_NORM}),
    "gm_detect": (
        "defaults + max_norm + spike_mode='detect'",
        {"max_norm": MAX_NORM, "spike_mode": "detect"},
    ),
    "gm_spike_clip": (
        "defaults + max_norm + spike_mode='clip'",
        {"max_norm": MAX_NORM, "spike_mode": "clip"},
    ),
    "gm_spike_skip": (
        "full defence: defaults + max_norm + spike_mode='skip'",
        {"max_norm": MAX_NORM, "spike_mode": "skip"},
    ),
    "gm_forensics": (
        f"defaults + forensics={FORENSICS_STEPS} (per-layer sums of the last {FORENSICS_STEPS} steps kept)",
        {"forensics": FORENSICS_STEPS},
    ),
}
STOCK_VARIANTS: dict[str, str] = {
    "stock_clip": "TrainOneStepCell subclass + ops.clip_by_global_norm(grads, max_norm) (MindSpore API)",
    "stock_norm_clip": "stock_clip + hand-written global norm (square/reduce_sum/addn/sqrt) returned",
}
ALL_VARIANTS = ["stock_clip", "stock_norm_clip", *GM_VARIANTS]
# The 22M model is slow on a CPU: it gets the variants that answer the targets.
REDUCED_VARIANTS = ["stock_clip", "gm_norm_h0", "gm_default", "gm_clip", "gm_spike_skip", "gm_forensics"]

MODELS: dict[str, dict[str, Any]] = {
    "mlp": {"factory": "MLP", "batch": 32, "about": "~60k params, dispatch-bound"},
    "tiny_transformer": {"factory": "TinyTransformer", "batch": 32, "about": "~1.8M params, the demo model"},
    "transformer_20m": {"factory": "transformer_20m", "batch": 32, "about": "~22M params"},
    # A real LLM block structure (RMSNorm, rotary attention, SwiGLU; 21 parameter tensors), for the
    # norm-kernel work: examples/mindformers/tiny_llama.yaml's model. Runs only where mindformers imports.
    "tiny_llama": {"batch": 8, "needs": "mindformers",
                   "about": "~115k params, mindformers' LlamaForCausalLM (2 layers, hidden 64, seq 32)"},
}


def model_unavailable_reason(model: str) -> str | None:
    """``None`` when the model's extra package is installed, else why the model does not run."""
    needs = MODELS[model].get("needs")
    if needs and importlib.util.find_spec(needs) is None:
        return f"{needs} is not installed (make test-mindformers builds .venv-mf/ with it)"
    return None


def network_and_inputs(model: str) -> tuple[Any, tuple[Any, ...]]:
    """``(network with its loss, one batch of inputs)`` for a model of :data:`MODELS`."""
    spec = MODELS[model]
    if model == "tiny_llama":
        # mindformers logs under LOCAL_DEFAULT_PATH (default ./output) from import on: not in the checkout.
        log_root = os.path.join(tempfile.gettempdir(), "gradmon-bench-mindformers")
        os.environ.setdefault("LOCAL_DEFAULT_PATH", log_root)
        from mindspore import Tensor

        from examples.mindformers.tiny_llama import counting_tokens, tiny_llama

        net = tiny_llama()
        net.set_train(True)  # the training forward: inputs and labels sliced from the tokens
        return net, (Tensor(counting_tokens(spec["batch"])),)
    from examples import models as M

    return M.with_loss(getattr(M, spec["factory"])()), M.synthetic_batch(spec["batch"])


def gm_unavailable_reason() -> str | None:
    """``None`` when ``gradmon.cells.MonitoredTrainStep`` imports, else why not."""
    try:
        from gradmon.cells import MonitoredTrainStep  # noqa: F401
    except Exception as exc:  # ImportError, or an error inside the half-built package
        return f"gradmon.cells.MonitoredTrainStep not available: {type(exc).__name__}: {exc}"
    return None


def describe_variants() -> dict[str, str]:
    out = {"plain": "nn.TrainOneStepCell(net_with_loss, opt) (baseline)"}
    out.update(STOCK_VARIANTS)
    out.update({k: v[0] for k, v in GM_VARIANTS.items()})
    return out


def _build_cell(name: str, net: Any, opt: Any) -> Any:
    from mindspore import nn

    if name == "plain":
        return nn.TrainOneStepCell(net, opt)
    if name in STOCK_VARIANTS:
        from benchmarks.stock_cells import StockClipStep, StockNormClipStep

        cls = StockClipStep if name == "stock_clip" else StockNormClipStep
        return cls(net, opt, MAX_NORM)
    if name in GM_VARIANTS:
        from gradmon.cells import MonitoredTrainStep

        return MonitoredTrainStep(net, opt, **GM_VARIANTS[name][1])
    raise ValueError(f"unknown variant {name!r}")


def measure_pair(
    mode: str, model: str, variants: list[str], settings: dict[str, Any], log: Callable[[str], None]
) -> dict[str, Any]:
    """Run in the child: build the model, the cells, and time them interleaved."""
    import mindspore as ms
    from mindspore import nn

    from benchmarks.interleave import run_interleaved, sync, timing_options
    from examples import models as M

    device = settings.get("device", "CPU")
    ms.set_context(mode=ms.GRAPH_MODE if mode == "GRAPH" else ms.PYNATIVE_MODE, device_target=device)
    ms.set_seed(0)
    spec = MODELS[model]
    net, inputs = network_and_inputs(model)
    opt = nn.Adam(net.trainable_params(), learning_rate=1e-3)
    unavailable: dict[str, str] = {}
    reason = gm_unavailable_reason()
    cells: dict[str, Any] = {}
    for name in ["plain", *variants]:
        if name in GM_VARIANTS and reason:
            unavailable[name] = reason
            continue
        try:
            cell = _build_cell(name, net, opt)
            sync(cell(*inputs))  # compile now so a graph error lands here, not mid-run
            cells[name] = cell
        except Exception as exc:
            unavailable[name] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
            log(f"  {name}: not available: {unavailable[name]}")
    result: dict[str, Any] = {
        "mode": mode,
        "model": model,
        "params": M.count_params(net),
        "batch": spec["batch"],
        "optimizer": "nn.Adam(lr=1e-3)",
        "max_norm": MAX_NORM,
        "unavailable": unavailable,
    }
    if "plain" not in cells:
        result["error"] = "baseline failed"
        return result
    result.update(
        run_interleaved(
            cells,
            inputs,
            baseline="plain",
            **timing_options(settings),
            log=log,
        )
    )
    return result


def plan(smoke: bool) -> list[dict[str, Any]]:
    """The (mode, model, variants, settings) pairs of the section."""
    if smoke:
        base = {"rounds": 2, "target_block_s": 0.01, "min_steps": 2, "max_steps": 20, "warmup_steps": 2}
        return [
            {"mode": "GRAPH", "model": "mlp", "variants": ALL_VARIANTS, "settings": base, "timeout": 300},
            {"mode": "GRAPH", "model": "tiny_llama", "variants": ["gm_default", "gm_clip"], "settings": base,
             "timeout": 300},
        ]
    base = {"rounds": 10, "target_block_s": 0.3, "min_steps": 3, "max_steps": 500, "warmup_steps": 5}
    # ~0.7 s per step on 2 cores: 8 rounds of 2-step blocks keep the 22M pair near 3.5 minutes.
    big = {**base, "rounds": 8, "min_steps": 2, "warmup_steps": 2}
    return [
        {"mode": "GRAPH", "model": "mlp", "variants": ALL_VARIANTS, "settings": base, "timeout": 300},
        {
            "mode": "GRAPH",
            "model": "tiny_transformer",
            "variants": ALL_VARIANTS,
            "settings": base,
            "timeout": 400,
        },
        {
            "mode": "GRAPH",
            "model": "transformer_20m",
            "variants": REDUCED_VARIANTS,
            "settings": big,
            "timeout": 500,
        },
        {"mode": "GRAPH", "model": "tiny_llama", "variants": ALL_VARIANTS, "settings": base, "timeout": 500},
        {"mode": "PYNATIVE", "model": "mlp", "variants": ALL_VARIANTS, "settings": base, "timeout": 400},
    ]


PYNATIVE_NOTE = (
    "PYNATIVE runs the MLP only: TinyTransformer takes ~1 s/step in PYNATIVE on a 2-core CPU "
    "(vs ~45 ms in GRAPH), so 10 bracketed rounds of it alone would exceed the "
    "15-minute budget."
)


def run_section(device: str, smoke: bool, log: Callable[[str], None], out_dir: str) -> dict[str, Any]:
    """Run every pair of :func:`plan` in a child process; collect their JSON."""
    reason = gm_unavailable_reason()
    section: dict[str, Any] = {
        "variants": describe_variants(),
        "gradmon_cells": "available" if reason is None else reason,
        "notes": [
            PYNATIVE_NOTE,
            "ratio = t(variant) / mean(t(plain) before, t(plain) after), adjacent blocks.",
        ],
        "runs": [],
    }
    for item in plan(smoke):
        settings = {**item["settings"], "device": device}
        skipped = model_unavailable_reason(item["model"])
        if skipped:
            log(f"step: {item['mode']} {item['model']} skipped: {skipped}")
            section["runs"].append({"mode": item["mode"], "model": item["model"], "skipped": skipped})
            continue
        log(f"step: {item['mode']} {item['model']} ({len(item['variants'])} variants)")
        args = [
            "--mode",
            item["mode"],
            "--model",
            item["model"],
            "--variants",
            ",".join(item["variants"]),
            "--settings",
            json.dumps(settings),
        ]
        out_file = os.path.join(out_dir, f"step-{item['mode']}-{item['model']}.json")
        run = run_child("benchmarks.step_overhead", args, out_file, item["timeout"], log)
        run.update({"mode": item["mode"], "model": item["model"], "settings": settings})
        section["runs"].append(run)
    return section


def _main() -> int:
    p = argparse.ArgumentParser(description="one (mode, model) pair of the step section (child process)")
    p.add_argument("--mode", choices=["GRAPH", "PYNATIVE"], required=True)
    p.add_argument("--model", choices=sorted(MODELS), required=True)
    p.add_argument("--variants", required=True)
    p.add_argument("--settings", required=True, help="JSON object")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    os.environ.setdefault("GLOG_v", "3")
    result = measure_pair(
        a.mode,
        a.model,
        [v for v in a.variants.split(",") if v],
        json.loads(a.settings),
        lambda m: print(m, flush=True),
    )
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
