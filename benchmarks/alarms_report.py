"""Markdown tables of an alarm-benchmark results document (:mod:`benchmarks.alarms`). Pure."""

from __future__ import annotations

import math
import statistics
from typing import Any

from benchmarks.markdown import table
from gradmon.logformat.jsonl import NONFINITE_STRINGS

RULE_NAMES = {
    "banner": "page banner today (5x median ∪ ZClip ∪ non-finite, per step)",
    "page_rule": "page 5x-rolling-median rule (+ non-finite)",
    "zclip": "cell ZClip flags, old defaults (+ non-finite)",
    "detector": "cell detector flags, new defaults (+ non-finite)",
    "alarms": "**new alarm rule** (per incident)",
}


def _f(x: Any, fmt: str = ".1f") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x) and not math.isinf(x)):
        return "—"
    if isinstance(x, float) and math.isinf(x):
        return "non-finite"
    return format(x, fmt) if isinstance(x, (int, float)) else str(x)


def _rule_summary(setting: dict[str, Any], rule: str) -> list[str]:
    clean = setting["clean"].values()
    steps = sum(c["steps"] for c in clean)
    false = sum(len(c["flags"][rule]) for c in clean)
    faults = setting["faults"]
    must = [f for f in faults if f["must"]]
    scores = [f["scores"][rule] for f in faults]
    must_scores = [f["scores"][rule] for f in must]
    delays = [s["delay"] for s in must_scores if s["delay"] is not None]
    per_fault = statistics.mean(s["alarms"] for s in scores) if scores else math.nan
    return [
        setting["setting"], RULE_NAMES[rule], _f(1000.0 * false / steps if steps else math.nan),
        f"{sum(s['detected'] for s in scores)}/{len(scores)}",
        f"{sum(s['detected'] for s in must_scores)}/{len(must_scores)}",
        f"{sum(s['detected'] and s['alarms'] == 1 for s in must_scores)}/{len(must_scores)}",
        _f(per_fault), f"{_f(statistics.median(delays), '.0f')} / {max(delays)}" if delays else "—",
    ]


def _detector_rows(doc: dict[str, Any]) -> list[list[str]]:
    rows = []
    for s in doc["settings"]:
        for seed, c in s["clean"].items():
            rows.append([s["setting"], seed, c["steps"], _f(c["detector_old_per_100"], ".2f"),
                         _f(c["detector_new_per_100"], ".2f"), c["detector_new_flags"]])
    return rows


def _alarm_text(events: list[dict[str, Any]]) -> str:
    alarms = [e for e in events if e["kind"] == "alarm"]
    ends = {e["start"]: e for e in events if e["kind"] == "alarm_end"}
    parts = []
    for a in alarms:
        end = ends.get(a["step"])
        span = f" ({end['flagged']} flagged, to {end['step']})" if end else ""
        parts.append(f"{a['step']}: {a['reason']}{span}")
    return "; ".join(parts) or "none"


def _fault_rows(doc: dict[str, Any]) -> list[list[str]]:
    rows = []
    for s in doc["settings"]:
        for f in s["faults"]:
            new = f["scores"]["alarms"]
            moved = _f(f["magnitude"]) + ("x" if math.isfinite(f["magnitude"]) else "")
            rows.append([s["setting"], f["fault"], f["start"], moved, "yes" if f["must"] else "",
                         new["alarms"], _f(new["delay"], "d"), _alarm_text(f["alarm_events"]),
                         f["scores"]["banner"]["alarms"]])
    return rows


def _example_rows(examples: dict[str, Any]) -> list[list[str]]:
    rows = []
    for name, ex in examples.items():
        flags = ex["flags"]
        faults = ", ".join(str(x) for x in ex["faults"]) or "none"
        found = ", ".join("yes" if d else "no" for d in ex["detected"]["alarms"]) or "—"
        rows.append([name, ex["steps"], faults, len(flags["banner"]), len(flags["page_rule"]),
                     len(flags["zclip"]), _f(ex["detector_new_flags"], "d"), _alarm_text(ex["alarm_events"]),
                     found])
    return rows


def _numbers(value: Any) -> Any:
    """``value`` with the JSON file's "NaN"/"Infinity" strings back as floats (the same tables
    from the document in memory and from its file)."""
    if isinstance(value, dict):
        return {k: _numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_numbers(v) for v in value]
    return NONFINITE_STRINGS.get(value, value) if isinstance(value, str) else value


def _largest(values: Any) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _headroom_rows(doc: dict[str, Any]) -> list[list[str]]:
    rows = []
    for s in doc["settings"]:
        clean = [c["headroom"] for c in s["clean"].values()]
        must = [f["headroom"] for f in s["faults"] if f["must"] and math.isfinite(f["magnitude"])]
        rows.append([s["setting"], _f(_largest(c["norm_over_envelope"] for c in clean), ".2f"),
                     _f(_largest(c["loss_over_height"] for c in clean), ".2f"),
                     ", ".join(f"{_f(m['norm_over_envelope'])} / {_f(m['loss_over_height'])}" for m in must)
                     or "—"])
    return rows


def render_section(doc: dict[str, Any], level: int = 3) -> str:
    """The tables, with headings at ``level`` (a section of ``benchmarks/RESULTS.md``: 3)."""
    doc = _numbers(doc)
    h = "#" * level
    m = doc.get("machine", {})
    plan = doc["plan"]
    out = []
    if doc.get("smoke"):
        out.append("**SMOKE RUN** — tiny sizes, checks the harness; the numbers mean nothing.\n")
    out.append(f"Machine: {m.get('cpu_model')}, {m.get('cpu_count')} cores, load average at start "
               f"{m.get('load_avg_at_start')}; MindSpore {(m.get('versions') or {}).get('mindspore')}; "
               f"{_f(doc.get('wall_s'), '.0f')} s in all.\n")
    faults = ", ".join(f"`{k}` {v}" for k, v in plan["faults"].items())
    out.append(f"Each setting trains {plan['clean_steps']} clean steps from seeds {plan['seeds']}; every "
               f"fault ({faults}) is injected at steps {plan['fault_steps']} of seed {plan['seeds'][0]}'s "
               f"run and followed for {plan['branch_steps']} "
               "steps. *Must* faults move the gradient norm ≥ 10× its median over the 50 steps before, or "
               "make a loss or norm non-finite, within their first two steps; they must raise exactly one "
               "alarm within one step. Alarm rule settings: "
               + ", ".join(f"`{k}={v}`" for k, v in doc["alarm_config"].items()) + ".\n")
    out.append(f"{h} Rules compared, per setting\n")
    headers = ["setting", "rule", "false alarms / 1,000 clean steps", "faults flagged ≤ 1 step",
               "must faults flagged ≤ 1 step", "… with exactly one alarm", "alarms per faulty run (mean)",
               "delay, must faults (median / max)"]
    rows = [_rule_summary(s, rule) for s in doc["settings"] for rule in RULE_NAMES]
    out.append(table(headers, rows))
    cfg = doc["alarm_config"]
    out.append(f"\n{h} Headroom of the alarm rule's spike tests\n")
    out.append(f"The largest norm / envelope among norms above {cfg['norm_ratio']}x the running median "
               f"(alarm above {cfg['norm_over_max']}), and the largest loss rise / envelope height among "
               f"losses above the `loss_ratio` bound (alarm above {cfg['loss_over_max']}): on the clean "
               "runs, and at the first two steps of each finite must fault.\n")
    out.append(table(["setting", "clean: norm / envelope", "clean: loss rise / height",
                      "must faults: norm / envelope, loss rise / height"], _headroom_rows(doc)))
    out.append(f"\n{h} Detector (`spike`) flags on clean runs, per 100 steps after its warm-up\n")
    out.append(table(["setting", "seed", "steps", "ZClip defaults (25, 0.97, 2.5), replayed",
                      "new defaults (the cell's own flags)", "new: flags"], _detector_rows(doc)))
    out.append(f"\n{h} Every faulty run, new alarm rule\n")
    out.append(table(["setting", "fault", "step", "norm moved", "must", "alarms", "delay",
                      "alarms (step: reason, incident)", "banner items today"], _fault_rows(doc)))
    if doc.get("examples"):
        out.append(f"\n{h} The example runs (their own `LiveMonitor` logs)\n")
        headers = ["run", "steps", "faults at", "banner items today", "page rule", "ZClip old",
                   "detector flags (new)", "alarms (step: reason, incident)", "fault alarmed ≤ 1 step"]
        out.append(table(headers, _example_rows(doc["examples"])))
    return "\n".join(out)


def render(doc: dict[str, Any]) -> str:
    """The whole document (``benchmarks/ALARMS.md``)."""
    return "# Alarm benchmark (`python -m benchmarks.alarms`)\n\n" + render_section(doc, level=2)
