"""Synthetic run logs for the server and page benchmarks (docs/format.md, schema 1).

``step_record(step, ...)`` makes one realistic ``step`` record; ``generate_run_log`` writes a
whole file of ``n`` steps (a header, step records with a spike every 10 000 steps and a
non-finite step every 100 000, their events, an ``end`` record). With ``system_every=k`` a
``system`` record (``system_record``: what ``monitor/sysmetrics.py`` samples) follows every k-th
step, as a real run's log holds them between its steps: the writer samples every 5 s, so a run
whose steps take seconds has one every step or two, and the index must not slow down on them
(stop 45 found such logs indexed up to ~15x slower than plain ones). Big files are written with
pre-formatted line templates (~10x faster than :func:`gradmon.logformat.jsonl.encode_record` per
record) and the templates' output is checked against the strict decoder on the first lines.

``numbers="fixed"`` (the default, and the log of issue #26's tables) writes each float with a few
fixed decimals (``"loss":2.357221``). ``numbers="writer"`` writes them as gradmon's writer does
(``writer_step_record``): the device's float32 values widened to doubles and the host's timings,
each as Python's shortest repr, up to 17 digits (``"loss":2.3572208881378174``): fewer repeats and
longer numbers for a reader to parse.

``diverge_at=k`` (> 0): from step ``k`` on every step record is non-finite, as the writer logs a
diverged run that goes on training (``"loss":"NaN"``, ``"grad_norm":"Infinity"``, flagged
``nonfinite`` and ``skipped``): each such record is marked and judged one by one, and before
stop 56 a batch holding one lost the compiled scanner's columns (~30 s for 150,000 of them where
the previous release took 2.5 s).
"""

from __future__ import annotations

import math
import os
import struct
import time
from typing import Any

from gradmon.logformat.jsonl import decode_line, encode_record

SPIKE_EVERY = 10_000
NONFINITE_EVERY = 100_000
NUMBERS = ("fixed", "writer")  # how a log's floats are written (see the module docstring)
BENCH_NUMBERS = "bench_numbers"  # the header's config key: NUMBERS' name, when not "fixed"
BENCH_SYSTEM_EVERY = "bench_system_every"  # the header's config key: a system record every k steps
BENCH_DIVERGE_AT = "bench_diverge_at"  # the header's config key: every step non-finite from this one


def loss_at(step: int) -> float:
    """A smooth decreasing loss curve with a little deterministic wiggle."""
    return 2.3 * math.exp(-step / 200_000.0) + 0.05 + 0.02 * math.sin(step * 0.37)


def step_record(step: int, ts: float, *, bench_wts: float | None = None) -> dict[str, Any]:
    """One ``step`` record like a ``MonitoredTrainStep`` + ``LiveMonitor`` run writes.

    ``bench_wts``: the writer's wall-clock time, embedded as a user metric so a receiver can
    compute the end-to-end latency."""
    norm = 1.0 + 0.5 * math.cos(step * 0.11)
    rec: dict[str, Any] = {
        "type": "step",
        "step": step,
        "epoch": 1 + step // 1000,
        "ts": ts,
        "loss": loss_at(step),
        "grad_norm": norm,
        "lr": 1e-3,
        "throughput": 5120.0,
        "step_time": 0.0125,
        "data_time": 0.0004,
        "clip_coef": min(1.0, 1.0 / norm),
        "zscore": 0.1,
    }
    if step % NONFINITE_EVERY == 0:
        rec.update(loss=math.nan, grad_norm=math.inf, nonfinite=True, skipped=True)
    elif step % SPIKE_EVERY == 0:
        rec.update(grad_norm=50.0, zscore=9.0, spike=True, clipped=True)
    if bench_wts is not None:
        rec["bench_wts"] = bench_wts
    return rec


def _float32(x: float) -> float:
    """``x`` rounded to a float32 and widened back, as a device's value reaches the writer."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


_WRITER_LR = _float32(1e-3)


def writer_step_record(step: int, ts: float) -> dict[str, Any]:
    """:func:`step_record`'s run as ``LiveMonitor`` writes it (its keys in its order): loss, norm,
    clip coefficient, z-score and lr as float32s widened to doubles; the step time and throughput
    measured on the host (a little jitter), and ``ts`` with a clock's jitter (under 0.1 ms), so
    that it has a full double's digits, as ``time.time()`` gives."""
    norm = 1.0 + 0.5 * math.cos(step * 0.11)
    step_time = 0.0125 * (1.0 + 0.05 * math.sin(step * 1.3))
    rec: dict[str, Any] = {
        "type": "step", "step": step, "epoch": 1 + step // 1000, "ts": ts + 1e-4 * math.sin(step * 0.9) ** 2,
        "loss": _float32(loss_at(step)), "grad_norm": _float32(norm),
        "clip_coef": _float32(min(1.0, 1.0 / norm)), "zscore": _float32(0.1 * math.sin(step * 0.07)),
        "lr": _WRITER_LR, "step_time": step_time,
        "throughput": 64 / step_time,
    }
    if step % NONFINITE_EVERY == 0:
        rec.update(loss=math.nan, grad_norm=math.inf, nonfinite=True, skipped=True)
    elif step % SPIKE_EVERY == 0:
        rec.update(grad_norm=50.0, zscore=9.0, spike=True, clipped=True)
    return rec


def system_record(step: int, ts: float) -> dict[str, Any]:
    """The ``system`` record sampled after ``step``: host CPU and RSS, device memory and use."""
    return {"type": "system", "ts": ts, "step": step, **_system_values(step)}


def _system_values(step: int) -> dict[str, float]:
    return {"cpu_percent": round(50.0 + 10.0 * math.sin(step * 0.013), 1),
            "rss_mb": round(1200.0 + (step % 977) * 0.5, 1),
            "device_mem_mb": 8000.0, "device_util": round(90.0 + 5.0 * math.cos(step * 0.007), 1)}


def header(run_id: str = "bench", config: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "type": "header",
        "schema": 1,
        "run_id": run_id,
        "start_time": time.time(),
        "host": "bench",
        "pid": os.getpid(),
        "versions": {"gradmon": "bench"},
        "mode": "GRAPH",
        "device": "CPU",
        "world_size": 1,
        "rank": 0,
        "config": config or {},
        "max_norm": 1.0,
        "spike_mode": "clip",
        "log_interval": 100,
    }


_TEMPLATE = (
    '{{"type":"step","step":{s},"epoch":{e},"ts":{ts:.3f},"loss":{loss:.6f},"grad_norm":{g:.6f},'
    '"lr":0.001,"throughput":5120.0,"step_time":0.0125,"data_time":0.0004,"clip_coef":{c:.6f},'
    '"zscore":0.1}}\n'
)


_SYSTEM_TEMPLATE = (
    '{{"type":"system","ts":{ts:.3f},"step":{s},"cpu_percent":{cpu_percent:.1f},"rss_mb":{rss_mb:.1f},'
    '"device_mem_mb":{device_mem_mb:.1f},"device_util":{device_util:.1f}}}\n'
)


def _system_line(step: int, ts: float) -> str:
    return _SYSTEM_TEMPLATE.format(s=step, ts=ts, **_system_values(step))


def _fast_line(step: int, ts: float) -> str:
    if step % SPIKE_EVERY == 0 or step % NONFINITE_EVERY == 0:
        return encode_record(step_record(step, ts))
    norm = 1.0 + 0.5 * math.cos(step * 0.11)
    return _TEMPLATE.format(
        s=step, e=1 + step // 1000, ts=ts, loss=loss_at(step), g=norm, c=min(1.0, 1.0 / norm)
    )


_WRITER_TEMPLATE = (
    '{{"type":"step","step":{step},"epoch":{epoch},"ts":{ts!r},"loss":{loss!r},"grad_norm":{grad_norm!r},'
    '"clip_coef":{clip_coef!r},"zscore":{zscore!r},"lr":{lr!r},"step_time":{step_time!r},'
    '"throughput":{throughput!r}}}\n'
)


def _writer_line(step: int, ts: float) -> str:
    if step % SPIKE_EVERY == 0 or step % NONFINITE_EVERY == 0:  # (more keys; NaN as the writer writes it)
        return encode_record(writer_step_record(step, ts))
    return _WRITER_TEMPLATE.format(**writer_step_record(step, ts))


def _diverged(line: str) -> str:
    """A step record's line made non-finite, as the writer writes a diverged run's steps."""
    rec = decode_line(line)
    rec.update(loss=math.nan, grad_norm=math.inf, nonfinite=True, skipped=True)
    return encode_record(rec)


def generate_run_log(path: str, n_steps: int, *, t0: float = 1.7e9, end: bool = True,
                     system_every: int = 0, numbers: str = "fixed", diverge_at: int = 0) -> dict[str, Any]:
    """Write a run log of ``n_steps`` steps to ``path`` (atomically: ``path.tmp`` first); with
    ``end=False`` it has no ``end`` record, like a run still training; with ``system_every=k``
    (> 0) a ``system`` record after every k-th step; ``numbers``: how its floats are written (one
    of ``NUMBERS``); ``diverge_at=k`` (> 0): every step from the k-th on non-finite (the header's
    ``config`` says all three).

    Returns ``{"records", "bytes", "seconds"}``."""
    if system_every < 0 or diverge_at < 0:
        raise ValueError(f"system_every and diverge_at must be >= 0, got {system_every} and {diverge_at}")
    if numbers not in NUMBERS:
        raise ValueError(f"numbers must be one of {NUMBERS}, got {numbers!r}")
    step_line = _fast_line if numbers == "fixed" else _writer_line
    for s in (1, 2, 3, SPIKE_EVERY, NONFINITE_EVERY):  # the fast templates must stay valid records
        a = decode_line(step_line(s, t0 + s * 0.01))
        assert a["step"] == s and a["type"] == "step", a
        if numbers == "writer":
            assert encode_record(a) == step_line(s, t0 + s * 0.01), a  # (what the writer writes)
        sys_rec = decode_line(_system_line(s, t0 + s * 0.01))
        assert sys_rec == system_record(s, round(t0 + s * 0.01, 3)), sys_rec
        bad = decode_line(_diverged(step_line(s, t0 + s * 0.01)))
        assert math.isnan(bad["loss"]) and bad["grad_norm"] == math.inf and bad["nonfinite"] is True, bad
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    started = time.perf_counter()
    records = 0
    with open(tmp, "w", encoding="utf-8", buffering=1 << 20) as f:
        config: dict[str, Any] = {BENCH_SYSTEM_EVERY: system_every} if system_every else {}
        if numbers != "fixed":
            config[BENCH_NUMBERS] = numbers
        if diverge_at:
            config[BENCH_DIVERGE_AT] = diverge_at
        f.write(encode_record(header(config=config)))
        chunk: list[str] = []
        for s in range(1, n_steps + 1):
            ts = t0 + s * 0.01
            line = step_line(s, ts)
            chunk.append(line if not diverge_at or s < diverge_at else _diverged(line))
            if system_every and s % system_every == 0:
                chunk.append(_system_line(s, ts))
            if s % SPIKE_EVERY == 0:
                kind = "nonfinite" if s % NONFINITE_EVERY == 0 else "spike"
                chunk.append(
                    encode_record(
                        {"type": "event", "kind": kind, "step": s, "ts": ts, "message": f"synthetic {kind}"}
                    )
                )
            if len(chunk) >= 10_000:
                f.write("".join(chunk))
                records += len(chunk)
                chunk = []
        f.write("".join(chunk))
        records += len(chunk)
        f.write(
            encode_record(
                {
                    "type": "end",
                    "ts": t0 + n_steps * 0.01,
                    "status": "finished",
                    "steps": n_steps,
                    "dropped_records": 0,
                }
            )
        )
        records += 2
    os.replace(tmp, path)
    return {"records": records, "bytes": os.path.getsize(path), "seconds": time.perf_counter() - started}


def ensure_run_log(path: str, n_steps: int, system_every: int = 0, numbers: str = "fixed",
                   diverge_at: int = 0) -> dict[str, Any]:
    """Reuse ``path`` if it is complete (ends with an ``end`` record of ``n_steps``) and its header
    says it has ``system_every``'s records, ``numbers``' floats and ``diverge_at``, else generate it."""
    if os.path.exists(path):
        try:
            with open(path, "rb") as f:
                first = decode_line(f.readline())
                f.seek(max(0, os.path.getsize(path) - 4096))
                last = f.read().rstrip(b"\n").rsplit(b"\n", 1)[-1]
            rec = decode_line(last)
            if rec.get("type") == "end" and rec.get("steps") == n_steps \
                    and first.get("config", {}).get(BENCH_SYSTEM_EVERY, 0) == system_every \
                    and first.get("config", {}).get(BENCH_NUMBERS, "fixed") == numbers \
                    and first.get("config", {}).get(BENCH_DIVERGE_AT, 0) == diverge_at:
                return {"reused": True, "bytes": os.path.getsize(path)}
        except Exception:  # unreadable or partial: generate again
            pass
    info = generate_run_log(path, n_steps, system_every=system_every, numbers=numbers, diverge_at=diverge_at)
    info["reused"] = False
    return info
