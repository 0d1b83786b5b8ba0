"""``gradmon serve --alert-webhook``: a real server process tails a real log being appended and
posts alarms to a local HTTP receiver — one that answers, one that hangs, one that returns 500."""

from __future__ import annotations

import contextlib
import math
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from server_helpers import DEADLINE_S, append, get_json, header, wait_for
from test_alerts import Receiver, receiver  # noqa: F401 - the fixture

from gradmon import cli


@contextlib.contextmanager
def serving(logdir: Path, *args: str) -> Iterator[tuple[subprocess.Popen, int, list[str]]]:
    """``gradmon serve LOGDIR --port 0 ARGS``; yields the process, its port and its stdout lines."""
    proc = subprocess.Popen([sys.executable, "-m", "gradmon", "serve", str(logdir), "--port", "0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 30
        port = None
        while port is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("gradmon: open "):
                port = int(line.split("open ", 1)[1].strip().rsplit(":", 1)[1].strip("/"))
        assert port is not None, "".join(lines)
        yield proc, port, lines
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def steps(start: int, n: int, age: float = 0.0) -> list[dict]:
    """Ordinary step records, stamped ``age`` seconds ago."""
    ts = time.time() - age
    return [{"type": "step", "step": i, "epoch": 1, "ts": ts, "loss": 1.0, "grad_norm": 1.0 + 0.1 * (i % 3)}
            for i in range(start, start + n)]


def nan_step(i: int, age: float = 0.0) -> dict:
    return {"type": "step", "step": i, "epoch": 1, "ts": time.time() - age, "loss": math.nan,
            "grad_norm": math.nan}


def test_alarms_of_new_records_reach_the_webhook_and_old_ones_do_not(tmp_path, receiver):  # noqa: F811
    hook = receiver("ok")
    log = tmp_path / "exp1" / "metrics.jsonl"
    append(log, [header("exp1"), *steps(1, 30, age=3600), nan_step(31, age=3600)])  # an old incident
    with serving(tmp_path, "--alert-webhook", hook.url, "--alert-format", "json") as (_proc, port, lines):
        assert any("alerts go to the webhook at 127.0.0.1:" in line for line in lines)
        assert not any("secret" in line for line in lines)  # the URL's key is not printed
        wait_for(lambda: get_json(port, "/api/runs")[1]["runs"])
        append(log, [*steps(32, 60), nan_step(92), nan_step(93)])
        wait_for(lambda: len(hook.bodies) >= 1)
        append(log, [{"type": "event", "kind": "abort", "step": 93, "ts": time.time(),
                      "message": "10 consecutive skipped or non-finite steps"}])
        # a run that starts while the server runs alerts from its first records on
        append(tmp_path / "exp2" / "metrics.jsonl", [header("exp2"), nan_step(1)])
        wait_for(lambda: sum(len(b["alerts"]) for b in hook.bodies) >= 3)
    alerts = [a for b in hook.bodies for a in b["alerts"]]
    assert [(a["run"], a["kind"], a["step"]) for a in alerts] == [
        ("exp1", "alarm", 92), ("exp1", "abort", 93), ("exp2", "alarm", 1)]
    assert alerts[0]["reason"] == "nonfinite" and alerts[0]["link"] == f"http://127.0.0.1:{port}/?run=exp1"


def test_a_hanging_webhook_does_not_stop_the_server(tmp_path, receiver):  # noqa: F811
    hook = receiver("hang")
    log = tmp_path / "exp1" / "metrics.jsonl"
    append(log, [header("exp1"), *steps(1, 30)])
    with serving(tmp_path, "--alert-webhook", hook.url) as (proc, port, _lines):
        wait_for(lambda: get_json(port, "/api/runs")[1]["runs"])
        append(log, [nan_step(31)])
        wait_for(lambda: hook.attempts == 1)  # the post is now held by the receiver
        append(log, steps(32, 5))
        wait_for(lambda: get_json(port, "/api/runs/exp1")[1]["last_step"] == 36)  # it goes on tailing
        assert hook.bodies == [] and hook.attempts == 1  # while the post still hangs
        assert proc.poll() is None


def test_a_failing_webhook_does_not_stop_the_server(tmp_path, receiver):  # noqa: F811
    hook = receiver("fail")
    log = tmp_path / "exp1" / "metrics.jsonl"
    append(log, [header("exp1"), *steps(1, 30)])
    with serving(tmp_path, "--alert-webhook", hook.url, "--alert-format", "feishu") as (proc, port, _lines):
        wait_for(lambda: get_json(port, "/api/runs")[1]["runs"])
        append(log, [nan_step(31)])
        wait_for(lambda: hook.attempts >= 1)
        append(log, steps(32, 5))
        wait_for(lambda: get_json(port, "/api/runs/exp1")[1]["last_step"] == 36, timeout=DEADLINE_S)
        assert proc.poll() is None


def test_cli_refuses_a_bad_webhook(tmp_path, capsys):
    assert cli.main(["serve", str(tmp_path), "--alert-webhook", "ftp://example.com/x"]) == 2
    assert "--alert-webhook" in capsys.readouterr().err
