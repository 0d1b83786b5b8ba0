"""The first hour of a hurried user (issue 25): each mistake gets a message that says what to do,
and nothing already written is lost. One test per case; the message asserted is the one
docs/troubleshooting.md quotes."""

from __future__ import annotations

import errno
import json
import os
import socket
import warnings

import pytest
from mindspore.train import Model
from server_helpers import get_json, wait_for
from train_util import dataset, history_cell, records, use_graph_mode

from gradmon import cli
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
