"""``gradmon serve`` stops on SIGTERM wherever the signal lands: a real ``gradmon serve`` process
whose SIGTERM is made to arrive while a finalizer (``__del__``) runs, where an exception raised by a
signal handler is printed and dropped ("Exception ignored in ...") and the server would serve on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from server_helpers import make_run

REPO = Path(__file__).resolve().parents[1]

# Runs `gradmon serve` in this process; once it listens, a finalizer sends this process SIGTERM and
# keeps running Python code, so the signal's Python-level handler runs inside the finalizer.
_SERVE_WITH_A_TRAP = r"""
import asyncio, os, signal, sys
import gradmon.server.app as app
from gradmon.cli import main

class Trap:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        total = 0
        for i in range(2_000_000):  # pending signals are handled between bytecodes: here
            total += i
        print("gradmon-test: the signal arrived in a finalizer", flush=True)

start = app.GradmonServer.start
async def start_then_trap(self):
    await start(self)
    asyncio.get_running_loop().call_later(0.2, lambda: Trap().__init__())  # dropped at once
app.GradmonServer.start = start_then_trap
sys.exit(main(["serve", sys.argv[1], "--port", "0", "--no-index-sidecar"]))
"""


def test_sigterm_that_lands_in_a_finalizer_still_stops_the_server(tmp_path):
    make_run(tmp_path, "exp1", 5)
    proc = subprocess.run([sys.executable, "-c", _SERVE_WITH_A_TRAP, str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert "gradmon-test: the signal arrived in a finalizer" in proc.stdout, proc.stdout + proc.stderr
    assert "Exception ignored" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "gradmon: open http://127.0.0.1:" in proc.stdout
