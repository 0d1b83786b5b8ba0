"""Opt-in host and device metrics (``system`` records), sampled on a background thread.

``psutil`` gives the host CPU and the process's resident memory. Device memory comes from
``mindspore.runtime.memory_allocated`` / ``max_memory_allocated`` on GPU and Ascend; it is
skipped on CPU (MindSpore reports nothing useful there) and wherever the call fails.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

__all__ = ["SystemSampler", "device_memory", "sample_system"]

_log = logging.getLogger("gradmon.monitor.sysmetrics")


def device_memory(device_target: str | None) -> dict[str, int]:
    """Bytes of device memory allocated now and at peak, or ``{}`` on CPU / when unavailable."""
    if not device_target or device_target.upper() == "CPU":
        return {}
    try:
        from mindspore import runtime

        return {
            "device_mem_bytes": int(runtime.memory_allocated()),
            "device_mem_peak_bytes": int(runtime.max_memory_allocated()),
        }
    except Exception:  # any backend error: just no device memory in the record
        return {}


def sample_system(process: Any, device_target: str | None = None) -> dict[str, Any]:
    """One ``system`` record's measurements: ``cpu_percent`` (whole host, since the previous
    call), ``process_cpu_percent`` (this process, 100 = one core), ``rss_bytes``,
    ``host_mem_percent``, plus device memory when available. ``process`` is a ``psutil.Process``."""
    import psutil

    record: dict[str, Any] = {
        "cpu_percent": float(psutil.cpu_percent(interval=None)),
        "process_cpu_percent": float(process.cpu_percent(interval=None)),
        "rss_bytes": int(process.memory_info().rss),
        "host_mem_percent": float(psutil.virtual_memory().percent),
    }
    record.update(device_memory(device_target))
    return record


class SystemSampler:
    """Calls ``emit(record)`` with a ``system`` record every ``interval`` seconds until stopped.

    ``current_step`` tells which training step the sample belongs to. The thread is a daemon and
    stops within one interval of :meth:`stop`. A failing sample is logged once and the thread
    keeps going.
    """

    def __init__(
        self,
        emit: Callable[[dict[str, Any]], Any],
        current_step: Callable[[], int | None],
        *,
        interval: float = 5.0,
        device_target: str | None = None,
    ) -> None:
        import psutil

        self._emit = emit
        self._current_step = current_step
        self._interval = max(float(interval), 0.05)
        self._device_target = device_target
        self._process = psutil.Process()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failed = False
        # Prime the CPU counters: psutil's first cpu_percent(None) call returns 0.0.
        psutil.cpu_percent(interval=None)
        self._process.cpu_percent(interval=None)

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="gradmon-system", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self._interval + 1.0)
        self._thread = None

    def sample_now(self) -> None:
        """Take and emit one sample on the calling thread."""
        try:
            record = {"type": "system", "ts": time.time()}
            step = self._current_step()
            if step is not None:
                record["step"] = step
            record.update(sample_system(self._process, self._device_target))
            self._emit(record)
        except Exception as exc:  # never let monitoring kill the run
            if not self._failed:
                self._failed = True
                _log.warning("gradmon: system metrics sample failed: %s", exc)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.sample_now()
