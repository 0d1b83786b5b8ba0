"""Can a per-step rule separate the suite's faults from its clean steps? Pure reading of recorded runs.

    python -m benchmarks.alarms --no-examples --records --out-dir DIR   # the runs, with every record
    python -m benchmarks.alarms_separability DIR                        # this table

For every clean run (after the detector's EMA warm-up) the largest value of three step statistics,
and the same statistics at the first two steps of every finite *must* fault (a fault that moved
the norm >= 10x) that starts after the warm-up:

- ``z``: the detector's EMA z-score, replayed with :class:`gradmon.cells.SpikeConfig`'s defaults
  on the recorded norms (``gradmon.cells.zclip_reference``);
- ``norm/median``: the norm over the median of the 50 finite norms before it;
- ``loss/median``: the loss over the median of the 16 finite losses before it.

A second table is the detector's own loss test (:class:`gradmon.cells.SpikeConfig`'s ``loss_*``):
``(loss - median) / |median|`` against the median of the ring it keeps (the last ``loss_window``
finite losses of finite steps), on every step it judges (from the ``loss_min``-th such loss on,
the early steps included), for every clean run and the first two steps of every finite must fault,
wherever it starts.

A statistic separates the faults from clean training when every fault's value is above every
clean maximum: then a threshold between them flags the faults and no clean step. A fault whose
norm statistics sit below the clean maxima cannot be caught by any threshold on them without
flagging clean steps too.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

NORM_BASE = 50  # norms in the norm/median statistic's base (as the suite's fault magnitude)
LOSS_BASE = 16  # losses in the loss/median statistic's base (the size of the detector's ring)
STATS = ("z", "norm_ratio", "loss_ratio")


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _ratio(value: Any, base: Sequence[Any]) -> float:
    base = [b for b in base if _finite(b)]
    if not _finite(value) or not base:
        return math.nan
    median = statistics.median(base)
    return value / median if median > 0 else math.nan


def step_statistics(records: Sequence[dict[str, Any]]) -> list[dict[str, float]]:
    """``z``, ``norm_ratio`` and ``loss_ratio`` of every record (NaN where undefined)."""
    from gradmon.cells import SpikeConfig
    from gradmon.cells.zclip_reference import zclip_run

    config = SpikeConfig()
    norms = [float(r["grad_norm"]) if _finite(r.get("grad_norm")) else math.nan for r in records]
    verdicts, _ = zclip_run(norms, warmup=config.warmup, alpha=config.alpha, z_threshold=config.z_threshold,
                            early=config.reference_rule())
    out = []
    for i, (r, v) in enumerate(zip(records, verdicts)):
        norm_base = [q.get("grad_norm") for q in records[max(0, i - NORM_BASE):i]]
        loss_base = [q.get("loss") for q in records[max(0, i - LOSS_BASE):i]]
        out.append({
            "z": v.zscore if i >= config.warmup else math.nan,  # the EMA's z (not the early rule's score)
            "norm_ratio": _ratio(r.get("grad_norm"), norm_base),
            "loss_ratio": _ratio(r.get("loss"), loss_base),
        })
    return out


def clean_maxima(records: Sequence[dict[str, Any]], after: int) -> dict[str, float]:
    """The largest value of each statistic over the records from index ``after`` on."""
    rows = step_statistics(records)[after:]
    return {k: max((row[k] for row in rows if _finite(row[k])), default=math.nan) for k in STATS}


def fault_values(prefix: Sequence[dict[str, Any]], faulty: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Each statistic's larger value over the first two steps of a faulty continuation."""
    rows = step_statistics([*prefix, *faulty])[len(prefix):len(prefix) + 2]
    return {k: max((row[k] for row in rows if _finite(row[k])), default=math.nan) for k in STATS}


def _recorded(docs: Sequence[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any], list[dict[str, Any]]]]:
    """Per setting with records: its name, its clean runs by seed, and each finite must fault as
    ``{"fault": label, "start", "caught", "prefix": the clean trunk before it, "records"}``."""
    for doc in docs:
        for s in doc.get("settings", []):
            recs = s.get("records")
            if not recs:
                continue
            trunk = recs["clean"][min(recs["clean"])]
            faults = [{"fault": f"{s['setting']}/{fr['fault']}@{fr['start']}", "start": fr["start"],
                       "caught": score["detector_caught"],
                       "prefix": [r for r in trunk if r["step"] < fr["start"]], "records": fr["records"]}
                      for fr, score in zip(recs["faults"], s["faults"])
                      if score["must"] and _finite(score["magnitude"])]
            yield s["setting"], recs["clean"], faults


def analyse(docs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Clean maxima per run and fault values per fault, for every setting with records."""
    from gradmon.cells import SpikeConfig

    warmup = SpikeConfig().warmup
    clean: dict[str, dict[str, float]] = {}
    faults: list[dict[str, Any]] = []
    for setting, runs, must in _recorded(docs):
        for seed, records in runs.items():
            clean[f"{setting}/{seed}"] = clean_maxima(records, warmup)
        faults += [{"fault": f["fault"], "caught": f["caught"], **fault_values(f["prefix"], f["records"])}
                   for f in must if f["start"] > warmup]
    worst = {k: max((c[k] for c in clean.values() if _finite(c[k])), default=math.nan) for k in STATS}
    return {"clean": clean, "worst_clean": worst, "faults": faults}


def loss_test_ratios(records: Sequence[dict[str, Any]]) -> list[float]:
    """``(loss - median) / |median|`` of every record against the detector's loss ring (NaN where the
    test does not judge: too few losses, a non-finite loss or norm, a zero median)."""
    from gradmon.cells import SpikeConfig

    config = SpikeConfig()
    ring: list[float] = []
    out = []
    for r in records:
        loss, norm = r.get("loss"), r.get("grad_norm")
        if not (_finite(loss) and _finite(norm)):
            out.append(math.nan)
            continue
        median = statistics.median(ring) if len(ring) >= config.loss_min else math.nan
        out.append((loss - median) / abs(median) if _finite(median) and median != 0 else math.nan)
        ring = [*ring, loss][-config.loss_window:]
    return out


def analyse_loss_test(docs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The loss test's largest ratio per clean run (every judged step) and per finite must fault
    (its first two steps), with whether the recorded run's detector flagged the fault."""
    clean: dict[str, float] = {}
    faults: list[dict[str, Any]] = []
    for setting, runs, must in _recorded(docs):
        for seed, records in runs.items():
            clean[f"{setting}/{seed}"] = max((x for x in loss_test_ratios(records) if _finite(x)),
                                             default=math.nan)
        for f in must:
            n = len(f["prefix"])
            values = loss_test_ratios([*f["prefix"], *f["records"]])[n:n + 2]
            faults.append({"fault": f["fault"], "caught": f["caught"],
                           "ratio": max((x for x in values if _finite(x)), default=math.nan)})
    return {"clean": clean, "faults": faults,
            "worst_clean": max((x for x in clean.values() if _finite(x)), default=math.nan)}


def render_loss_test(result: dict[str, Any]) -> str:
    from gradmon.cells import SpikeConfig

    ratio = SpikeConfig().loss_ratio
    lines = ["| run / fault | flagged in the recorded run | "
             f"(loss - median) / median (flags above {ratio:g}) |", "|---|---|---|"]
    lines += [f"| clean {name} (largest, every judged step) |  | {x:.2f} |"
              for name, x in result["clean"].items()]
    lines.append(f"| **largest of all clean runs** |  | **{result['worst_clean']:.2f}** |")
    for x in result["faults"]:
        value = f"{x['ratio']:.2f}" if _finite(x["ratio"]) else "—"
        lines.append(f"| fault {x['fault']} | {'yes' if x['caught'] else 'no'} | {value} |")
    return "\n".join(lines) + "\n"


def render(result: dict[str, Any]) -> str:
    def f(x: float) -> str:
        return f"{x:.2f}" if _finite(x) else "—"

    lines = ["| run / fault | flagged in the recorded run | z | norm / median of 50 | loss / median of 16 |",
             "|---|---|---|---|---|"]
    for name, c in result["clean"].items():
        lines.append(f"| clean {name} (largest after the warm-up) |  | {f(c['z'])} | {f(c['norm_ratio'])} | "
                     f"{f(c['loss_ratio'])} |")
    w = result["worst_clean"]
    lines.append(f"| **largest of all clean runs** |  | **{f(w['z'])}** | **{f(w['norm_ratio'])}** | "
                 f"**{f(w['loss_ratio'])}** |")
    for x in result["faults"]:
        marks = {k: ("" if not _finite(x[k]) or x[k] > w[k] else " (below)") for k in STATS}
        cells = " | ".join(f"{f(x[k])}{marks[k]}" for k in STATS)
        lines.append(f"| fault {x['fault']} | {'yes' if x['caught'] else 'no'} | {cells} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.alarms_separability", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="+", help="directories with alarms-*.json files written with --records")
    a = p.parse_args(argv)
    paths = [path for d in a.dirs for path in sorted(Path(d).rglob("alarms-*.json"))
             if path.name != "alarms-converged.json"]
    docs = [json.loads(path.read_text(encoding="utf-8")) for path in paths]
    print(render(analyse(docs)), end="")
    print("\nThe detector's loss test:\n")
    print(render_loss_test(analyse_loss_test(docs)), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
