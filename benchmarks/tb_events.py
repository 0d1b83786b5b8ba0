"""Write gradmon run logs as TensorBoard event files, for timing TensorBoard's page beside ours
(``benchmarks/page_section.py --tensorboard``).

Run by the Python of a separate TensorBoard environment (TensorBoard is never a dependency of
gradmon): ``TB_PYTHON -m benchmarks.tb_events SRC DST``, or as a file path. Every run directory
under SRC holding a ``metrics.jsonl`` becomes DST/<run>/events.out.tfevents.*, written by
TensorBoard's own framework-free writer (``tensorboard.summary.Writer``): one scalar per step and
field the page charts (``loss``, ``grad_norm``, ``lr``, ...) at the record's wall time, eval
records as ``eval/<field>``. Non-finite values (``"NaN"`` in the log) are written as such. Only
the standard library and TensorBoard are imported here.
"""

from __future__ import annotations

import json
import math
import os
import sys

FIELDS = ("loss", "grad_norm", "lr", "throughput", "step_time", "data_time", "clip_coef", "zscore")
_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _number(v: object) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    return _NONFINITE.get(v) if isinstance(v, str) else None


def convert_run(log_path: str, out_dir: str) -> int:
    """One metrics.jsonl to an event file in ``out_dir``; returns the scalars written."""
    from tensorboard.summary import Writer

    os.makedirs(out_dir, exist_ok=True)
    writer = Writer(out_dir)
    written = 0
    with open(log_path, encoding="utf-8") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            kind = rec.get("type")
            step = rec.get("step")
            if kind not in ("step", "eval") or not isinstance(step, int):
                continue
            ts = _number(rec.get("ts"))
            fields = FIELDS if kind == "step" else ("loss",)
            for name in fields:
                value = _number(rec.get(name))
                if value is None:
                    continue
                tag = name if kind == "step" else "eval/" + name
                writer.add_scalar(tag, value, step, wall_time=ts)
                written += 1
    writer.close()
    return written


def convert_tree(src: str, dst: str) -> dict[str, int]:
    """Every run (a directory holding metrics.jsonl) under ``src`` to ``dst``; scalars per run."""
    out = {}
    for here, _dirs, files in sorted(os.walk(src)):
        if "metrics.jsonl" in files:
            run = os.path.relpath(here, src)
            out[run] = convert_run(os.path.join(here, "metrics.jsonl"), os.path.join(dst, run))
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: tb_events.py SRC DST")
    print(json.dumps(convert_tree(sys.argv[1], sys.argv[2])))
