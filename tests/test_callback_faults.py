"""LiveMonitor when things go wrong, under real MindSpore training: no device reads off log
steps, unwritable logs, the abort policy, exceptions, failing history reads, non-writing ranks."""

from __future__ import annotations

import os
import warnings

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn
from mindspore.train import Model
from train_util import (
    AtStep,
    HistoryStep,
    NanAwareLoss,
    NormStep,
    dataset,
    history_cell,
    mlp,
    monitored_step,
    params_of,
    records,
    use_graph_mode,
)

from gradmon.monitor.callback import LiveMonitor


@pytest.fixture(autouse=True)
def _graph_mode():
    use_graph_mode()


class Poison:
    """Step outputs that fail on any read: proves the monitor leaves them alone."""

    def __init__(self) -> None:
        self.armed = True

    def __getattr__(self, name):
        if self.__dict__.get("armed", True):
            raise AssertionError(f"step outputs read on a non-log step ({name})")
        return getattr(np.float32(1.5), name)

    def __float__(self):
        if self.armed:
            raise AssertionError("step outputs read on a non-log step (float)")
        return 1.5


def test_no_reads_on_non_log_steps_direct(tmp_path):
    from mindspore.train.callback._callback import InternalCallbackParam, RunContext

    cb = InternalCallbackParam()
    cb.cur_step_num, cb.cur_epoch_num, cb.batch_num = 0, 1, 100
    cb.train_network, cb.optimizer, cb.train_dataset = None, None, None
    run_context = RunContext(cb)
    monitor = LiveMonitor(tmp_path / "m.jsonl", log_interval=5)
    monitor.on_train_begin(run_context)
    for step in range(1, 11):
        outputs = Poison()
        outputs.armed = step % 5 != 0  # readable on log steps only
        cb.cur_step_num, cb.net_outputs = step, outputs
        monitor.on_train_step_begin(run_context)
        monitor.on_train_step_end(run_context)
    monitor.on_train_end(run_context)
    assert [(r["step"], r["loss"]) for r in records(tmp_path / "m.jsonl", "step")] == [(5, 1.5), (10, 1.5)]
    header = records(tmp_path / "m.jsonl", "header")[0]
    assert "steps_per_epoch" not in header and "size" in header["steps_per_epoch_unknown"]


def test_no_tensor_reads_on_non_log_steps_in_model_train(tmp_path, monkeypatch):
    """Count every way a Tensor reaches the host while the monitor's step hooks run."""
    reads = {"n": 0}
    for name in ("asnumpy", "item", "tolist", "__float__", "__int__", "__bool__", "__array__", "__index__"):
        original = getattr(ms.Tensor, name, None)
        if original is None:
            continue

        def counting(self, *a, _orig=original, **k):
            reads["n"] += 1
            return _orig(self, *a, **k)

        monkeypatch.setattr(ms.Tensor, name, counting)

    per_step: dict[int, int] = {}

    class Counted(LiveMonitor):
        def on_train_step_begin(self, run_context):
            before = reads["n"]
            super().on_train_step_begin(run_context)
            self._begin_reads = reads["n"] - before

        def on_train_step_end(self, run_context):
            before = reads["n"]
            super().on_train_step_end(run_context)
            per_step[run_context.original_args().cur_step_num] = reads["n"] - before + self._begin_reads

    for kind in ("plain", "history", "real"):
        per_step.clear()
        net = mlp()
        opt = nn.SGD(net.trainable_params(), learning_rate=nn.piecewise_constant_lr([3, 100], [0.1, 0.01]))
        if kind == "plain":
            cell = nn.TrainOneStepCell(NanAwareLoss(net), opt)
        elif kind == "history":
            cell = HistoryStep(NormStep(NanAwareLoss(net), opt))
        else:
            cell = monitored_step(NanAwareLoss(net), opt)
        Model(cell).train(1, dataset(9), callbacks=[Counted(tmp_path / f"{kind}.jsonl", log_interval=3)])
        assert per_step[3] > 0 and per_step[6] > 0  # the counter does see reads on log steps
        assert {s: n for s, n in per_step.items() if s % 3} == {s: 0 for s in range(1, 10) if s % 3}


def test_io_failure_training_completes_warns_once_and_resumes(tmp_path):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    run = tmp_path / "run"
    run.mkdir()
    path = run / "metrics.jsonl"
    os.symlink("/dev/full", path)  # disk full: every write fails with ENOSPC

    def make_writable(step):
        if step == 5:
            os.unlink(path)

    cell, _ = history_cell("fake")
    monitor = LiveMonitor(path, retry_initial=0.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Model(cell).train(1, dataset(8), callbacks=[AtStep(make_writable), monitor])
    ours = [str(w.message) for w in caught if "gradmon" in str(w.message)]
    # One warning when it starts failing, one summary when training ends (not one per step).
    assert len(ours) == 2 and "No space left" in ours[0]
    assert ours[1] == f"gradmon: 5 records could not be written to {path}: [Errno 28] No space left on device"
    assert cell.total == 8  # training completed
    assert monitor.dropped_records == 5  # header + steps 1-4
    recs = records(path)
    assert recs[0]["type"] == "event" and recs[0]["kind"] == "io_error" and recs[0]["dropped"] == 5
    assert [r["step"] for r in recs if r["type"] == "step"] == [5, 6, 7, 8]
    assert recs[-1]["type"] == "end" and recs[-1]["dropped_records"] == 5


def test_unwritable_directory_training_completes(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory")
    cell, _ = history_cell("fake")
    monitor = LiveMonitor(blocker / "run" / "metrics.jsonl")
    with pytest.warns(RuntimeWarning, match="gradmon"):
        Model(cell).train(1, dataset(4), callbacks=[monitor])
    assert cell.total == 4 and monitor.dropped_records == 6  # header, 4 steps, end


@pytest.mark.parametrize("kind", ["fake", "real"])
def test_abort_after_consecutive_bad_steps_saves_last_good_weights(tmp_path, kind):
    cell, net = history_cell(kind)
    snapshot = {}

    def remember(step):
        if step == 2:
            snapshot.update(params_of(net))

    ckpt = tmp_path / "ckpt" / "abort.ckpt"
    path = tmp_path / "metrics.jsonl"
    executed = []
    monitor = LiveMonitor(path, abort_after=3, abort_checkpoint=ckpt)
    Model(cell).train(1, dataset(10, nan_steps=[3, 4, 5, 6, 7]),
                      callbacks=[AtStep(remember), AtStep(executed.append), monitor])
    assert executed == [1, 2, 3, 4, 5]  # stopped right after the 3rd bad step
    recs = records(path)
    abort = [r for r in recs if r["type"] == "event" and r["kind"] == "abort"]
    assert len(abort) == 1 and abort[0]["step"] == 5 and abort[0]["consecutive"] == 3
    assert abort[0]["checkpoint"] == str(ckpt) and "abort_after=3" in abort[0]["message"]
    assert recs[-1]["type"] == "end" and recs[-1]["status"] == "aborted" and recs[-1]["steps"] == 5
    saved = ms.load_checkpoint(str(ckpt))
    for name, value in snapshot.items():
        np.testing.assert_array_equal(saved[name].asnumpy(), value)
    assert monitor.should_stop


def test_abort_inside_one_history_read_is_placed_at_the_step_that_reached_the_limit(tmp_path):
    # log_interval=10: steps 3..9 are all bad and are read back in one go at step 10.
    cell, _ = history_cell("real")
    path = tmp_path / "metrics.jsonl"
    Model(cell).train(1, dataset(12, nan_steps=list(range(3, 10))),
                      callbacks=[LiveMonitor(path, log_interval=10, abort_after=3)])
    recs = records(path)
    abort = [r for r in recs if r["type"] == "event" and r["kind"] == "abort"]
    assert len(abort) == 1 and abort[0]["step"] == 5 and abort[0]["consecutive"] == 3
    # The abort event follows step 5's record and events, before step 6's record.
    i = recs.index(abort[0])
    assert [r["step"] for r in recs[:i] if r["type"] == "step"][-1] == 5
    assert next(r["step"] for r in recs[i:] if r["type"] == "step") == 6
    assert recs[-1]["type"] == "end" and recs[-1]["status"] == "aborted"


def test_abort_with_a_cell_that_does_not_skip_saves_no_nan_checkpoint(tmp_path):
    net = mlp()
    plain = nn.TrainOneStepCell(NanAwareLoss(net), nn.SGD(net.trainable_params(), learning_rate=0.05))
    ckpt = tmp_path / "abort.ckpt"
    monitor = LiveMonitor(tmp_path / "m.jsonl", abort_after=2, abort_checkpoint=ckpt)
    Model(plain).train(1, dataset(8, nan_steps=[3, 4]), callbacks=[monitor])
    abort = [r for r in records(tmp_path / "m.jsonl") if r.get("kind") == "abort"]
    assert abort[0]["step"] == 4 and "NOT saved" in abort[0]["message"] and "checkpoint" not in abort[0]
    assert not ckpt.exists()


def test_exception_in_training_writes_failed_end(tmp_path):
    def boom(step):
        if step == 3:
            raise RuntimeError("boom")

    cell, _ = history_cell("fake")
    path = tmp_path / "metrics.jsonl"
    with pytest.raises(RuntimeError, match="boom"):
        Model(cell).train(1, dataset(6), callbacks=[LiveMonitor(path, log_interval=2), AtStep(boom)])
    recs = records(path)
    assert [r["step"] for r in recs if r["type"] == "step"] == [1, 2, 3]
    assert recs[-1]["type"] == "end" and recs[-1]["status"] == "failed"


def test_failing_history_read_falls_back_to_outputs(tmp_path, caplog):
    class Broken(HistoryStep):
        def gradmon_read_history(self):
            self.reads += 1
            raise RuntimeError("device ring unreadable")

    net = mlp()
    cell = Broken(NormStep(NanAwareLoss(net), nn.SGD(net.trainable_params(), learning_rate=0.05)))
    path = tmp_path / "metrics.jsonl"
    Model(cell).train(1, dataset(6), callbacks=[LiveMonitor(path, log_interval=2)])
    steps = records(path, "step")
    assert [r["step"] for r in steps] == [2, 4, 6] and all(r["grad_norm"] > 0 for r in steps)
    # Tried once at the start (the restored step counter: the optimizer's global_step stands in),
    # once at the first log step, then never again.
    assert cell.reads == 2 and sum("history failed" in r.message for r in caplog.records) == 1
    assert records(path, "header")[0]["initial_step_from"] == "optimizer"


def test_a_second_monitor_on_the_same_log_is_refused(tmp_path):
    from gradmon.monitor.writelock import LogInUseError

    path = tmp_path / "metrics.jsonl"
    first = LiveMonitor(path)
    first.log(1, loss=1.0)
    cell, _ = history_cell("fake")
    with pytest.raises(LogInUseError, match=f"pid {os.getpid()}"):
        Model(cell).train(1, dataset(2), callbacks=[LiveMonitor(path)])
    assert cell.total == 0  # refused before training started
    first.log(2, loss=2.0)
    first.close()
    assert [(r["type"], r.get("step")) for r in records(path)] == [("header", None), ("step", 1), ("step", 2),
                                                                   ("end", None)]


def test_non_writing_rank_reads_only_for_the_abort_policy(tmp_path, monkeypatch):
    import gradmon.monitor.segment

    monkeypatch.setattr(gradmon.monitor.segment, "distributed", lambda: (1, 2))  # rank 1 of 2
    cell, _ = history_cell("fake")
    Model(cell).train(1, dataset(4), callbacks=[LiveMonitor(tmp_path / "m.jsonl", log_interval=2)])
    assert cell.reads == 1 and not any(tmp_path.iterdir())  # the start's step-counter read only

    cell, _ = history_cell("fake")
    executed = []
    monitor = LiveMonitor(tmp_path / "m.jsonl", abort_after=2, abort_checkpoint=tmp_path / "a.ckpt")
    Model(cell).train(1, dataset(6, nan_steps=[2, 3, 4]), callbacks=[AtStep(executed.append), monitor])
    assert executed == [1, 2, 3] and monitor.should_stop  # stops with rank 0
    assert not any(tmp_path.iterdir())  # writes nothing, saves nothing (rank 0 saves)
