"""What the server's alarm rule costs its ingest: index build time of a big run log with and without
the rule (``python -m benchmarks.index_alarms [--steps N] [--rounds R] [--smoke]``).

The log is ``benchmarks/runlogs.py``'s synthetic run (its header has no ``alarm_rule``, so the server
derives the alarms: a spike every 10,000 steps, a non-finite step every 100,000). Each block indexes
the whole file as ``gradmon serve`` does at start with no page connected — ``Run.poll`` slices of
``POLL_IDLE_MAX_BYTES`` until the end, in this process, no event loop — either as shipped
(``rule``) or with the rule switched off (``plain``). Blocks are interleaved, every ``rule`` block
between two ``plain`` ones, and the figure is the median of the bracketed ratios
(``benchmarks/stats.py``), so a machine whose load drifts still gives a fair ratio. ``--smoke``:
20,000 steps, one round (seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from benchmarks.runlogs import ensure_run_log
from benchmarks.stats import bracket_schedule, bracketed_ratios, summarize
from gradmon.server.app import POLL_IDLE_MAX_BYTES
from gradmon.server.derived import DerivedAlarms
from gradmon.server.runs import Run


class _NoRule(DerivedAlarms):
    """The ingest without the alarm rule (what the server did before it derived alarms)."""

    def __init__(self) -> None:
        super().__init__()
        self.rule = None

    def header(self, record: Any, offset: int) -> list[dict[str, Any]]:
        return []


def index_once(path: str, rule: bool, slice_bytes: int = POLL_IDLE_MAX_BYTES) -> dict[str, Any]:
    """Index ``path`` from scratch as the server does at start (``slice_bytes``: with no page
    connected); seconds and what was derived."""
    run = Run("bench", path)
    if not rule:
        run.index.derived = _NoRule()
    started = time.perf_counter()
    while True:
        _reset, _batch, more = run.poll(slice_bytes)
        if not more:
            break
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "records": run.index.records, "derived": run.index.derived.count}


def measure(path: str, rounds: int) -> dict[str, Any]:
    order = bracket_schedule(["rule"], rounds)
    blocks = [index_once(path, name == "rule") for name in order]
    seconds = [b["seconds"] for b in blocks]
    ratios = bracketed_ratios(order, seconds)["rule"]
    plain = [s for s, name in zip(seconds, order) if name == "plain"]
    with_rule = [s for s, name in zip(seconds, order) if name == "rule"]
    records = blocks[0]["records"]
    return {
        "records": records,
        "derived_events": next(b["derived"] for b, name in zip(blocks, order) if name == "rule"),
        "plain_s": summarize(plain)["median"],
        "rule_s": summarize(with_rule)["median"],
        "ratio": summarize(ratios)["median"],
        "ratios": ratios,
        "plain_us_per_record": 1e6 * summarize(plain)["median"] / records,
        "rule_us_per_record": 1e6 * (summarize(with_rule)["median"] - summarize(plain)["median"]) / records,
        "rounds": rounds,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=1_000_000, help="steps of the synthetic log (default 1M)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="20,000 steps, one round")
    ap.add_argument("--out-dir", default=os.path.join("benchmarks", "out"))
    args = ap.parse_args(argv)
    steps, rounds = (20_000, 1) if args.smoke else (args.steps, args.rounds)
    path = os.path.join(args.out_dir, "bigruns", f"run{steps}", "metrics.jsonl")
    ensure_run_log(path, steps)
    result = {"steps": steps, "file_mb": os.path.getsize(path) / 1e6, **measure(path, rounds)}
    os.makedirs(args.out_dir, exist_ok=True)
    out = os.path.join(args.out_dir, "index_alarms.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    print(f"index build of {result['records']:,} records ({result['file_mb']:.0f} MB): "
          f"{result['plain_s']:.2f} s without the alarm rule, {result['rule_s']:.2f} s with it "
          f"(median ratio {result['ratio']:.3f} over {rounds} bracketed rounds; the rule "
          f"{result['rule_us_per_record']:.2f} us per record, {result['derived_events']} events derived)")
    print(f"-> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
