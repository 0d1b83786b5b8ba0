"""System metrics sampling (gradmon.monitor.sysmetrics)."""

from __future__ import annotations

import threading
import time

import psutil

from gradmon.monitor.sysmetrics import SystemSampler, device_memory, sample_system


def test_sample_system_fields():
    record = sample_system(psutil.Process(), "CPU")
    assert record["rss_bytes"] > 10_000_000  # this interpreter with numpy loaded
    assert 0.0 <= record["cpu_percent"] <= 100.0 and 0.0 < record["host_mem_percent"] <= 100.0
    assert record["process_cpu_percent"] >= 0.0
    assert "device_mem_bytes" not in record and device_memory("CPU") == {} and device_memory(None) == {}


def test_sampler_emits_periodically_and_stops():
    got: list[dict] = []
    two = threading.Event()

    def emit(record):
        got.append(record)
        if len(got) >= 2:
            two.set()

    sampler = SystemSampler(emit, lambda: 42, interval=0.05)
    sampler.start()
    assert two.wait(20), "no two samples within 20 s"
    sampler.stop()
    count = len(got)
    assert all(r["type"] == "system" and r["step"] == 42 and r["ts"] > 0 for r in got)
    deadline = time.monotonic() + 0.3
    while time.monotonic() < deadline:  # stopped: nothing more arrives
        assert len(got) == count
        time.sleep(0.05)


def test_sampler_survives_a_failing_emit(caplog):
    calls = []
    done = threading.Event()

    def emit(record):
        calls.append(record)
        if len(calls) >= 3:
            done.set()
        raise OSError("disk gone")

    sampler = SystemSampler(emit, lambda: None, interval=0.02)
    sampler.start()
    assert done.wait(20)
    sampler.stop()
    assert "step" not in calls[0]
    assert sum("system metrics sample failed" in r.message for r in caplog.records) == 1
