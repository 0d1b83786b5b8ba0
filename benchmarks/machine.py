"""Describe the machine and software a benchmark ran on, for the results file."""

from __future__ import annotations

import os
import platform
import sys
import time
from typing import Any


def cpu_model() -> str:
    """The CPU model name from ``/proc/cpuinfo`` (Linux), else :func:`platform.processor`."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _package_version(name: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # not installed, or broken metadata
        return None


def describe(device: str) -> dict[str, Any]:
    """Machine, OS, interpreter and package versions, plus the load average at the start."""
    try:
        load = list(os.getloadavg())
    except OSError:
        load = None
    try:
        import psutil

        mem_total = int(psutil.virtual_memory().total)
    except Exception:
        mem_total = None
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "device": device,
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": affinity,
        "mem_total_bytes": mem_total,
        "load_avg_at_start": load,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "versions": {
            "mindspore": _package_version("mindspore"),
            "numpy": _package_version("numpy"),
            "gradmon": _package_version("gradmon"),
            "websockets": _package_version("websockets"),
            "playwright": _package_version("playwright"),
        },
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
