"""Section ``memory``: the global norm's extra peak memory over ``nn.TrainOneStepCell``, per strategy.

Every (model, variant) runs in its own child process (``python -m benchmarks.memory_section``): the
process high-water mark is per process, and MindSpore's memory pool keeps what it once took. A
child builds the model and ``nn.Adam``, compiles the cell and runs warm-up steps, then resets the
kernel's high-water mark (``/proc/self/clear_refs``, Linux) and runs the measured steps: ``VmHWM``
afterwards is the steady-state peak, compile-time memory excluded. ``extra = peak(variant) -
peak(plain)``; the bound is ``max(64 MiB, 5 % of the gradients' bytes)`` (:func:`memory_bound`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable
from typing import Any

from benchmarks.child import run_child

# name -> (description, MonitoredTrainStep keyword arguments, or None for the plain baseline)
VARIANTS: dict[str, tuple[str, dict[str, Any] | None]] = {
    "plain": ("nn.TrainOneStepCell (baseline)", None),
    "flat": ("norm only, norm_strategy='flat' (one concatenated copy)",
             {"history_size": 0, "skip_nonfinite": False, "norm_strategy": "flat"}),
    "bucketed": ("norm only, norm_strategy='bucketed'",
                 {"history_size": 0, "skip_nonfinite": False, "norm_strategy": "bucketed"}),
    "per_tensor": ("norm only, norm_strategy='per_tensor' (the semi-auto form)",
                   {"history_size": 0, "skip_nonfinite": False, "norm_strategy": "per_tensor"}),
    "fused": ("norm only, norm_strategy='fused' (where the fused kernel is built)",
              {"history_size": 0, "skip_nonfinite": False, "norm_strategy": "fused"}),
    "defaults": ("MonitoredTrainStep defaults (norm_strategy='auto', skip, history)", {}),
    "clip": ("defaults + max_norm=1.0 (the clip pass: one multiply per gradient, in a branch)",
             {"max_norm": 1.0}),
}

MODELS: dict[str, dict[str, Any]] = {
    "mlp": {"factory": "MLP", "kwargs": {}, "batch": 32},
    "tiny_transformer": {"factory": "TinyTransformer", "kwargs": {}, "batch": 32},
    "transformer_20m": {"factory": "transformer_20m", "kwargs": {}, "batch": 32},
    # ~151M parameters: TinyTransformer(d_model=1024, heads=16, layers=12, ff=4096).
    "transformer_150m": {"factory": "TinyTransformer", "batch": 8,
                         "kwargs": {"d_model": 1024, "heads": 16, "layers": 12, "ff": 4096}},
}


NOTES = [
    "peak: VmHWM over the measured steps (after warm-up and malloc_trim), each variant in its own "
    "process; extra = peak(variant) - peak(plain); bound = max(64 MiB, 5 % of the gradients' bytes).",
    "compiled: RSS after Cell.compile (trimmed), before the first step; runtime = peak - compiled. On CPU "
    "the process peak also holds what MindSpore's compiler keeps of the graph (host memory, growing with "
    "the number of graph nodes, not with the gradients' size): the runtime column is the part a device "
    "would hold.",
]


def _status_bytes(key: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        match = re.search(rf"^{key}:\s+(\d+)\s+kB", f.read(), re.MULTILINE)
    if match is None:
        raise RuntimeError(f"/proc/self/status has no {key}")
    return int(match.group(1)) * 1024


def trim_heap() -> None:
    """Return freed heap pages to the system (glibc ``malloc_trim``; a no-op elsewhere).

    Compiling a graph allocates and frees a lot of host memory; glibc keeps freed pages mapped, so
    without this the steady-state RSS would count compile garbage (more for a bigger graph) as if
    the step used it.
    """
    import contextlib
    import ctypes

    with contextlib.suppress(OSError, AttributeError):  # not glibc: the peak then includes retained heap
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def reset_peak() -> None:
    """Trim the heap, then reset ``VmHWM`` to the current RSS (``clear_refs`` value 5, Linux)."""
    trim_heap()
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")


def measure(model: str, variant: str, warmup: int, steps: int) -> dict[str, Any]:
    """Run in the child: build, warm up, reset the peak, run ``steps``, report the peak."""
    import mindspore as ms
    import numpy as np
    from mindspore import nn

    from benchmarks.interleave import sync
    from examples import models as M

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    spec = MODELS[model]
    net = M.with_loss(getattr(M, spec["factory"])(**spec["kwargs"]))
    opt = nn.Adam(net.trainable_params(), learning_rate=1e-4)
    options = VARIANTS[variant][1]
    if options is None:
        cell = nn.TrainOneStepCell(net, opt)
        strategy = None
    else:
        from gradmon.cells import MonitoredTrainStep

        cell = MonitoredTrainStep(net, opt, **options)
        strategy = cell.gradmon_config()["norm_strategy"]
    x, y = M.synthetic_batch(spec["batch"])
    cell.compile(x, y)
    trim_heap()
    compiled = _status_bytes("VmRSS")
    for _ in range(warmup):
        sync(cell(x, y))
    reset_peak()
    before = _status_bytes("VmRSS")
    for _ in range(steps):
        out = cell(x, y)
    sync(out)
    peak = _status_bytes("VmHWM")
    grad_bytes = sum(int(np.prod(p.shape)) * int(p.itemsize) for p in net.trainable_params())
    return {"model": model, "variant": variant, "params": M.count_params(net), "grad_bytes": grad_bytes,
            "norm_strategy": strategy, "rss_before_bytes": before, "peak_bytes": peak,
            "compiled_bytes": compiled, "runtime_bytes": peak - compiled,
            "warmup_steps": warmup, "steps": steps}


def plan(smoke: bool) -> list[dict[str, Any]]:
    """(model, variants, steps, timeout) of the section."""
    variants = ["plain", "flat", "bucketed", "per_tensor", "defaults", "clip"]
    if smoke:
        return [{"model": "mlp", "variants": ["plain", "bucketed"], "warmup": 1, "steps": 1, "timeout": 120}]
    return [
        {"model": "transformer_20m", "variants": variants, "warmup": 2, "steps": 3, "timeout": 300},
        {"model": "transformer_150m", "variants": variants, "warmup": 1, "steps": 2, "timeout": 600},
    ]


def memory_bound(grad_bytes: int) -> int:
    from gradmon.cells.norm_plan import memory_bound as bound

    return bound(grad_bytes)


def summarize_model(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Extra peak over the plain run, in MiB, and whether it is under the bound (pure)."""
    plain = runs.get("plain", {})
    out: dict[str, Any] = {}
    if "peak_bytes" not in plain:
        return out
    bound = memory_bound(plain["grad_bytes"])
    out["bound_mib"] = bound / 2**20
    out["plain_peak_mib"] = plain["peak_bytes"] / 2**20
    for name, run in runs.items():
        if name == "plain" or "peak_bytes" not in run:
            continue
        extra = run["peak_bytes"] - plain["peak_bytes"]
        out[name] = {"extra_mib": extra / 2**20, "within_bound": extra <= bound,
                     "runtime_extra_mib": (run["runtime_bytes"] - plain["runtime_bytes"]) / 2**20,
                     "norm_strategy": run.get("norm_strategy")}
    return out


def fused_built() -> bool:
    try:
        from gradmon.cells.norm_strategies import fused_available
    except Exception:
        return False
    return fused_available()


def run_section(device: str, smoke: bool, log: Callable[[str], None], out_dir: str) -> dict[str, Any]:
    """Run every (model, variant) of :func:`plan` in its own process; collect the peaks."""
    if not os.path.exists("/proc/self/clear_refs"):
        return {"skipped": "not on Linux: /proc/self/clear_refs (peak reset) is missing"}
    section: dict[str, Any] = {"variants": {k: v[0] for k, v in VARIANTS.items()}, "runs": [], "notes": NOTES}
    for item in plan(smoke):
        names = item["variants"] + (["fused"] if fused_built() else [])
        per_variant: dict[str, dict[str, Any]] = {}
        for name in names:
            log(f"memory: {item['model']} {name}")
            out_file = os.path.join(out_dir, f"memory-{item['model']}-{name}.json")
            args = ["--model", item["model"], "--variant", name, "--warmup", str(item["warmup"]),
                    "--steps", str(item["steps"]), "--device", device]
            per_variant[name] = run_child("benchmarks.memory_section", args, out_file, item["timeout"], log)
        section["runs"].append({"model": item["model"], "variants": per_variant,
                                "summary": summarize_model(per_variant)})
    return section


def _main() -> int:
    p = argparse.ArgumentParser(description="one (model, variant) of the memory section (child process)")
    p.add_argument("--model", choices=sorted(MODELS), required=True)
    p.add_argument("--variant", choices=sorted(VARIANTS), required=True)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--device", default="CPU")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    os.environ.setdefault("GLOG_v", "3")
    import mindspore as ms

    ms.set_context(device_target=a.device)
    result = measure(a.model, a.variant, a.warmup, a.steps)
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
