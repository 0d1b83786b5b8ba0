"""Issue 22's targets, before and after, from alarm-benchmark results (one table). Pure reading.

    python -m benchmarks.alarms_targets --before DIR --after DIR [--write]

``DIR`` holds the JSON results of ``python -m benchmarks.alarms`` (whole suites or single
``--settings`` runs: every ``alarms-*.json`` below it, the newest per setting) and of
``python -m benchmarks.alarms_converged`` (``alarms-converged.json``). Prints the Markdown table
(and with ``--write`` also merges ``--after``'s settings into one document and writes
``benchmarks/ALARMS.md`` from it, the targets table first).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from benchmarks.alarms_report import _numbers, render
from benchmarks.report import table

HERE = Path(__file__).resolve().parent
EARLY_FAULT_STEPS = (10, 37)


def load(directory: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]], dict[str, Any] | None]:
    """``(a suite document with every setting found, the settings, the converged run)``."""
    by_setting: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {}
    converged = None
    for path in sorted(Path(directory).rglob("*.json")):
        doc = _numbers(json.loads(path.read_text(encoding="utf-8")))
        if path.name == "alarms-converged.json":
            converged = doc
            continue
        if not path.name.startswith("alarms-") or doc.get("smoke"):
            continue
        for s in doc.get("settings", []):
            old = by_setting.get(s["setting"])
            if old is None or path.name > old[0]:
                by_setting[s["setting"]] = (path.name, doc, s)
    settings = [v[2] for v in by_setting.values()]
    suite = None
    if by_setting:
        docs = sorted({id(v[1]): (v[0], v[1]) for v in by_setting.values()}.values(), key=lambda x: x[0])
        first = docs[0][1]
        suite = {**first, "settings": settings, "wall_s": sum(s.get("seconds", 0.0) for s in settings)}
        suite.pop("examples", None)
        if len(docs) == 1 and docs[0][1].get("examples"):  # one whole suite: its example runs too
            suite["examples"] = docs[0][1]["examples"]
            suite["wall_s"] = docs[0][1].get("wall_s", suite["wall_s"])
    return suite, settings, converged


def _finite_big(f: dict[str, Any]) -> bool:
    m = f["magnitude"]
    return isinstance(m, float) and math.isfinite(m) and m >= 10.0


def summary(settings: list[dict[str, Any]], converged: dict[str, Any] | None) -> dict[str, Any]:
    """The target figures of one side."""
    rates = [c["detector_after_10_per_100"] for s in settings for c in s["clean"].values()
             if "detector_after_10_per_100" in c]
    clean_alarms = [len(c["flags"]["alarms"]) for s in settings for c in s["clean"].values()]
    big = [f for s in settings for f in s["faults"] if _finite_big(f)]
    early = [f for f in big if f["start"] in EARLY_FAULT_STEPS]
    must = [f for s in settings for f in s["faults"] if f["must"]]
    missed = [f"{s['setting']}/{f['fault']}@{f['start']}" for s in settings for f in s["faults"]
              if _finite_big(f) and not f.get("detector_caught")]
    out = {
        "flags_per_100_max": max(rates) if rates else math.nan,
        "flags_per_100_mean": sum(rates) / len(rates) if rates else math.nan,
        "clean_alarms": clean_alarms,
        "big_caught": (sum(bool(f.get("detector_caught")) for f in big), len(big)),
        "early_caught": (sum(bool(f.get("detector_caught")) for f in early), len(early)),
        "must_alarmed": (sum(f["scores"]["alarms"]["detected"] for f in must), len(must)),
        "missed": missed,
    }
    if converged is not None:
        out["converged_alarms"] = len(converged["alarms"])
        out["converged_flags_per_100"] = converged["detector_after_10_per_100"]
    return out


def render_targets(before: dict[str, Any], after: dict[str, Any], middle: dict[str, Any] | None = None,
                   middle_label: str = "main before this change") -> str:
    """The targets table: ``before`` and ``after``, and ``middle`` between them when given."""
    sides = [before, *([middle] if middle is not None else []), after]

    def one(value: Any, fmt: str) -> str:
        missing = value is None or (isinstance(value, float) and math.isnan(value))
        return "—" if missing else format(value, fmt)

    def pair(key: str, fmt: str = ".2f") -> list[str]:
        return [one(side.get(key), fmt) for side in sides]

    def frac(key: str) -> list[str]:
        return [f"{side[key][0]}/{side[key][1]}" for side in sides]

    rows = [
        ["all finite ≥10× faults flagged by the detector within 1 step", "all", *frac("big_caught")],
        ["… of them at steps 10 and 37", "all", *frac("early_caught")],
        ["detector flags per 100 clean steps after step 10, worst clean run (8 runs)", "≤ 0.2",
         *pair("flags_per_100_max")],
        ["… mean of the 8 clean runs", "", *pair("flags_per_100_mean")],
        ["detector flags per 100 steps after step 10, 20k-step converged run", "≤ 0.2",
         *pair("converged_flags_per_100", ".3f")],
        ["alarms on the 8 clean 1,000-step runs", "0 each", *(", ".join(map(str, side["clean_alarms"]))
                                                           for side in sides)],
        ["alarms on the 20k-step converged run", "0", *pair("converged_alarms", "d")],
        ["must faults (≥10× or non-finite) alarmed within 1 step", "", *frac("must_alarmed")],
    ]
    labels = ["before (main)", *([middle_label] if middle is not None else []), "after"]
    text = table(["target (issue 22)", "goal", *labels], rows)
    missed = "; ".join(f"{label}: " + (", ".join(side["missed"]) or "none")
                       for label, side in zip(labels, sides))
    text += "\n\nFinite ≥10× faults the detector missed — " + missed + ".\n"
    return text


def replay_note(before_conv: dict[str, Any] | None, after_conv: dict[str, Any] | None) -> str:
    """Each side's 20k-step run judged by the other side's alarm rule (when its records were kept)."""
    from benchmarks.alarms_converged import replay
    from gradmon.logformat.alarms import AlarmConfig

    old = AlarmConfig(norm_floor=0.0, loss_floor=0.0)  # main's rule: no run scale
    parts = []
    if before_conv and before_conv.get("records"):
        count = len(replay(before_conv["records"]))
        parts.append(f"main's 20k-step run under this code's alarm rule: {count} alarms")
    if after_conv and after_conv.get("records"):
        parts.append(f"this code's 20k-step run under main's alarm rule: "
                     f"{len(replay(after_conv['records'], old))} alarms")
    return ("Replayed: " + "; ".join(parts) + ".\n") if parts else ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.alarms_targets", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True)
    p.add_argument("--after", required=True)
    p.add_argument("--middle", help="a third side between them (e.g. main before this change)")
    p.add_argument("--middle-label", default="main before this change")
    p.add_argument("--note", default="", help="a sentence on what --after is (in the written ALARMS.md)")
    p.add_argument("--write", action="store_true", help="write benchmarks/ALARMS.md from --after")
    a = p.parse_args(argv)
    _, before_settings, before_conv = load(a.before)
    suite, after_settings, after_conv = load(a.after)
    middle = summary(*load(a.middle)[1:]) if a.middle else None
    text = render_targets(summary(before_settings, before_conv), summary(after_settings, after_conv),
                          middle, a.middle_label)
    text += replay_note(before_conv, after_conv)
    print(text)
    if a.write and suite is not None:
        body = render(suite)
        title, rest = body.split("\n", 1)
        note = ("Before: main at the start of issue 22 (detector: ZClip 50 / 0.99 / 5.0 without the early "
                "rule; alarm rule without `norm_floor`/`loss_floor`); after: this code. Every side "
                "trained the same suite (`python -m benchmarks.alarms`, whole or one `--settings` per "
                "process: the same seeds, steps and faults) and the 20k-step run "
                "(`python -m benchmarks.alarms_converged`).")
        note += (" " + a.note if a.note else "") + "\n\n"
        if not suite.get("examples"):
            note += "The example runs (demo, spike demo) were not part of these runs.\n\n"
        head = f"{title}\n\n## Issue 22 targets, before and after\n\n{note}"
        (HERE / "ALARMS.md").write_text(f"{head}{text}\n{rest}", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
