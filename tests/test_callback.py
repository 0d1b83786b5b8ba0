"""LiveMonitor under real MindSpore training (small MLP, synthetic data, a few steps): records,
header, learning rate, evaluation, output paths, event hook."""

from __future__ import annotations

import math

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn
from mindspore.train import Model
from train_util import (
    BATCH,
    HistoryStep,
    NanAwareLoss,
    NormStep,
    dataset,
    history_cell,
    mlp,
    records,
    segments,
    strict_records,
    use_graph_mode,
)

from gradmon.monitor.callback import LiveMonitor, log_file_path, rank_log_path


@pytest.fixture(autouse=True)
def _graph_mode():
    use_graph_mode()


def test_nan_step_lines_are_strict_json(tmp_path):
    path = tmp_path / "run" / "metrics.jsonl"
    net = mlp()
    cell = NormStep(NanAwareLoss(net), nn.SGD(net.trainable_params(), learning_rate=0.05))
    with LiveMonitor(path, config={"lr": 0.05, "note": float("nan")}) as monitor:
        Model(cell).train(1, dataset(5, nan_steps=[3]), callbacks=[monitor])
    lines = strict_records(path)  # raises on any bare NaN/Infinity token
    assert lines[0]["type"] == "header" and lines[0]["config"] == {"lr": 0.05, "note": "NaN"}
    steps = {r["step"]: r for r in lines if r["type"] == "step"}
    assert sorted(steps) == [1, 2, 3, 4, 5]
    assert steps[3]["loss"] == "NaN" and steps[3]["grad_norm"] in ("NaN", "Infinity")
    assert steps[3]["nonfinite"] is True
    assert all(isinstance(steps[s]["loss"], float) for s in (1, 2, 4, 5))  # update skipped, run recovered
    assert [r["step"] for r in lines if r["type"] == "event" and r["kind"] == "nonfinite"] == [3]
    assert lines[-1]["type"] == "end" and lines[-1]["status"] == "finished" and lines[-1]["steps"] == 5


def test_header_fields_and_a_second_train_continues_the_numbering(tmp_path):
    path = tmp_path / "metrics.jsonl"
    cell, _ = history_cell("fake")
    for _ in range(2):  # the same model trained again (a new monitor on the same file): steps go on
        Model(cell).train(1, dataset(4), callbacks=[LiveMonitor(path, config={"seed": 0})])
    first, second = segments(path)
    h = first[0]
    assert h["mode"] == "GRAPH" and h["device"] == "CPU" and (h["world_size"], h["rank"]) == (1, 0)
    assert (h["parallel_mode"], h["device_num"]) == ("stand_alone", 1)
    assert h["versions"]["mindspore"] == ms.__version__ and h["log_interval"] == 1
    assert (h["max_norm"], h["spike_mode"]) == (1.5, "detect")  # from cell.gradmon_config()
    assert "norm_strategy" not in h  # only when the cell's config has one
    assert h["batch_size"] == BATCH and h["config"] == {"seed": 0} and h["steps_per_epoch"] == 4
    assert (h["initial_step"], h["initial_step_from"]) == (0, "step_cell")
    assert (second[0]["initial_step"], second[0]["initial_step_from"]) == (4, "step_cell")
    for seg, steps in ((first, [1, 2, 3, 4]), (second, [5, 6, 7, 8])):
        assert [r["step"] for r in seg if r["type"] == "step"] == steps
        assert seg[-1]["type"] == "end" and seg[-1]["steps"] == steps[-1]
        for r in seg:
            if r["type"] == "step":
                assert r["throughput"] > 0 and r["step_time"] > 0 and r["data_time"] >= 0
    assert [r["epoch"] for r in second if r["type"] == "step"] == [2, 2, 2, 2]  # epoch 1 was the first run's


def test_header_copies_norm_strategy_from_the_cell_config(tmp_path):
    class WithStrategy(HistoryStep):
        def gradmon_config(self) -> dict:
            return {**super().gradmon_config(), "norm_strategy": "sharded"}

    net = mlp()
    cell = WithStrategy(NormStep(NanAwareLoss(net), nn.SGD(net.trainable_params(), learning_rate=0.05)))
    Model(cell).train(1, dataset(2), callbacks=[LiveMonitor(tmp_path / "m.jsonl")])
    header = records(tmp_path / "m.jsonl", "header")[0]
    assert header["norm_strategy"] == "sharded" and header["cell_config"]["norm_strategy"] == "sharded"


def test_header_parallel_mode_from_the_auto_parallel_context(tmp_path):
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL)
    try:
        cell, _ = history_cell("fake")
        Model(cell).train(1, dataset(2), callbacks=[LiveMonitor(tmp_path / "m.jsonl")])
    finally:
        ms.reset_auto_parallel_context()
    header = records(tmp_path / "m.jsonl", "header")[0]
    assert (header["parallel_mode"], header["device_num"], header["world_size"]) == ("data_parallel", 1, 1)


@pytest.mark.parametrize("interval", [1, 3])
def test_dynamic_lr_logged_equals_schedule(tmp_path, interval):
    steps = 7
    table = nn.piecewise_constant_lr([2, 5, 100], [0.1, 0.05, 0.01])
    cosine = nn.CosineDecayLR(min_lr=0.001, max_lr=0.1, decay_steps=6)
    # CosineDecayLR's documented formula, step k (from 1) uses global_step k - 1.
    expected_cos = [0.001 + 0.5 * 0.099 * (1 + math.cos(math.pi * min(k, 6) / 6)) for k in range(steps)]
    for lr, expected in ((table, table[:steps]), (cosine, expected_cos)):
        path = tmp_path / f"{type(lr).__name__}-{interval}.jsonl"
        net = mlp()
        cell = HistoryStep(NormStep(NanAwareLoss(net), nn.SGD(net.trainable_params(), learning_rate=lr)))
        Model(cell).train(1, dataset(steps), callbacks=[LiveMonitor(path, log_interval=interval)])
        logged = [(r["step"], r["lr"]) for r in records(path, "step")]
        assert [s for s, _ in logged] == list(range(1, steps + 1))
        assert [v for _, v in logged] == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("kind", ["fake", "real"])
def test_dynamic_lr_after_a_skipped_step(tmp_path, kind):
    # A skipped step does not run the optimizer, so the schedule does not advance for it.
    table = [0.1, 0.09, 0.08, 0.07, 0.06, 0.05, 0.04]
    cell, _ = history_cell(kind, lr=table)
    path = tmp_path / "metrics.jsonl"
    Model(cell).train(1, dataset(6, nan_steps=[3]), callbacks=[LiveMonitor(path, log_interval=3)])
    steps = records(path, "step")
    assert [r.get("skipped", False) for r in steps] == [False, False, True, False, False, False]
    assert steps[2]["skip_reason"] == "nonfinite"
    assert [r["lr"] for r in steps] == pytest.approx([0.1, 0.09, 0.08, 0.08, 0.07, 0.06])


def test_plain_cell_logs_every_nth_step_history_cell_logs_every_step(tmp_path):
    net = mlp()
    plain = nn.TrainOneStepCell(NanAwareLoss(net), nn.SGD(net.trainable_params(), learning_rate=0.05))
    Model(plain).train(1, dataset(10), callbacks=[LiveMonitor(tmp_path / "plain.jsonl", log_interval=4)])
    plain_steps = records(tmp_path / "plain.jsonl", "step")
    assert [r["step"] for r in plain_steps] == [4, 8, 10]  # the last partial interval is flushed at the end
    assert all("grad_norm" not in r and isinstance(r["loss"], float) for r in plain_steps)
    assert plain_steps[0]["step_time"] > 0

    cell, _ = history_cell("fake")
    Model(cell).train(1, dataset(10), callbacks=[LiveMonitor(tmp_path / "hist.jsonl", log_interval=4)])
    hist = records(tmp_path / "hist.jsonl", "step")
    assert [r["step"] for r in hist] == list(range(1, 11))
    assert all(isinstance(r["grad_norm"], float) and r["clip_coef"] == 1.0 for r in hist)
    # One read for the restored step counter at the start, then one per interval: steps 4, 8 and the end.
    assert cell.reads == 1 + 3


def test_real_monitored_train_step_every_step(tmp_path):
    cell, _ = history_cell("real", history_size=8)
    path = tmp_path / "metrics.jsonl"
    Model(cell).train(1, dataset(10, nan_steps=[6]), callbacks=[LiveMonitor(path, log_interval=4)])
    recs = records(path)
    steps = [r for r in recs if r["type"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, 11))
    assert all(isinstance(r["grad_norm"], float) for r in steps)
    bad = [r for r in steps if r.get("nonfinite")]
    assert [r["step"] for r in bad] == [6] and bad[0].get("skipped") is True
    assert any(r["type"] == "event" and r["kind"] == "nonfinite" and r["step"] == 6 for r in recs)


def test_real_cell_clip_and_layer_stats(tmp_path):
    from gradmon.cells import MonitoredTrainStep

    net = mlp()
    cell = MonitoredTrainStep(NanAwareLoss(net), nn.SGD(net.trainable_params(), learning_rate=0.05),
                              max_norm=0.01, spike_mode="detect", history_size=8, layer_stats=True)
    path = tmp_path / "clip.jsonl"
    Model(cell).train(1, dataset(6), callbacks=[LiveMonitor(path, log_interval=3, layer_stats_every=3)])
    recs = records(path)
    header = recs[0]
    assert (header["max_norm"], header["spike_mode"]) == (0.01, "detect")
    assert header["cell_config"]["history_size"] == 8
    steps = [r for r in recs if r["type"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, 7))
    for r in steps:  # every step's norm is far above 0.01: clipped, with the factor applied
        assert r["clipped"] is True and r["clip_coef"] == pytest.approx(0.01 / r["grad_norm"], rel=1e-3)
        # The detector judges from the 5th finite norm on (its early rule): no z-score before it.
        assert r["zscore"] == 0.0 or r["step"] > 4
        assert not r.get("spike")  # a clean run: nothing flagged
    layers = [r for r in recs if r["type"] == "layers"]
    assert [r["step"] for r in layers] == [3, 6]
    assert {row["name"] for row in layers[0]["top"]} <= {p.name for p in net.trainable_params()}
    assert all(row["grad_norm"] > 0 for row in layers[0]["top"])


def test_history_overflow_event(tmp_path):
    cell, _ = history_cell("fake", history_size=2)
    path = tmp_path / "metrics.jsonl"
    Model(cell).train(1, dataset(8), callbacks=[LiveMonitor(path, log_interval=4)])
    recs = records(path)
    assert [r["step"] for r in recs if r["type"] == "step"] == [3, 4, 7, 8]
    overflow = [r for r in recs if r["type"] == "event" and r["kind"] == "history_overflow"]
    assert [(r["step"], r["count"]) for r in overflow] == [(1, 2), (5, 2)]


def test_fit_with_valid_dataset_writes_eval_records(tmp_path):
    net = mlp()
    model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                  nn.SGD(net.trainable_params(), learning_rate=0.05), metrics={"accuracy"})
    path = tmp_path / "metrics.jsonl"
    model.fit(2, dataset(4), dataset(2, seed=1), valid_frequency=1,
              callbacks=[LiveMonitor(path, log_interval=3)], valid_dataset_sink_mode=False)
    recs = records(path)
    evals = [r for r in recs if r["type"] == "eval"]
    assert [(r["step"], r["epoch"]) for r in evals] == [(4, 1), (8, 2)]
    for r in evals:
        assert 0.0 <= r["accuracy"] <= 1.0 and isinstance(r["loss"], float) and r["loss"] > 0
    # Each eval follows the training steps it evaluates.
    order = [(r["type"], r.get("step")) for r in recs if r["type"] in ("step", "eval")]
    assert order == [("step", 3), ("step", 4), ("eval", 4), ("step", 6), ("step", 8), ("eval", 8)]


def test_eval_loss_is_the_mean_over_all_eval_batches(tmp_path):
    # MindSpore's own "eval_loss" (Model.fit, 2.7-2.10) is the last eval batch's loss only.
    net = mlp()
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    model = Model(net, loss_fn, nn.SGD(net.trainable_params(), learning_rate=0.05), metrics={"accuracy"})
    path = tmp_path / "metrics.jsonl"
    model.fit(1, dataset(4), dataset(3, seed=1), valid_frequency=1, callbacks=[LiveMonitor(path)],
              valid_dataset_sink_mode=False)
    (last,) = [r for r in records(path) if r["type"] == "eval"]
    with_loss = nn.WithLossCell(net, loss_fn)
    batch_losses = [float(with_loss(b["x"], b["y"]).asnumpy())
                    for b in dataset(3, seed=1).create_dict_iterator()]
    assert "eval_loss" not in last
    np.testing.assert_allclose(last["loss"], np.mean(batch_losses), rtol=1e-5)
    assert abs(last["loss"] - batch_losses[-1]) > 1e-4


def test_mindspore_loss_and_time_monitors_keep_working_beside_it(tmp_path, capsys):
    # MonitoredTrainStep returns (loss, grad_norm), loss first, for exactly these callbacks.
    from mindspore.train import LossMonitor, TimeMonitor

    cell, _ = history_cell("real")
    path = tmp_path / "metrics.jsonl"
    Model(cell).train(1, dataset(4), callbacks=[LossMonitor(1), TimeMonitor(), LiveMonitor(path)],
                      dataset_sink_mode=False)
    printed = [float(line.rsplit("loss is ", 1)[1]) for line in capsys.readouterr().out.splitlines()
               if "loss is " in line]
    logged = [r["loss"] for r in records(path, "step")]
    assert len(logged) == 4
    np.testing.assert_allclose(printed, logged, rtol=1e-6)


def test_pynative_mode(tmp_path):
    ms.set_context(mode=ms.PYNATIVE_MODE)
    cell, _ = history_cell("fake")
    path = tmp_path / "metrics.jsonl"
    Model(cell).train(1, dataset(4), callbacks=[LiveMonitor(path, log_interval=2)])
    recs = records(path)
    assert recs[0]["mode"] == "PYNATIVE"
    assert [r["step"] for r in recs if r["type"] == "step"] == [1, 2, 3, 4]


def test_per_rank_single_process_writes_both_files(tmp_path):
    path = tmp_path / "metrics.jsonl"
    cell, _ = history_cell("fake")
    Model(cell).train(1, dataset(3), callbacks=[LiveMonitor(path, per_rank=True)])
    # (the one-writer lock files are removed on close)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl", "metrics.rank0.jsonl"]
    for p in (path, tmp_path / "metrics.rank0.jsonl"):
        assert [r["step"] for r in records(p, "step")] == [1, 2, 3]


def test_rank_log_path():
    assert rank_log_path("logs/a/metrics.jsonl", 1) == "logs/a/metrics.rank1.jsonl"
    assert rank_log_path("m", 0) == "m.rank0.jsonl"


def test_a_directory_path_means_metrics_jsonl_inside_it(tmp_path):
    existing = tmp_path / "exp_dir"
    existing.mkdir()
    assert log_file_path(existing) == str(existing / "metrics.jsonl")
    assert log_file_path(f"{tmp_path}/new_dir/") == f"{tmp_path}/new_dir/metrics.jsonl"
    assert log_file_path(tmp_path / "run.jsonl") == str(tmp_path / "run.jsonl")  # a file name stays

    cell, _ = history_cell("fake")
    monitor = LiveMonitor(str(existing))
    Model(cell).train(1, dataset(2), callbacks=[monitor])
    assert monitor.settings.log_file == str(existing / "metrics.jsonl")
    assert [r["step"] for r in records(existing / "metrics.jsonl", "step")] == [1, 2]


def test_invalid_arguments(tmp_path):
    for bad in ({"log_interval": 0}, {"abort_after": 0}, {"initial_step": -1}):
        with pytest.raises(ValueError):
            LiveMonitor(tmp_path / "m.jsonl", **bad)
    # Each numeric option is checked when given, with its name, as Recovery's and AlarmConfig's are:
    # a float, a bool, text or NaN once went through int() or float() (or raised OverflowError),
    # to fail at the first step or in the sampler thread, or never.
    for name, bad in [("log_interval", 2.5), ("log_interval", True), ("log_interval", "3"),
                      ("log_interval", float("inf")), ("batch_size", "x"), ("batch_size", 0),
                      ("batch_size", float("nan")), ("layer_stats_every", -1), ("layer_top_k", 0.5),
                      ("initial_step", 2**63), ("abort_after", 10**400), ("system_interval", "x"),
                      ("system_interval", float("nan")), ("system_interval", 2**63),
                      ("retry_initial", -1.0), ("retry_initial", 10**400)]:
        with pytest.raises(ValueError, match=f"^{name} must be"):
            LiveMonitor(tmp_path / "m.jsonl", **{name: bad})
    ok = LiveMonitor(tmp_path / "m.jsonl", log_interval=np.int64(4), batch_size=np.int32(8), retry_initial=0,
                     system_interval=np.float32(0.5), initial_step=2**63 - 1).settings
    assert (ok.log_interval, ok.batch_size, ok.retry_initial, ok.system_interval, ok.initial_step) == \
        (4, 8, 0.0, 0.5, 2**63 - 1)
    assert type(ok.log_interval) is int and type(ok.system_interval) is float
    with pytest.raises(TypeError, match="on_event"):
        LiveMonitor(tmp_path / "m.jsonl", on_event="print")
    # A misspelt option is named with the known ones (MonitorSettings.from_kwargs, as StepOptions does).
    unexpected = r"LiveMonitor got unexpected option\(s\) 'abort_afterr'.*abort_after"
    with pytest.raises(TypeError, match=unexpected):
        LiveMonitor(tmp_path / "m.jsonl", abort_afterr=3)
    assert not (tmp_path / "m.jsonl").exists()  # nothing opened before the options were checked


def test_on_event_gets_every_event_written_and_its_failure_never_stops_training(tmp_path, caplog):
    seen: list[dict] = []

    def hook(event):
        seen.append(event)
        raise RuntimeError("webhook down")

    cell, _ = history_cell("real")
    path = tmp_path / "metrics.jsonl"
    monitor = LiveMonitor(path, log_interval=3, abort_after=2, on_event=hook)
    Model(cell).train(1, dataset(8, nan_steps=[2, 5, 6]), callbacks=[monitor])
    written = [r for r in records(path) if r["type"] == "event"]
    # the alarm rule's events too: one incident (steps 2-6, the abort joining it), ended at close
    assert [(e["kind"], e["step"]) for e in written] == [("nonfinite", 2), ("alarm", 2), ("nonfinite", 5),
                                                        ("nonfinite", 6), ("abort", 6), ("alarm_end", 6)]
    assert [(e["kind"], e["step"]) for e in seen] == [(e["kind"], e["step"]) for e in written]
    assert seen[0]["loss"] != seen[0]["loss"]  # the record as written: NaN loss, as a float
    assert sum("on_event" in r.message for r in caplog.records) == 1  # logged once
    assert records(path)[-1]["status"] == "aborted"
