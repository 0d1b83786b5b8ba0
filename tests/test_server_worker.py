"""The history worker processes (gradmon.server.worker): calls run in a child process, a dead
child is replaced, failures are reported, anything but a gradmon.server function is refused."""

from __future__ import annotations

import os
import signal

import psutil
import pytest
from server_helpers import make_run

from gradmon.server import worker
from gradmon.server.history import HistoryOptions, answer, build_job
from gradmon.server.runs import Run
from gradmon.server.worker import WorkerPool


@pytest.fixture
def pool():
    p = WorkerPool(1)
    yield p
    p.close()


def _job(tmp_path, n=300, **options):
    path = make_run(tmp_path, "exp1", n)
    run = Run("exp1", str(path))
    run.poll()
    return build_job(run, HistoryOptions(**options))


def _child_pids(pool):
    return [c.proc.pid for c in pool._idle]


def test_a_call_runs_in_a_child_process_and_gives_the_same_answer(pool, tmp_path):
    job = _job(tmp_path, points=40)
    assert pool.call(answer, job) == answer(job)
    (pid,) = _child_pids(pool)
    assert pid != os.getpid() and "gradmon.server.worker" in " ".join(psutil.Process(pid).cmdline())
    assert pool.call(answer, job) == answer(job) and _child_pids(pool) == [pid]  # reused


def test_a_dead_child_is_replaced(pool, tmp_path):
    job = _job(tmp_path, points=40)
    pool.call(answer, job)
    (pid,) = _child_pids(pool)
    os.kill(pid, signal.SIGKILL)
    psutil.Process(pid).wait(timeout=15)
    assert pool.call(answer, job) == answer(job)
    assert _child_pids(pool) and _child_pids(pool) != [pid]


def test_a_failure_is_reported_and_the_child_kept(pool, tmp_path):
    job = _job(tmp_path, points=40)
    pool.call(answer, job)
    (pid,) = _child_pids(pool)
    job.plan.kind = "nonsense"
    job.plan.ranges = [(0, "x")]  # the file read fails with a TypeError in the child
    with pytest.raises(RuntimeError, match="failed in the worker process: TypeError"):
        pool.call(answer, job)
    assert _child_pids(pool) == [pid]


def test_only_gradmon_server_functions_are_called(pool):
    with pytest.raises(ValueError, match=r"not a gradmon\.server function"):
        pool.call(os.getpid, None)
    assert _child_pids(pool) == []


def test_without_a_child_process_calls_run_in_the_caller(pool, tmp_path, monkeypatch, caplog):
    def refuse():
        raise OSError("fork refused")

    monkeypatch.setattr(worker, "_Child", refuse)
    job = _job(tmp_path, points=40)
    assert pool.call(answer, job) == answer(job) and pool.in_process
    assert "cannot start a worker process" in caplog.text


def test_warm_starts_the_child_that_answers_the_first_call(pool, tmp_path):
    pool.warm()
    (pid,) = _child_pids(pool)
    job = _job(tmp_path, points=40)
    assert pool.call(answer, job) == answer(job) and _child_pids(pool) == [pid]  # the warmed child answers


def test_warm_never_raises(pool, monkeypatch, caplog):
    def refuse():
        raise OSError("fork refused")

    monkeypatch.setattr(worker, "_Child", refuse)
    pool.warm()  # no child: calls will run in the caller, as for any call
    assert pool.in_process and _child_pids(pool) == []


def test_early_calls_run_here_until_a_worker_is_up_then_in_it(pool):
    """A restarted server's first history answers do not wait for the worker's start: an early
    call runs in the calling thread (and starts a worker after it); once one has answered, early
    calls go to it; other calls always do."""
    assert pool.call(worker.process_id, None, early=True) == os.getpid()
    pool.warm()  # (waits for the worker the early call started in the background)
    (pid,) = _child_pids(pool)
    assert pid != os.getpid()
    assert pool.call(worker.process_id, None, early=True) == pid
    assert pool.call(worker.process_id, None) == pid


def test_a_worker_answers_without_importing_the_network_stack(pool, tmp_path):
    # Its start competes with a restarted server's first answers for the CPU: it imports the pure
    # parts only (jsontext.py, targets.py), not websockets nor asyncio (~30 % of its start).
    job = _job(tmp_path, points=40)
    assert pool.call(answer, job) == answer(job)
    loaded = pool.call(worker.loaded_modules, None)
    assert "gradmon.server.history" in loaded
    assert not [m for m in loaded if m.split(".")[0] in ("websockets", "asyncio")]
