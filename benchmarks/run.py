"""Run the gradmon benchmark suite: ``python -m benchmarks.run [--device CPU] [--smoke] [--only ...]``.

Writes ``benchmarks/out/results-<timestamp>.json`` and ``.md``; ``--write-results`` also copies the
Markdown to ``benchmarks/RESULTS.md``. Every section whose dependency is missing records a
``skipped`` reason instead of failing the run. See ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from benchmarks import machine, report
from gradmon.logformat.jsonl import to_jsonable

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "out")
SECTIONS = ("step", "norm", "memory", "logging", "server", "page", "alarms")


def _section_runner(name: str) -> Callable[..., dict[str, Any]]:
    # Imported lazily: a section's own imports must not break the others.
    if name == "step":
        from benchmarks.step_overhead import run_section
    elif name == "norm":
        from benchmarks.norm_section import run_section
    elif name == "memory":
        from benchmarks.memory_section import run_section
    elif name == "logging":
        from benchmarks.logging_section import run_section
    elif name == "server":
        from benchmarks.server_section import run_section
    elif name == "alarms":
        from benchmarks.alarms import run_section
    else:
        from benchmarks.page_section import run_section
    return run_section


def run_suite(
    device: str,
    smoke: bool,
    only: list[str],
    out_dir: str,
    log: Callable[[str], None] = print,
    big_history: bool = False,
) -> dict[str, Any]:
    """Run the chosen sections in order; return the whole results document."""
    os.makedirs(out_dir, exist_ok=True)
    results: dict[str, Any] = {
        "schema": 1,
        "smoke": smoke,
        "machine": machine.describe(device),
        "argv": sys.argv[1:],
        "big_history": big_history,
        "sections": {},
    }
    t_suite = time.perf_counter()
    for name in SECTIONS:
        if name not in only:
            continue
        t0 = time.perf_counter()
        try:
            extra = {"big_history": big_history} if name == "server" else {}
            section = _section_runner(name)(device=device, smoke=smoke, log=log, out_dir=out_dir, **extra)
        except Exception as exc:  # a broken section is reported, the suite goes on
            section = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}
            log(f"{name}: FAILED: {exc}")
        section["section_wall_s"] = time.perf_counter() - t0
        results["sections"][name] = section
        log(f"{name}: done in {section['section_wall_s']:.1f} s")
    results["suite_wall_s"] = time.perf_counter() - t_suite
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--device", default="CPU", choices=["CPU", "GPU", "Ascend"], help="MindSpore device_target"
    )
    p.add_argument("--smoke", action="store_true", help="tiny sizes, < ~60 s: checks the harness, not speed")
    p.add_argument(
        "--only",
        action="append",
        choices=SECTIONS,
        metavar="SECTION",
        help=f"run only this section (repeatable): {', '.join(SECTIONS)}",
    )
    p.add_argument(
        "--big-history",
        action="store_true",
        help="also time the 10M-record history (~2 GB log, ~2.5 min more; off: the suite stays < 15 min)",
    )
    p.add_argument("--out-dir", default=DEFAULT_OUT, help="where results-<ts>.json/.md go")
    p.add_argument("--write-results", action="store_true", help="also write benchmarks/RESULTS.md")
    a = p.parse_args(argv)
    only = a.only or list(SECTIONS)

    def log(msg: str) -> None:
        print(msg, flush=True)

    results = run_suite(a.device, a.smoke, only, a.out_dir, log, big_history=a.big_history)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    suffix = "-smoke" if a.smoke else ""
    json_path = os.path.join(a.out_dir, f"results-{stamp}{suffix}.json")
    md_path = os.path.join(a.out_dir, f"results-{stamp}{suffix}.md")
    with open(json_path, "w", encoding="utf-8") as f:
        json.dump(to_jsonable(results), f, indent=1, allow_nan=False)
    markdown = report.render(results)
    with open(md_path, "w", encoding="utf-8") as f:
        f.write(markdown)
    if a.write_results:
        with open(os.path.join(HERE, "RESULTS.md"), "w", encoding="utf-8") as f:
            f.write(markdown)
    log(f"wrote {json_path}\nwrote {md_path}\nsuite took {results['suite_wall_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
