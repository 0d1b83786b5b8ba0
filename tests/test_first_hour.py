"""The first hour of a hurried user (issue 25): each mistake gets a message that says what to do,
and nothing already written is lost. One test per case; the message asserted is the one
docs/troubleshooting.md quotes."""

from __future__ import annotations

import errno
import json
import os
import socket
import warnings

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn
from mindspore.train import Model
from server_helpers import get_json, wait_for
from train_util import IN_DIM, dataset, history_cell, mlp, params_of, records, use_graph_mode

from gradmon import MonitoredTrainStep, MonitoredTrainStepWithLossScale, cli
from gradmon.monitor.callback import LiveMonitor, log_file_path
from gradmon.server import start_server


@pytest.fixture(autouse=True)
def _graph_mode():
    use_graph_mode()


# -- 1. a run name without .jsonl is a run directory ---------------------------------------------------

def test_a_path_without_jsonl_is_a_run_directory_that_serve_lists(tmp_path):
    logs = tmp_path / "logs"
    cell, _ = history_cell("fake")
    Model(cell).train(1, dataset(3), callbacks=[LiveMonitor(logs / "exp001")])  # not there yet
    assert (logs / "exp001").is_dir()
    assert [r["step"] for r in records(logs / "exp001" / "metrics.jsonl", "step")] == [1, 2, 3]

    handle = start_server(logs, port=0, discover_interval=0.1)
    try:
        wait_for(lambda: [r.get("name") for r in get_json(handle.port, "/api/runs")[1]["runs"]] == ["exp001"])
        assert get_json(handle.port, "/api/runs/exp001")[1]["last_step"] == 3
    finally:
        handle.stop()


def test_a_log_serve_will_not_list_is_said_at_the_start(tmp_path, caplog):
    log = tmp_path / "logs" / "demo_metrics.jsonl"  # the seed article's name: then a blank page
    LiveMonitor(log)
    assert (f"gradmon: {log} is not named metrics.jsonl, so gradmon serve will not list it (a run is a "
            f"directory holding metrics.jsonl); LiveMonitor('{tmp_path}/logs/demo_metrics') writes the run "
            "'demo_metrics'") in caplog.text
    caplog.clear()
    LiveMonitor(tmp_path / "logs" / "demo")
    assert "will not list" not in caplog.text


def test_serve_says_when_the_logs_under_its_root_are_not_runs(tmp_path):
    from gradmon.server.cli import no_runs_note

    logs = tmp_path / "logs"
    (logs / "sweep").mkdir(parents=True)
    (logs / "sweep" / "demo_metrics.jsonl").write_text('{"type": "header", "schema": 1}\n')
    demo = logs / "sweep" / "demo_metrics"
    # printed by `gradmon serve` after "serving runs under ..."; before: nothing, and a blank page
    assert no_runs_note(str(logs)) == (
        f"no runs under {logs} yet (a run is a directory holding metrics.jsonl), but {demo}.jsonl is a log "
        f"that is not a run: LiveMonitor('{demo}') writes the run 'demo_metrics' (or move the file to "
        f"{demo}/metrics.jsonl)")
    (logs / "exp001").mkdir()
    (logs / "exp001" / "metrics.jsonl").write_text('{"type": "header", "schema": 1}\n')
    assert no_runs_note(str(logs)) is None  # a root with runs: nothing to say
    assert no_runs_note(str(tmp_path / "absent")) is None


def test_the_path_rule(tmp_path):
    assert log_file_path(tmp_path / "run.jsonl") == str(tmp_path / "run.jsonl")
    assert log_file_path(tmp_path / "RUN.JSONL") == str(tmp_path / "RUN.JSONL")
    assert log_file_path(tmp_path / "sum") == str(tmp_path / "sum" / "metrics.jsonl")
    assert log_file_path(f"{tmp_path}/new/") == f"{tmp_path}/new/metrics.jsonl"
    # A log an older gradmon wrote at a path without the suffix is continued, not shadowed ...
    legacy = tmp_path / "exp_old"
    legacy.write_text(json.dumps({"type": "header", "schema": 1}) + "\n")
    assert log_file_path(legacy) == str(legacy)
    # ... while any other file stays a (failing, reported: see the writer's tests) run directory.
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    assert log_file_path(notes) == str(notes / "metrics.jsonl")


# -- 4. records that cannot be written: said what it is, not retried every step, summarised once ------

def _gradmon_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if str(w.message).startswith("gradmon:")]


def test_a_file_where_the_run_directory_should_be_is_named_and_the_loss_summarised(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    cell, _ = history_cell("fake")
    monitor = LiveMonitor(notes)  # a run name that happens to be a file
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Model(cell).train(1, dataset(5), callbacks=[monitor])
    assert cell.total == 5  # training finished
    log = notes / "metrics.jsonl"
    told = _gradmon_warnings(caught)
    assert told == [
        f"gradmon: cannot open run log {log}: {notes} is a file, not a directory (LiveMonitor(path) takes a "
        "run directory, or a file path ending in .jsonl: move that file or choose another path); its "
        "records are dropped (checked again every 30 s, not at every step)",
        f"gradmon: 7 records could not be written to {log}: {notes} is a file, not a directory "
        "(LiveMonitor(path) takes a run directory, or a file path ending in .jsonl: move that file or "
        "choose another path)",
    ]  # before: "[Errno 17] File exists: '...notes.txt'; dropping records and retrying"; no summary
    assert monitor.dropped_records == 7  # header, 5 steps, end
    assert notes.read_text() == "my notes\n"  # the user's file is untouched


@pytest.mark.parametrize(("code", "said"), [
    (errno.EROFS, "{run} is on a read-only file system (write the log to a writable directory)"),
    (errno.EACCES, "no permission to write {run} (Permission denied; choose a directory you can write to)"),
])
def test_an_unwritable_directory_is_named_tried_once_and_summarised(tmp_path, monkeypatch, code, said):
    run = tmp_path / "run"
    run.mkdir()
    log = run / "metrics.jsonl"
    real_open, attempts = os.open, []

    def refusing_open(path, flags, *args, **kwargs):  # as root, chmod cannot make a directory unwritable
        if os.fspath(path).startswith(str(run)) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            attempts.append(path)
            raise OSError(code, os.strerror(code), os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing_open)
    cell, _ = history_cell("fake")
    monitor = LiveMonitor(run)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Model(cell).train(1, dataset(5), callbacks=[monitor])
    what = said.format(run=run)
    assert _gradmon_warnings(caught) == [
        f"gradmon: cannot open run log {log}: {what}; its records are dropped (checked again every 30 s, "
        "not at every step)",
        f"gradmon: 7 records could not be written to {log}: {what}",
    ]
    assert cell.total == 5 and monitor.dropped_records == 7
    assert len(attempts) == 1  # one try in a run of seconds, not one per step


# -- 5. gradmon serve on a busy port --------------------------------------------------------------------

def test_serve_on_a_busy_port_says_which_flag_to_use(tmp_path, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert cli.main(["serve", str(tmp_path), "--port", str(port)]) == 1
    err = capsys.readouterr().err
    assert f"gradmon serve: cannot listen on 127.0.0.1:{port}: " in err and "address already in use" in err
    # before: the line ended there
    assert err.rstrip().endswith("another program (another gradmon serve?) has that port: choose another "
                                 "with --port N, or --port 0 for any free port")


# -- 2. a network without its loss -------------------------------------------------------------------

MODES = {"GRAPH": ms.GRAPH_MODE, "PYNATIVE": ms.PYNATIVE_MODE}
WRAP = "MonitoredTrainStep(nn.WithLossCell(net, loss_fn), optimizer)"


def _sgd(net: nn.Cell) -> nn.Optimizer:
    return nn.SGD(net.trainable_params(), learning_rate=0.1)


@pytest.mark.parametrize("mode", list(MODES))
def test_logits_instead_of_a_loss_raise_naming_with_loss_cell_and_train_nothing(mode):
    ms.set_context(mode=MODES[mode])
    net = mlp()  # returns logits of shape (16, 10)
    before = params_of(net)
    step = MonitoredTrainStep(net, _sgd(net))
    x = Tensor(np.ones((16, IN_DIM), np.float32))
    with pytest.raises(ValueError) as raised:
        step(x)
    message = str(raised.value)
    # before: no error; it trained on sum(logits) and logged their mean as the loss
    assert ("MonitoredTrainStep: the network's first output must be the loss, a scalar, but it has shape "
            "(16, 10) (logits? a network without its loss function). Give the step cell the network with its "
            f"loss: {WRAP}. A network returning (loss, *extra) is fine too") in message
    after = params_of(net)
    assert all(np.array_equal(before[k], after[k]) for k in before)  # no update ran


def test_model_train_inputs_that_do_not_fit_construct_name_the_arity_and_the_fix(tmp_path):
    net = mlp()
    monitor = LiveMonitor(tmp_path / "run")
    with pytest.raises(TypeError) as raised:
        Model(MonitoredTrainStep(net, _sgd(net))).train(1, dataset(2), callbacks=[monitor],
                                                         dataset_sink_mode=False)
    # before: "The parameters number of the function is 1, but the number of provided arguments is 2."
    assert ("MonitoredTrainStep: the network's construct(x) takes 1 input, but the step got 2 (under "
            "Model.train: one per dataset column). A network without its loss? Give the step cell the "
            f"network with its loss, whose construct takes (data, label): {WRAP}") in str(raised.value)
    written = records(tmp_path / "run" / "metrics.jsonl")
    assert [r["type"] for r in written] == ["header", "end"] and written[-1]["status"] == "failed"


def test_the_loss_checks_accept_tuples_and_size_one_losses_and_have_an_opt_out():
    class LossAndLogits(nn.Cell):
        def __init__(self, net: nn.Cell) -> None:
            super().__init__()
            self.net, self.loss = net, nn.MSELoss()

        def construct(self, x, y):
            logits = self.net(x)
            return self.loss(logits, y).reshape((1,)), logits

    x, y = Tensor(np.ones((16, IN_DIM), np.float32)), Tensor(np.zeros((16, 10), np.float32))
    net = mlp()
    loss, norm, logits = MonitoredTrainStep(LossAndLogits(net), _sgd(net))(x, y)
    assert loss.shape == (1,) and logits.shape == (16, 10) and float(norm.asnumpy()) > 0
    # The documented opt-out keeps nn.TrainOneStepCell's behaviour for a non-scalar output: same update.
    stock_net, our_net = mlp(), mlp()
    for ours, theirs in zip(our_net.trainable_params(), stock_net.trainable_params()):
        ours.set_data(theirs.data.copy())
    stock_out = nn.TrainOneStepCell(stock_net, _sgd(stock_net))(x)
    our_loss = MonitoredTrainStep(our_net, _sgd(our_net), require_scalar_loss=False)(x)[0]
    assert our_loss.shape == stock_out.shape == (16, 10)
    theirs, ours = params_of(stock_net), params_of(our_net)
    assert all(np.array_equal(theirs[k], ours[k]) for k in theirs)


def test_an_integer_first_output_is_refused():
    class ClassIds(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp()

        def construct(self, x):
            return self.net(x).argmax(-1)

    net = ClassIds()
    with pytest.raises(TypeError, match=r"first output must be the loss, a float scalar, but its dtype is "
                                        r"Int\d+ \(labels\? class ids\?\); return the loss"):
        MonitoredTrainStep(net, _sgd(net))(Tensor(np.ones((16, IN_DIM), np.float32)))


# -- 3. a bad optimizer argument, named before MindSpore's code runs ----------------------------------

@pytest.mark.parametrize(("optimizer", "said"), [
    (None, "got None"),  # before: AttributeError: 'NoneType' object has no attribute 'parameters'
    (nn.MSELoss(), "got a mindspore.nn.loss.loss.MSELoss; that is a loss function: the step cell takes the "
                   "network with its loss, {cls}(nn.WithLossCell(net, loss_fn), optimizer{extra})"),
    (nn.Adam, "got the class mindspore.nn.optim.adam.Adam; pass an instance: "
              "Adam(net.trainable_params(), learning_rate=...)"),
    ([1, 2], "got a builtins.list"),
])
@pytest.mark.parametrize("cls", [MonitoredTrainStep, MonitoredTrainStepWithLossScale])
def test_a_bad_optimizer_is_named(cls, optimizer, said):
    net = nn.WithLossCell(mlp(), nn.MSELoss())
    args = (Tensor(1024.0, ms.float32),) if cls is MonitoredTrainStepWithLossScale else ()
    with pytest.raises(TypeError) as raised:
        cls(net, optimizer, *args)
    extra = ", scale_sense" if cls is MonitoredTrainStepWithLossScale else ""
    assert str(raised.value) == (f"{cls.__name__}: optimizer must be a mindspore.nn.Optimizer (or a Cell "
                                 f"that updates the weights), " + said.format(cls=cls.__name__, extra=extra))


def test_a_network_that_is_not_a_cell_is_named():
    net = mlp()
    with pytest.raises(TypeError, match=r"MonitoredTrainStep: network must be a mindspore.nn.Cell that "
                                        r"returns the loss \(e.g. nn.WithLossCell\(net, loss_fn\)\), "
                                        r"got None"):
        MonitoredTrainStep(None, _sgd(net))


# -- a checkpoint from a gradmon whose detector kept less state ----------------------------------------

def test_a_checkpoint_with_another_detector_state_shape_names_it_and_the_setting_loads_it(tmp_path):
    """A checkpoint saved before the learning-rate test (its state 2 floats shorter) fails MindSpore's
    shape check on ``gradmon_spike_state``; the cell built with ``spike_lr_ratio=0`` loads it whole."""
    from examples.models import with_loss

    def cell(**options):
        net = with_loss(mlp())
        return MonitoredTrainStep(net, nn.Adam(net.trainable_params(), 1e-3), spike_mode="clip", **options)

    old = cell(spike_lr_ratio=0)
    x, y = next(dataset(3).create_tuple_iterator())
    for _ in range(3):
        old(x, y)
    path = str(tmp_path / "old.ckpt")
    ms.save_checkpoint(old, path)
    saved = ms.load_checkpoint(path)["gradmon_spike_state"].asnumpy()
    with pytest.raises(RuntimeError, match=r"gradmon_spike_state .*same shape"):
        ms.load_param_into_net(cell(), ms.load_checkpoint(path))
    new = cell(spike_lr_ratio=0)
    ms.load_param_into_net(new, ms.load_checkpoint(path))
    assert np.array_equal(new.spike_state.asnumpy(), saved) and saved[0] == 3  # its 3 steps, not a reset
