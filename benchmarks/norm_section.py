"""Section ``norm``: which graph form of the global norm / clip / history write is cheapest.

Standalone of gradmon's cell (it uses :mod:`benchmarks.norm_impls`), GRAPH mode only, one child
process per model. Two measurements per model:

- ``micro``: the norm alone (``NormOnly``) over tensors shaped like the model's parameters, in
  ms per call, plus its relative error against a float64 numpy norm;
- ``in_step``: ``ProbeStep`` variants inside a real training step, as bracketed ratios against a
  plain ``TrainOneStepCell`` (same method as the ``step`` section).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from benchmarks.child import run_child
from benchmarks.step_overhead import MODELS


def measure_model(model: str, settings: dict[str, Any], log: Callable[[str], None]) -> dict[str, Any]:
    import mindspore as ms
    import numpy as np
    from mindspore import Tensor, nn

    from benchmarks.interleave import run_interleaved, sync, timing_options
    from benchmarks.norm_impls import FLOORS, NORMS, PROBES, NormOnly, ProbeStep
    from benchmarks.stats import summarize
    from examples import models as M

    ms.set_context(mode=ms.GRAPH_MODE, device_target=settings.get("device", "CPU"))
    ms.set_seed(0)
    spec = MODELS[model]
    net = M.with_loss(getattr(M, spec["factory"])())
    params = net.trainable_params()
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(p.shape).astype(np.float32) * 1e-2 for p in params]
    tensors = tuple(Tensor(a) for a in arrays)
    exact = float(np.sqrt(sum(float(np.sum(a.astype(np.float64) ** 2)) for a in arrays)))
    micro: dict[str, Any] = {}
    cells = {}
    for kind in NORMS:
        try:
            cell = NormOnly(kind)
            value = float(cell(tensors).asnumpy())
            cells[kind] = cell
            # A floor probe reads the tensors without computing a norm: it has no error to report.
            micro[kind] = {"floor": True} if kind in FLOORS else {"rel_error": abs(value - exact) / exact}
        except Exception as exc:
            micro[kind] = {"error": _first_line(exc)}
    calls = settings["micro_calls"]
    samples: dict[str, list[float]] = {k: [] for k in cells}
    for _ in range(settings["rounds"]):
        for kind, cell in cells.items():  # round-robin: drift hits every form alike
            t0 = time.perf_counter()
            out = None
            for _ in range(calls):
                out = cell(tensors)
            out.asnumpy()
            samples[kind].append((time.perf_counter() - t0) / calls * 1e3)
    for kind, values in samples.items():
        micro[kind]["ms_per_call"] = summarize(values)
    log(
        "  micro: "
        + ", ".join(
            f"{k} {v['ms_per_call']['median']:.3f} ms" for k, v in micro.items() if "ms_per_call" in v
        )
    )

    opt = nn.Adam(params, learning_rate=1e-3)
    x, y = M.synthetic_batch(spec["batch"])
    step_cells: dict[str, Any] = {"plain": nn.TrainOneStepCell(net, opt)}
    unavailable: dict[str, str] = {}
    for name in settings["probes"]:
        norm, clip, ring = PROBES[name]
        try:
            cell = ProbeStep(net, opt, norm=norm, clip=clip, ring=ring)
            sync(cell(x, y))
            step_cells[name] = cell
        except Exception as exc:
            unavailable[name] = _first_line(exc)
            log(f"  {name}: not available: {unavailable[name]}")
    in_step = run_interleaved(
        step_cells,
        (x, y),
        baseline="plain",
        **timing_options(settings),
        log=log,
    )
    return {
        "model": model,
        "kernel": kernel_status(),
        "params": M.count_params(net),
        "tensors": len(params),
        "batch": spec["batch"],
        "micro": micro,
        "in_step": in_step,
        "unavailable": unavailable,
        "probes": {k: dict(zip(("norm", "clip", "ring"), PROBES[k])) for k in settings["probes"]},
    }


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"


def kernel_status() -> dict[str, Any]:
    """Whether gradmon's fused kernel runs here, and the settings that change its speed."""
    try:
        from gradmon.cells import fused_norm
    except Exception as exc:
        return {"available": False, "reason": _first_line(exc)}
    reason = fused_norm.fused_norm_unavailable_reason()
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"available": reason is None, "reason": reason,
            "threads_env": os.environ.get("GRADMON_FUSED_NORM_THREADS"), "cpus_usable": cpus}


def plan(smoke: bool) -> list[dict[str, Any]]:
    from benchmarks.norm_impls import PROBES

    all_probes = list(PROBES)
    if smoke:
        s = {
            "rounds": 2,
            "target_block_s": 0.01,
            "min_steps": 2,
            "max_steps": 20,
            "warmup_steps": 1,
            "micro_calls": 5,
            "probes": ["norm_addn", "norm_concat", "norm_fused", "norm_floor_read", "clip_minimum",
                       "ring_scatter"],
        }
        return [{"model": "mlp", "settings": s, "timeout": 300}]
    # Forms the micro table already ranks (stack, norm_each, select, concat_dot, concat_l2loss), forms
    # ruled out (l2loss clips: inaccurate; the stock clip: in `step`; the fused clip variants that did
    # not beat a per-tensor multiply, docs/cells.md) stay out of the slow in-step runs; 6 rounds keep
    # the section at ~4 minutes (the cell's own costs are in `step`).
    ranked_only = ("norm_stack", "norm_norm_each", "clip_select", "norm_concat_dot", "norm_concat_l2loss",
                   "clip_l2loss_minimum", "clip_stock", "norm_floor_touch", "clip_fused_scale",
                   "clip_fused_coef_scale")
    in_step = [p for p in all_probes if p not in ranked_only]
    s = {
        "rounds": 6,
        "target_block_s": 0.3,
        "min_steps": 3,
        "max_steps": 500,
        "warmup_steps": 3,
        "micro_calls": 20,
        "probes": in_step,
    }
    big = {
        **s,
        "min_steps": 2,
        "micro_calls": 3,
        "probes": ["plain_copy", "norm_concat", "norm_fused", "norm_floor_read", "clip_fused_minimum"],
    }
    return [
        {"model": "mlp", "settings": s, "timeout": 300},
        {"model": "tiny_transformer", "settings": s, "timeout": 400},
        {"model": "transformer_20m", "settings": big, "timeout": 500},
    ]


def run_section(device: str, smoke: bool, log: Callable[[str], None], out_dir: str) -> dict[str, Any]:
    from benchmarks.norm_impls import __doc__ as impl_doc

    section: dict[str, Any] = {"about": (impl_doc or "").strip(), "runs": []}
    for item in plan(smoke):
        settings = {**item["settings"], "device": device}
        log(f"norm: GRAPH {item['model']}")
        out_file = os.path.join(out_dir, f"norm-{item['model']}.json")
        args = ["--model", item["model"], "--settings", json.dumps(settings)]
        run = run_child("benchmarks.norm_section", args, out_file, item["timeout"], log)
        run.update({"model": item["model"], "settings": settings})
        section["runs"].append(run)
    return section


def _summary(result: dict[str, Any]) -> str:
    """The in-step ratios of one model as text lines (for the command line)."""
    lines = [f"{result['model']}: {result['params']:,} params in {result['tensors']} tensors, "
             f"clock {result['in_step'].get('clock', 'wall')}, kernel {result['kernel']}"]
    for name, v in result["in_step"]["variants"].items():
        ms_step = v["ms_per_step"]["median"]
        r = v.get("ratio")
        ratio = f"ratio {r['median']:.3f} IQR {r['q1']:.3f}-{r['q3']:.3f}" if r else "(baseline)"
        lines.append(f"  {name:24s} {ms_step:9.3f} ms/step  {ratio}")
    return "\n".join(lines)


def _main() -> int:
    p = argparse.ArgumentParser(
        description="One model of the norm section. The suite runs it as a child with --settings; by hand, "
        "e.g. "
        "`taskset -c 1 python -m benchmarks.norm_section --model tiny_transformer --clock cpu "
        "--probes plain_copy,norm_concat,norm_fused,norm_floor_read`.")
    p.add_argument("--model", choices=sorted(MODELS), required=True)
    p.add_argument("--settings", help="settings as JSON (default: the suite's plan for this model)")
    p.add_argument("--smoke", action="store_true",
                   help="the smoke plan's settings (seconds; checks the harness)")
    p.add_argument("--probes", help="comma-separated ProbeStep variants instead of the plan's")
    p.add_argument("--rounds", type=int, help="interleaved rounds instead of the plan's")
    p.add_argument("--clock", choices=["wall", "cpu"], help="wall time (default) or this process's CPU time")
    p.add_argument("--out", help="write the result here as JSON")
    a = p.parse_args()
    if a.settings:
        settings = json.loads(a.settings)
    else:
        items = plan(a.smoke)
        settings = next((i["settings"] for i in items if i["model"] == a.model), items[0]["settings"])
    if a.probes:
        settings["probes"] = a.probes.split(",")
    if a.rounds:
        settings["rounds"] = a.rounds
    if a.clock:
        settings["clock"] = a.clock
    result = measure_model(a.model, settings, lambda m: print(m, flush=True))
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    else:
        print(_summary(result))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
