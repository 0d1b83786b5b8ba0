"""A run resumed from a checkpoint in a new process keeps the whole run: its steps continue from
the restored training state, as a real ``gradmon serve`` shows them (history and live stream);
rolling back to an earlier checkpoint replaces the steps it trains again, and only those. Epochs follow what
MindSpore actually runs (dataset sink mode on CPU)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import pytest
from mindspore.train import Model
from resume_train import LR_TABLE, train
from server_helpers import StreamFollower, get_json, recv_json, wait_for
from train_util import dataset, history_cell, records, segments, use_graph_mode
from websockets.asyncio.client import connect

from gradmon.monitor.callback import LiveMonitor
from gradmon.server import start_server
from tests.msrun_util import ROOT, worker_env

SCRIPT = ROOT / "tests" / "resume_train.py"
DEADLINE_S = 240.0


@pytest.fixture(autouse=True)
def _graph_mode():
    use_graph_mode()


def resume_in_a_new_process(log_file, epochs: int, checkpoint, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, str(SCRIPT), str(log_file), str(epochs), "--load", str(checkpoint), *extra]
    return subprocess.Popen(cmd, env=worker_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def finish(proc: subprocess.Popen) -> None:
    try:
        out, _ = proc.communicate(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    assert proc.returncode == 0, out[-3000:]


def history(port: int) -> dict:
    status, body = get_json(port, "/api/runs/exp/history")
    assert status == 200
    return body


def follow_until_end(port: int, cursor: dict, proc: subprocess.Popen) -> list[dict]:
    """A WebSocket client following the run from ``cursor`` while ``proc`` trains; returns every
    record it applied, once the segment's ``end`` record has arrived."""
    async def main() -> list[dict]:
        async with connect(f"ws://127.0.0.1:{port}/ws") as ws:
            await recv_json(ws)  # hello
            await ws.send(json.dumps({"type": "subscribe", "runs": {"exp": cursor}}))
            follower = StreamFollower({"exp": cursor})
            deadline = time.monotonic() + DEADLINE_S
            while not any(r["type"] == "end" for r in follower.records["exp"]):
                assert time.monotonic() < deadline, "the resumed segment's end did not arrive"
                assert proc.poll() in (None, 0), "the resumed run failed"
                try:
                    follower.feed(await recv_json(ws, timeout=5.0))
                except asyncio.TimeoutError:
                    continue
            return follower.records["exp"]

    return asyncio.run(main())


def test_resume_in_a_new_process_then_roll_back(tmp_path):
    log_file = tmp_path / "logs" / "exp" / "metrics.jsonl"
    ckpt = tmp_path / "ckpt"
    train(str(log_file), 2, save_dir=str(ckpt))  # steps 1-20, checkpoints at 10 and 20
    at_10, at_20 = ckpt / "run-1_10.ckpt", ckpt / "run-2_10.ckpt"
    assert at_10.exists() and at_20.exists()

    handle = start_server(tmp_path / "logs", port=0, discover_interval=0.1)
    try:
        wait_for(lambda: get_json(handle.port, "/api/runs/exp")[1].get("last_step") == 20, timeout=30)
        before = history(handle.port)
        assert before["series"]["loss"]["step"] == list(range(1, 21))

        # A new process loads the step-20 checkpoint and trains 20 more, while a client follows.
        proc = resume_in_a_new_process(log_file, 2, at_20)
        streamed = follow_until_end(handle.port, before["cursor"], proc)
        finish(proc)
        streamed_steps = [r["step"] for r in streamed if r["type"] == "step"]
        assert streamed_steps == list(range(21, 41))  # never a step twice, nothing from 1-20 again

        resumed = history(handle.port)
        assert resumed["series"]["loss"]["step"] == list(range(1, 41)) and resumed["exact"]
        assert resumed["series"]["lr"]["value"] == pytest.approx(LR_TABLE[:40], rel=1e-6)

        # Roll back: a third process loads the step-10 checkpoint and trains 10 steps (11-20 again), on
        # other batches (as after a divergence).
        rollback = resume_in_a_new_process(log_file, 1, at_10, "--data-seed", "1")
        finish(rollback)
        rolled_back = {"first_step": 11, "last_step": 20}  # the third segment, complete
        wait_for(lambda: history(handle.port)["latest_segment"] == rolled_back, timeout=30)
        rolled = history(handle.port)
    finally:
        handle.stop()

    first, second, third = segments(log_file)
    assert [(s[0]["initial_step"], s[0]["initial_step_from"]) for s in (first, second, third)] == [
        (0, "step_cell"), (20, "step_cell"), (10, "step_cell")]
    for seg, steps, epochs in ((first, range(1, 21), [1] * 10 + [2] * 10),
                               (second, range(21, 41), [3] * 10 + [4] * 10),
                               (third, range(11, 21), [2] * 10)):
        step_recs = [r for r in seg if r["type"] == "step"]
        assert [r["step"] for r in step_recs] == list(steps)
        assert [r["epoch"] for r in step_recs] == epochs
        assert [r["lr"] for r in step_recs] == pytest.approx([LR_TABLE[s - 1] for s in steps], rel=1e-6)
        assert seg[-1]["type"] == "end" and seg[-1]["status"] == "finished"

    # The latest segment wins, step by step (docs/format.md): steps 1-10 of the first run, 11-20 of
    # the rollback, which replaces those only; 21-40 of the second run stay.
    loss = rolled["series"]["loss"]
    by_step = dict(zip(loss["step"], loss["value"]))
    assert loss["step"] == list(range(1, 41)) and len(rolled["headers"]) == 3
    assert [by_step[s] for s in range(1, 11)] == [r["loss"] for r in first if r["type"] == "step"][:10]
    assert [by_step[s] for s in range(11, 21)] == [r["loss"] for r in third if r["type"] == "step"]
    assert [by_step[s] for s in range(11, 21)] != [r["loss"] for r in first if r["type"] == "step"][10:]
    assert [by_step[s] for s in range(21, 41)] == [r["loss"] for r in second if r["type"] == "step"]
    assert rolled["series"]["lr"]["value"] == pytest.approx(LR_TABLE[:40], rel=1e-6)
    assert not os.path.exists(log_file.parent / ".metrics.jsonl.lock")  # every writer gave its lock back


def test_epochs_in_dataset_sink_mode_on_cpu(tmp_path):
    # CPU cannot sink: MindSpore runs each 12-batch epoch without sink but reports the sink size (4)
    # as the epoch length. Before: steps_per_epoch=4 and epochs 1, 1, 2, 1, ... (step 16 -> epoch 1).
    cell, _ = history_cell("real", history_size=32)
    path = tmp_path / "metrics.jsonl"
    Model(cell).train(2, dataset(12), callbacks=[LiveMonitor(path, log_interval=5)], dataset_sink_mode=True,
                      sink_size=4)
    header = records(path, "header")[0]
    assert header["steps_per_epoch"] == 12
    steps = records(path, "step")
    assert [r["step"] for r in steps] == list(range(1, 25))
    assert [r["epoch"] for r in steps] == [1] * 12 + [2] * 12
