"""The alarm benchmark: do alarms fire on real faults, and only on them?

    python -m benchmarks.alarms            # the full suite; writes benchmarks/ALARMS.md
    python -m benchmarks.alarms --smoke    # a few seconds: one setting, short runs (checks the harness)

Real MindSpore training on CPU (``benchmarks/alarms_train.py``): four model/optimizer settings,
each trained clean from two seeds and with faults injected at known steps (inputs x10, x100,
x1000, a learning-rate spike, a burst of random labels, a NaN input), plus the runs of
``examples/demo.py`` (``make demo``) and ``examples/spike_demo.py`` through their own
``LiveMonitor`` logs. Every rule of ``benchmarks/alarms_rules.py`` is scored on the same records:
false alarms per 1,000 clean steps, faults detected within one step, alarms per fault, delay,
and the detector's flag rate after its warm-up. Results: ``<out-dir>/alarms-<stamp>.json`` and
the Markdown tables (``benchmarks/ALARMS.md`` for a full run). Also a section of
``python -m benchmarks.run`` (``--only alarms``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import alarms_rules as rules
from benchmarks.alarms_report import render
from benchmarks.alarms_train import FAULTS, SETTINGS, Fault, Setting, SettingRuns, train_setting

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_OUT = HERE / "out"


@dataclass(frozen=True)
class SuitePlan:
    """Sizes of a benchmark run."""

    settings: tuple[Setting, ...]
    faults: tuple[Fault, ...]
    clean_steps: int
    seeds: tuple[int, ...]
    fault_steps: tuple[int, ...]
    branch_steps: int
    demos: bool


# Faults at steps 10 and 37 test the detector's early defence (issue 22): before its EMA warm-up ends.
FULL = SuitePlan(SETTINGS, FAULTS, clean_steps=1000, seeds=(0, 1), fault_steps=(10, 37, 150, 600),
                 branch_steps=120, demos=True)
SMOKE = SuitePlan(SETTINGS[:1], (FAULTS[2], FAULTS[5]), clean_steps=120, seeds=(0,), fault_steps=(80,),
                  branch_steps=20, demos=False)


# -- scoring ----------------------------------------------------------------------------------


def score_clean(records: Sequence[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """Every rule on a clean run, and the detector's flag rates (old defaults replayed, the cell's)."""
    flags = {rule: rules.flagged_steps(rule, records) for rule in rules.RULES}
    cell = rules.cell_spike_steps(records)
    old = rules.zclip_steps(records)
    return {
        "steps": len(records),
        "flags": flags,
        "detector_old_per_100": rules.detector_rate(records, rules.OLD_ZCLIP["warmup"], old),
        "detector_new_per_100": rules.detector_rate(records, warmup, cell),
        "detector_new_flags": len(cell),
        "detector_after_10_per_100": rules.flags_after_per_100(records, rules.EARLY_STEP, cell),
        "alarm_events": rules.alarm_events(records),
        "headroom": rules.headroom(records),
    }


def score_setting(runs: SettingRuns, keep_records: bool = False) -> dict[str, Any]:
    """The results of one setting: clean runs per seed, faulty runs per (fault, step)."""
    clean = {str(seed): score_clean(records, runs.warmup_detector) for seed, records in runs.clean.items()}
    trunk = runs.clean[min(runs.clean)]
    faults = []
    for fr in runs.faults:
        prefix = [r for r in trunk if r["step"] < fr.start]
        magnitude = rules.fault_magnitude(prefix, fr.records)
        scores = {rule: rules.score_fault(rule, prefix, fr.records, fr.start) for rule in rules.RULES}
        events = [e for e in rules.alarm_events([*prefix, *fr.records]) if e["step"] >= fr.start]
        faults.append({
            "fault": fr.fault.name, "what": fr.fault.describe(), "start": fr.start, "magnitude": magnitude,
            "must": magnitude >= rules.MUST_MAGNITUDE,
            "scores": {rule: {"alarms": s.alarms, "delay": s.delay, "detected": s.detected}
                       for rule, s in scores.items()},
            "alarm_events": events,
            "headroom": rules.headroom([*prefix, *fr.records], steps=(fr.start, fr.start + 1)),
            "detector_caught": bool(rules.cell_spike_steps(fr.records[:2])) or not math.isfinite(magnitude),
        })
    out = {"setting": runs.setting.name, "what": runs.setting.describe(), "seconds": runs.seconds,
           "detector_warmup": runs.warmup_detector, "clean": clean, "faults": faults}
    if keep_records:  # the raw step records, for replaying other detector or alarm settings
        out["records"] = {"clean": {str(k): v for k, v in runs.clean.items()},
                          "faults": [{"fault": fr.fault.name, "start": fr.start, "records": fr.records}
                                     for fr in runs.faults]}
    return out


# -- the example runs -------------------------------------------------------------------------


def _run_example(args: list[str], cwd: str, log: Callable[[str], None], timeout: float = 900) -> None:
    env = dict(os.environ, GLOG_v="3", PYTHONUNBUFFERED="1")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:1])} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    log(f"  {Path(args[0]).name}: {time.perf_counter() - t0:.0f} s")


def score_log(path: Path, faults: Sequence[int] = ()) -> dict[str, Any]:
    """Every rule on one run log (records as ``LiveMonitor`` wrote them); ``faults``: injected steps."""
    from gradmon.logformat.reader import read_records

    records = list(read_records(str(path)))
    last = max((r["step"] for r in records if r["type"] == "step"), default=0)
    faults = [f for f in faults if f <= last]  # an aborted run never reached the later faults
    header = next((r for r in records if r["type"] == "header"), {})
    detector = header.get("spike_mode") not in (None, "off")
    steps = [r for r in records if r["type"] == "step"]
    flows = [r for r in records if r["type"] in ("header", "step") or r.get("kind") == "abort"]
    flags = {rule: rules.flagged_steps(rule, flows if rule == "alarms" else steps, detector=detector)
             for rule in rules.RULES}
    cell_cfg = header.get("cell_config") or {}
    warmup = int(cell_cfg.get("spike_warmup", 0) or 0)
    cell = rules.cell_spike_steps(steps)
    out = {
        "steps": len(steps), "spike_mode": header.get("spike_mode"), "flags": flags,
        "alarm_events": rules.alarm_events(flows), "faults": list(faults),
        "detector_new_flags": len(cell) if detector else None,
        "detector_new_per_100": rules.detector_rate(steps, warmup, cell) if detector else None,
        "detector_old_per_100": rules.detector_rate(steps, rules.OLD_ZCLIP["warmup"],
                                                    rules.zclip_steps(steps)) if detector else None,
    }
    out["detected"] = {rule: [any(0 <= s - f <= 1 for s in flags[rule]) for f in faults]
                       for rule in rules.RULES}
    return out


def run_examples(log: Callable[[str], None]) -> dict[str, Any]:
    """``make demo``'s training run and the spike demo's four variants, scored from their logs."""
    from examples.spike_demo import VARIANT_OPTIONS

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="gradmon-alarms-") as tmp:
        _run_example([str(ROOT / "examples" / "demo.py"), "--logdir", tmp, "--run", "demo"], tmp, log)
        out["demo"] = score_log(Path(tmp) / "demo" / "metrics.jsonl")
        spike_at, nan_at = 60, 120  # the spike demo's defaults (documented in examples/spike_demo.py)
        _run_example([str(ROOT / "examples" / "spike_demo.py"), "--logdir", tmp], tmp, log)
        for variant, options in VARIANT_OPTIONS.items():
            faults = (spike_at, nan_at) if options["faults"] else ()
            path = Path(tmp) / "spike-demo" / variant / "metrics.jsonl"
            out[f"spike_demo/{variant}"] = score_log(path, faults)
    return out


# -- the suite --------------------------------------------------------------------------------


def run_suite(plan: SuitePlan, log: Callable[[str], None] = print, keep_records: bool = False
              ) -> dict[str, Any]:
    """Train and score everything in ``plan``; return the results document."""
    import mindspore as ms

    from benchmarks import machine
    from gradmon.logformat.alarms import AlarmConfig

    ms.set_context(mode=ms.GRAPH_MODE)
    t0 = time.perf_counter()
    doc: dict[str, Any] = {
        "schema": 1, "smoke": plan is SMOKE, "machine": machine.describe("CPU"),
        "plan": {"clean_steps": plan.clean_steps, "seeds": list(plan.seeds),
                 "fault_steps": list(plan.fault_steps), "branch_steps": plan.branch_steps,
                 "faults": {f.name: f.describe() for f in plan.faults}},
        "alarm_config": AlarmConfig().as_dict(), "old_zclip": rules.OLD_ZCLIP, "page_rule": rules.PAGE_RULE,
        "settings": [],
    }
    for setting in plan.settings:
        runs = train_setting(setting, clean_steps=plan.clean_steps, seeds=plan.seeds,
                             fault_steps=plan.fault_steps, faults=plan.faults, branch_steps=plan.branch_steps,
                             log=log)
        doc["settings"].append(score_setting(runs, keep_records))
    if plan.demos:
        doc["examples"] = run_examples(log)
    doc["wall_s"] = time.perf_counter() - t0
    return doc


def run_section(device: str, smoke: bool, log: Callable[[str], None], out_dir: str) -> dict[str, Any]:
    """The ``alarms`` section of ``python -m benchmarks.run`` (CPU only: the runs are small)."""
    del device, out_dir  # CPU training by design; the suite writes the results file
    return run_suite(SMOKE if smoke else FULL, log)


def _jsonable(doc: Any) -> Any:
    from gradmon.logformat.jsonl import to_jsonable

    return to_jsonable(doc)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.alarms", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="one setting, short runs, no examples (seconds)")
    p.add_argument("--out-dir", default=str(DEFAULT_OUT), help="where alarms-<stamp>.json/.md go")
    p.add_argument("--no-examples", action="store_true", help="skip the demo and spike-demo runs")
    p.add_argument("--no-write", action="store_true", help="do not write benchmarks/ALARMS.md (full runs)")
    p.add_argument("--settings", help="comma-separated setting names (default: all of the plan's)")
    p.add_argument("--records", action="store_true", help="keep every step record in the JSON file")
    a = p.parse_args(argv)
    plan = SMOKE if a.smoke else FULL
    if a.no_examples:
        plan = SuitePlan(**{**plan.__dict__, "demos": False})
    if a.settings:
        wanted = a.settings.split(",")
        unknown = sorted(set(wanted) - {s.name for s in SETTINGS})
        if unknown:
            p.error(f"unknown setting(s) {unknown}; known: {[s.name for s in SETTINGS]}")
        plan = SuitePlan(**{**plan.__dict__, "settings": tuple(s for s in SETTINGS if s.name in wanted)})
    partial = a.settings is not None or a.no_examples

    def log(msg: str) -> None:
        print(msg, flush=True)

    doc = run_suite(plan, log, keep_records=a.records)
    doc["smoke"] = a.smoke
    os.makedirs(a.out_dir, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S") + ("-smoke" if a.smoke else "")
    json_path = Path(a.out_dir) / f"alarms-{stamp}.json"
    json_path.write_text(json.dumps(_jsonable(doc), indent=1, allow_nan=False), encoding="utf-8")
    markdown = render(doc)
    md_path = Path(a.out_dir) / f"alarms-{stamp}.md"
    md_path.write_text(markdown, encoding="utf-8")
    if not a.smoke and not a.no_write and not partial:
        (HERE / "ALARMS.md").write_text(markdown, encoding="utf-8")
        log(f"wrote {HERE / 'ALARMS.md'}")
    log(f"wrote {json_path}\nwrote {md_path}\n({doc['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("GLOG_v", "3")
    sys.exit(main())
