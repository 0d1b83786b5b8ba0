"""The benchmark harness: pure statistics, and a ``--smoke`` run whose JSON has every section with
numbers (or an explicit "not available" reason). No timing thresholds: speed lives in RESULTS.md."""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys

import pytest

from benchmarks.alarms_report import render as render_alarms
from benchmarks.report import render
from benchmarks.runlogs import generate_run_log
from benchmarks.stats import bracket_schedule, bracketed_ratios, percentile, steps_per_block, summarize
from gradmon.logformat.jsonl import encode_record
from gradmon.logformat.reader import ReadStats, read_records

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_percentile_matches_linear_interpolation():
    assert percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 25) == 2.0
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)


def test_summary_fields():
    s = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s["median"] == 3.0 and s["min"] == 1.0 and s["max"] == 100.0 and s["n"] == 5
    assert s["iqr"] == s["q3"] - s["q1"] == 2.0


def test_schedule_brackets_every_variant_and_rotates():
    order = bracket_schedule(["x", "y", "z"], rounds=3)
    assert order[0] == order[-1] == "plain"
    assert len(order) == 2 * 3 * 3 + 1
    for i, name in enumerate(order):
        if name != "plain":
            assert order[i - 1] == "plain" and order[i + 1] == "plain"
    firsts = [order[1 + 6 * r] for r in range(3)]
    assert len(set(firsts)) > 1, "the variant order must change between rounds"
    with pytest.raises(ValueError):
        bracket_schedule(["plain"], rounds=1)


def test_bracketed_ratio_uses_both_neighbours():
    order = ["plain", "v", "plain", "w", "plain"]
    ratios = bracketed_ratios(order, [1.0, 3.0, 2.0, 2.0, 2.0])
    assert ratios == {"v": [2.0], "w": [1.0]}
    with pytest.raises(ValueError):
        bracketed_ratios(["v", "plain"], [1.0, 1.0])


def test_steps_per_block_is_clamped():
    assert steps_per_block(0.001, 0.3, 3, 500) == 300
    assert steps_per_block(1.0, 0.3, 3, 500) == 3
    assert steps_per_block(1e-6, 0.3, 3, 500) == 500


def test_generated_run_log_is_strictly_valid(tmp_path):
    path = str(tmp_path / "r" / "metrics.jsonl")
    info = generate_run_log(path, 20_000)
    stats = ReadStats()
    records = list(read_records(path, stats=stats))
    assert stats.malformed == 0
    assert info["records"] == len(records)
    steps = [r for r in records if r["type"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, 20_001))
    flagged = [r["step"] for r in steps if r.get("spike")]
    assert flagged == [10_000, 20_000]
    assert records[0]["type"] == "header" and records[-1]["type"] == "end"
    assert not [r for r in records if r["type"] == "system"]


def test_generated_run_log_with_system_records(tmp_path):
    path = str(tmp_path / "r" / "metrics.jsonl")
    info = generate_run_log(path, 5_000, system_every=3)
    stats = ReadStats()
    records = list(read_records(path, stats=stats))
    assert stats.malformed == 0 and info["records"] == len(records)
    assert records[0]["config"] == {"bench_system_every": 3}
    kinds = [r["type"] for r in records]
    system = [r for r in records if r["type"] == "system"]
    assert [r["step"] for r in system] == list(range(3, 5_001, 3))
    # each right after its step, with the sampler's fields as numbers
    for r in system[:50]:
        k = next(i for i, x in enumerate(records) if x.get("step") == r["step"] and x["type"] == "step")
        assert kinds[k + 1] == "system" and records[k + 1] is r
        assert all(isinstance(r[f], float) for f in ("cpu_percent", "rss_mb", "device_mem_mb", "device_util"))
    # a log is reused only with the system records asked for
    from benchmarks.runlogs import ensure_run_log

    assert ensure_run_log(path, 5_000, system_every=3)["reused"]
    assert not ensure_run_log(path, 5_000)["reused"]
    assert not [r for r in read_records(path) if r["type"] == "system"]
    with pytest.raises(ValueError):
        generate_run_log(path, 10, system_every=-1)


def test_generated_run_log_with_the_writer_s_numbers(tmp_path):
    from benchmarks.runlogs import ensure_run_log, writer_step_record

    path = str(tmp_path / "r" / "metrics.jsonl")
    info = generate_run_log(path, 20_000, numbers="writer")
    stats = ReadStats()
    records = list(read_records(path, stats=stats))
    assert stats.malformed == 0 and info["records"] == len(records)
    assert records[0]["config"] == {"bench_numbers": "writer"}
    steps = [r for r in records if r["type"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, 20_001))
    assert [r["step"] for r in steps if r.get("spike")] == [10_000, 20_000]
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    # Each line is what the writer writes for its record, floats at full length (float32 values
    # widened: most have 16 or more digits).
    for line in lines[1:200]:
        assert encode_record(json.loads(line)) == line
    loss_digits = [len(repr(r["loss"]).lstrip("-0.").replace(".", "")) for r in steps[:1000]]
    assert sorted(loss_digits)[500] >= 16
    assert steps[6] == writer_step_record(7, 1.7e9 + 7 * 0.01)  # (generate_run_log's default clock)
    # a log is reused only with the numbers asked for
    assert ensure_run_log(path, 20_000, numbers="writer")["reused"]
    assert not ensure_run_log(path, 20_000)["reused"]
    assert "bench_numbers" not in next(read_records(path))["config"]
    with pytest.raises(ValueError):
        generate_run_log(path, 10, numbers="short")


def test_generated_run_log_of_a_diverged_run(tmp_path):
    from benchmarks.runlogs import ensure_run_log

    path = str(tmp_path / "r" / "metrics.jsonl")
    generate_run_log(path, 3_000, diverge_at=2_001, numbers="writer")
    records = list(read_records(path))
    assert records[0]["config"] == {"bench_numbers": "writer", "bench_diverge_at": 2_001}
    steps = [r for r in records if r["type"] == "step"]
    bad = [r["step"] for r in steps if r.get("nonfinite")]
    assert bad == list(range(2_001, 3_001)) and all(math.isnan(r["loss"]) for r in steps[2_000:])
    assert all(math.isfinite(r["loss"]) for r in steps[:2_000])
    with open(path, encoding="utf-8") as f:  # (as the writer writes them: strict JSON, "NaN" strings)
        line = f.readlines()[2_500]
    assert '"loss":"NaN"' in line and encode_record(json.loads(line)) == line
    assert ensure_run_log(path, 3_000, numbers="writer", diverge_at=2_001)["reused"]
    assert not ensure_run_log(path, 3_000, numbers="writer")["reused"]
    with pytest.raises(ValueError):
        generate_run_log(path, 10, diverge_at=-1)


def _numbers_in(d):
    if isinstance(d, bool):
        return
    if isinstance(d, (int, float)):
        yield d
    elif isinstance(d, dict):
        for v in d.values():
            yield from _numbers_in(v)
    elif isinstance(d, list):
        for v in d:
            yield from _numbers_in(v)


def _finite_positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


@pytest.mark.slow
def test_smoke_run_writes_every_section(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.run", "--smoke", "--out-dir", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jsons = list(out.glob("results-*-smoke.json"))
    mds = list(out.glob("results-*-smoke.md"))
    assert len(jsons) == 1 and len(mds) == 1
    doc = json.loads(jsons[0].read_text())
    assert doc["smoke"] is True
    assert doc["machine"]["cpu_count"] >= 1 and doc["machine"]["versions"]["mindspore"]
    sections = doc["sections"]
    assert set(sections) == {"step", "norm", "memory", "logging", "server", "page", "alarms"}
    for name, sec in sections.items():
        assert "error" not in sec, f"{name}: {sec.get('error')}\n{sec.get('traceback', '')}"
        if "skipped" in sec:  # a dependency is missing: the reason must say so
            assert "not" in sec["skipped"] or "missing" in sec["skipped"], sec["skipped"]

    # step: the baseline and the stock clip always run; ratios are positive numbers.
    run = sections["step"]["runs"][0]
    assert "error" not in run, run
    variants = run["variants"]
    assert _finite_positive(variants["plain"]["ms_per_step"]["median"])
    assert _finite_positive(variants["stock_clip"]["ratio"]["median"])
    assert len(variants["stock_clip"]["ratios"]) == run["rounds"]
    gm = [v for v in variants if v.startswith("gm_")]
    if sections["step"]["gradmon_cells"] == "available":
        assert gm, "gradmon.cells imports, so its variants must have run"
    else:
        assert all(n in run["unavailable"] for n in ("gm_norm_h0", "gm_clip"))
    # the fourth model, the tiny Llama: measured where mindformers imports, else skipped saying why
    llama = next(r for r in sections["step"]["runs"] if r["model"] == "tiny_llama")
    assert "error" not in llama, llama
    if "skipped" in llama:
        assert "mindformers is not installed" in llama["skipped"]
    else:
        assert _finite_positive(llama["variants"]["gm_clip"]["ratio"]["median"])

    # norm: every norm form agrees with float64 numpy and has a time; the floor probes have a time.
    # Only the fused kernel's forms may be missing, and only where the kernel is not available.
    norm_run = sections["norm"]["runs"][0]
    assert "error" not in norm_run, norm_run
    kernel_available = norm_run["kernel"]["available"]
    for kind, m in norm_run["micro"].items():
        if "error" in m:
            assert kind.startswith(("fused", "floor")) and not kernel_available, (kind, m)
            continue
        assert m.get("floor") or m["rel_error"] < 1e-4, kind
        assert _finite_positive(m["ms_per_call"]["median"]), kind
    assert _finite_positive(norm_run["in_step"]["variants"]["norm_addn"]["ratio"]["median"])
    if kernel_available:
        for probe in ("norm_fused", "norm_floor_read"):
            assert _finite_positive(norm_run["in_step"]["variants"][probe]["ratio"]["median"]), probe

    # memory: a peak per variant, each in its own process, and the extra over the plain step.
    if "skipped" not in sections["memory"]:
        mem = sections["memory"]["runs"][0]
        assert all(_finite_positive(v.get("peak_bytes")) for v in mem["variants"].values()), mem
        assert mem["variants"]["bucketed"]["norm_strategy"] == "bucketed"
        assert "extra_mib" in mem["summary"]["bucketed"] and mem["summary"]["bound_mib"] >= 64

    # logging: writer throughput, and no device read on a non-log step while log steps do read.
    logging = sections["logging"]
    assert _finite_positive(logging["writer"]["run_log_writer"]["records_per_s"])
    assert logging["callback"], logging.get("unavailable")
    for case in logging["callback"]:
        assert case["reads_nonlog_steps"] == 0, case
        assert case["reads_log_steps"] >= 1, case
        assert _finite_positive(case["nonlog_us"]["median"])

    if "skipped" not in sections["server"]:
        lat = sections["server"]["latency"]
        assert lat and all(_finite_positive(c.get("p50_ms")) for c in lat), lat
        assert all(c["received"] == c["expected"] for c in lat), lat
        hist = sections["server"]["history"][0]
        assert _finite_positive(hist.get("fetch_ms")), hist
        stress = sections["server"]["stress"]
        for block in (stress["zoom"]["quiet"], stress["zoom"]["zooming"]):
            assert _finite_positive(block["p99_ms_median"]), stress["zoom"]
        indexing = stress["zoom"]["indexing"]  # (its figures over the records written while indexing)
        assert _finite_positive(indexing.get("block_p99_ms")), stress["zoom"]
        assert indexing["while_indexing"] + indexing["after_index"] == indexing["received"], indexing
        assert (indexing["while_indexing"] > 0) == _finite_positive(indexing.get("p99_ms")), indexing
        # (when the run was seen indexed within the block: then before the block's end, else None)
        indexed_s = indexing["indexed_s"]
        assert indexed_s is None or 0 < indexed_s <= stress["zoom"]["index_s"], indexing
        assert stress["zoom"]["zoom_ms"]["n"] >= 1
        assert all(_finite_positive(stress["abuse"][f"rss_mb_{k}"]) for k in ("before", "peak", "after"))
        assert _finite_positive(stress["idle"]["healthy"].get("p99_ms")), stress["idle"]
    if "skipped" not in sections["page"]:
        assert _finite_positive(sections["page"].get("chart_ready_ms"))
        assert _finite_positive(sections["page"].get("fps_streaming"))
        for key in ("one_run_ready_ms", "four_runs_ready_ms", "one_run_heap_mb", "four_runs_heap_mb"):
            assert _finite_positive(sections["page"].get(key)), key

    # alarms: real training with injected faults; the NaN batch must alarm at once, nothing else may.
    [setting] = sections["alarms"]["settings"]
    _check_alarm_setting(setting)

    md = mds[0].read_text()
    assert "SMOKE RUN" in md and "## Step overhead" in md and "stock_clip" in md
    assert "### Rules compared, per setting" in md
    assert "## Peak memory of the norm" in md
    assert render(doc) == md


def test_report_renders_a_skipped_step_model():
    doc = {"machine": {"device": "CPU"}, "sections": {"step": {"gradmon_cells": "available", "runs": [
        {"mode": "GRAPH", "model": "tiny_llama", "skipped": "mindformers is not installed (make ...)"}]}}}
    md = render(doc)
    assert "GRAPH · tiny_llama" in md and "Not run: mindformers is not installed" in md


def test_report_renders_skipped_and_failed_sections():
    doc = {"machine": {"device": "CPU"}, "sections": {
        "server": {"skipped": "gradmon.server.cli not available", "section_wall_s": 0.0},
        "page": {"error": "boom", "section_wall_s": 0.0}}}
    md = render(doc)
    assert "Not run: gradmon.server.cli not available" in md
    assert "Failed: boom" in md


def _check_alarm_setting(setting: dict) -> None:
    clean = setting["clean"]["0"]
    assert clean["steps"] > 0 and clean["flags"]["alarms"] == []
    by_fault = {f["fault"]: f for f in setting["faults"]}
    nan = by_fault["nan_batch"]
    assert nan["must"] and nan["scores"]["alarms"] == {"alarms": 1, "delay": 0, "detected": True}
    assert [e["reason"] for e in nan["alarm_events"] if e["kind"] == "alarm"] == ["nonfinite"]


@pytest.mark.slow
def test_alarm_benchmark_smoke_writes_its_tables(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "benchmarks.alarms", "--smoke", "--out-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [json_path] = tmp_path.glob("alarms-*-smoke.json")
    [md_path] = tmp_path.glob("alarms-*-smoke.md")
    doc = json.loads(json_path.read_text())
    assert doc["smoke"] is True and len(doc["settings"]) == 1
    _check_alarm_setting(doc["settings"][0])
    md = md_path.read_text()
    assert md.startswith("# Alarm benchmark") and "**new alarm rule**" in md and "SMOKE RUN" in md
    assert render_alarms(doc) == md  # the same tables from the JSON file ("Infinity" as text there)
    # issue 22's figures from the same document: the clean run's flag rate after step 10, the NaN fault
    clean = doc["settings"][0]["clean"]["0"]
    assert clean["detector_after_10_per_100"] >= 0.0
    nan = next(f for f in doc["settings"][0]["faults"] if f["fault"] == "nan_batch")
    assert nan["detector_caught"] is True  # a non-finite fault counts as handled (skip_nonfinite)


def test_index_alarms_smoke_measures_the_rule_against_the_plain_ingest(tmp_path):
    command = [sys.executable, "-m", "benchmarks.index_alarms", "--smoke", "--out-dir", str(tmp_path)]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((tmp_path / "index_alarms.json").read_text())
    assert result["records"] == 20_004 and result["derived_events"] == 4  # 2 spikes: alarm + alarm_end each
    assert result["plain_s"] > 0 and result["rule_s"] > 0 and math.isfinite(result["ratio"])


def test_scan_floor_reads_the_numbers_a_python_reading_does(tmp_path):
    from benchmarks import scan_floor
    from benchmarks.runlogs import step_record
    from gradmon.server.native import NativeBuildError

    try:
        program = scan_floor.build(str(tmp_path))
    except NativeBuildError as exc:
        pytest.skip(str(exc))
    records = [{"type": "header", "schema": 1, "run_id": "t"}]
    records += [step_record(i, 1.7e9 + 0.01 * i) for i in range(1, 400)]
    records += [{"type": "step", "step": 400, "loss": 0.12345678901234567, "grad_norm": 3.5e-7, "lr": -2.5e20,
                 "note": "x", "spike": True, "clip_coef": None}]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    want: dict[str, list] = {}
    for rec in records:  # (in file order, summed as the probe sums: float64, one value at a time)
        for key, value in rec.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                got = want.setdefault(key, [0, 0.0, 0])
                got[0] += 1
                got[1] += value
                got[2] ^= struct.unpack("<Q", struct.pack("<d", float(value)))[0]  # (each value's bits)
    for slice_bytes in (65_536, 97):  # (97: lines cut across slices)
        got = scan_floor.scan(program, str(path), slice_bytes)
        assert got["lines"] == len(records)
        assert got["columns"] == {k: [n, total, f"{bits:016x}"] for k, (n, total, bits) in want.items()}


def test_scan_floor_smoke_measures_the_floor_beside_the_cold_index(tmp_path):
    command = [sys.executable, "-m", "benchmarks.scan_floor", "--smoke", "--out-dir", str(tmp_path)]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    if "no C compiler" in proc.stderr:
        pytest.skip("no C compiler here")
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((tmp_path / "scan_floor.json").read_text())
    assert result["floor_s"] > 0 and result["index_s"] > 0 and 0 < result["floor_share"] < math.inf


def test_alarm_targets_table_counts_what_issue_22_asks():
    from benchmarks.alarms_targets import render_targets, summary

    def fault(start, magnitude, caught, alarmed):
        return {"fault": "x10", "start": start, "magnitude": magnitude, "must": magnitude >= 10,
                "detector_caught": caught, "scores": {"alarms": {"detected": alarmed}}}

    setting = {"setting": "s", "clean": {"0": {"detector_after_10_per_100": 0.3, "flags": {"alarms": [5]}},
                                         "1": {"detector_after_10_per_100": 0.1, "flags": {"alarms": []}}},
               "faults": [fault(10, 22.0, True, False), fault(37, 12.0, False, True),
                          fault(600, 3.0, False, False), fault(600, float("inf"), True, True)]}
    got = summary([setting], {"alarms": [{}, {}], "detector_after_10_per_100": 0.4})
    assert got["big_caught"] == (1, 2) and got["early_caught"] == (1, 2) and got["missed"] == ["s/x10@37"]
    assert got["flags_per_100_max"] == 0.3 and got["clean_alarms"] == [1, 0] and got["converged_alarms"] == 2
    assert got["must_alarmed"] == (2, 3)
    text = render_targets(got, got)
    assert "| alarms on the 20k-step converged run | 0 | 2 | 2 |" in text


def test_bigruns_smoke_measures_a_cold_and_a_warm_start(tmp_path):
    from benchmarks.bigruns import run

    out = run(5_000, None, rounds=1, fetches=2, out_dir=str(tmp_path), log=lambda m: None)
    cold, warm = out["starts"]
    assert cold["cold"] and not warm["cold"]
    for s in (cold, warm):
        assert s["cursor_is_the_file"] and s["zoom_points"] == 50 and s["zoom_exact"] is True
        assert math.isfinite(s["zoom_p99_ms"]) and s["rss_mb"] > 0 and s["sidecar_mb"] > 0
        assert 0 < s["index_cpu_s"] < s["index_s"] + 5  # (the server's own CPU, not the wall clock)
    # an existing log (not generated again), a second tree beside this one, warm starts only
    from benchmarks.bigruns import HERE

    again = run(5_000, None, rounds=1, fetches=1, out_dir=str(tmp_path), log=lambda m: None,
                log_dir=str(tmp_path / "bigruns26" / "r5000"), other=HERE, warm_only=True)
    assert [(s["label"], s["cold"]) for s in again["starts"]] == [("other", False), ("this", False)]
    assert not again["generated"] and all(s["cursor_is_the_file"] for s in again["starts"])
    assert all(s["system_points"] == 0 for s in again["starts"])


def test_bigruns_serves_a_log_with_system_records(tmp_path):
    from benchmarks.bigruns import run

    out = run(3_000, None, rounds=1, fetches=1, out_dir=str(tmp_path), log=lambda m: None, system_every=2)
    assert out["system_every"] == 2
    assert os.path.isfile(tmp_path / "bigruns26" / "r3000-sys2" / "r3000" / "metrics.jsonl")
    for s in out["starts"]:
        # every system field's 1,500 points, downsampled to about 2000 (min/max kept): all here
        assert s["cursor_is_the_file"] and s["system_points"] == 4 * 1_500


def test_bigruns_serves_a_diverged_run_s_log(tmp_path):
    from benchmarks.bigruns import run

    out = run(3_000, None, rounds=1, fetches=1, out_dir=str(tmp_path), log=lambda m: None, numbers="writer",
              diverge_at=2_001)
    assert out["diverge_at"] == 2_001
    assert os.path.isfile(tmp_path / "bigruns26" / "r3000-writer-div2001" / "r3000" / "metrics.jsonl")
    assert [s["cold"] for s in out["starts"]] == [True, False]
    assert all(s["cursor_is_the_file"] for s in out["starts"])  # (indexed to its end, cold and warm)


def test_tensorboard_beside_the_page_is_skipped_saying_why(tmp_path):
    from benchmarks.page_section import tensorboard_unavailable_reason
    from benchmarks.tb_events import _number

    assert "no --tensorboard" in tensorboard_unavailable_reason(None)
    assert "not an executable" in tensorboard_unavailable_reason(str(tmp_path / "tensorboard"))
    lone = tmp_path / "bin" / "tensorboard"
    lone.parent.mkdir()
    lone.write_text("#!/bin/sh\n")
    lone.chmod(0o755)
    assert "no python beside" in tensorboard_unavailable_reason(str(lone))
    # the event-file writer's reading of a log's values: numbers, the codec's non-finite strings
    assert _number(2) == 2.0 and math.isnan(_number("NaN")) and _number("-Infinity") == -math.inf
    assert _number(True) is None and _number("x") is None and _number(None) is None


@pytest.mark.slow
@pytest.mark.browser
def test_page_compare_times_the_first_viewport_and_where_the_time_went(tmp_path):
    from benchmarks.page_section import compare_builds, page_unavailable_reason

    reason = page_unavailable_reason()
    if reason:
        pytest.skip(reason)
    out = compare_builds({"this": ROOT}, 1, str(tmp_path), n=300, log=lambda m: None,
                         tensorboard=str(tmp_path / "no-tensorboard"))
    assert "not an executable" in out["tensorboard_skipped"]
    for case in ("one", "four"):
        k = f"this_{case}_"
        assert 0 < out[k + "viewport_ms"] <= out[k + "ready_ms"] <= out[k + "interactive_ms"]
        # timed in the frame callback that found it drawn: not before that frame began
        assert 0 < out[k + "viewport_frame_ms"] <= out[k + "viewport_ms"]
        assert out[k + "viewport_ms_each"] == [round(out[k + "viewport_ms"], 1)]  # one round
        assert out[k + "runs_answered_ms"] <= out[k + "history_answered_ms"]
        assert out[k + "script_requests"] == 3 and out[k + "script_kb"] > 0  # early.js, echarts, main.js
        assert out[k + "history_bytes"] > 0
