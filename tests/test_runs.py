"""Run discovery: nested runs, rank files, the root as a run, symlinks that escape the root."""

from __future__ import annotations

import os

from server_helpers import make_run

from gradmon.server.runs import discover_runs, is_inside, run_status


def test_nested_runs_and_rank_files(tmp_path):
    make_run(tmp_path, "exp001", 1)
    make_run(tmp_path, "sweep/lr-3e-4", 1)
    rank = tmp_path / "sweep" / "lr-3e-4" / "metrics.rank1.jsonl"
    rank.write_text("{}\n")
    (tmp_path / "sweep" / "lr-3e-4" / "metrics.rankX.jsonl").write_text("{}\n")  # not a rank file
    (tmp_path / "notes" ).mkdir()
    (tmp_path / "notes" / "metrics.json").write_text("{}")
    found = discover_runs(str(tmp_path))
    assert set(found) == {"exp001", "sweep/lr-3e-4", "sweep/lr-3e-4/rank1"}
    assert found["sweep/lr-3e-4/rank1"] == os.path.realpath(rank)


def test_root_itself_is_a_run_named_after_it(tmp_path):
    root = tmp_path / "myrun"
    make_run(root, ".", 1)
    assert set(discover_runs(str(root))) == {"myrun"}


def test_symlinks_escaping_the_root_are_refused(tmp_path):
    root = tmp_path / "logs"
    make_run(root, "inside", 1)
    outside = tmp_path / "outside"
    make_run(outside, "secret", 1)
    (root / "escape_dir").symlink_to(outside / "secret", target_is_directory=True)
    (root / "fake").mkdir()
    (root / "fake" / "metrics.jsonl").symlink_to(outside / "secret" / "metrics.jsonl")
    (root / "alias").symlink_to(root / "inside", target_is_directory=True)  # inside: fine
    (root / "loop").symlink_to(root, target_is_directory=True)  # a loop: walked once
    found = discover_runs(str(root))
    assert "escape_dir" not in found and "fake" not in found
    assert all(is_inside(p, os.path.realpath(root)) for p in found.values())
    assert "inside" in found


def test_is_inside_is_not_fooled_by_prefixes(tmp_path):
    root = os.path.realpath(tmp_path / "logs")
    os.makedirs(root)
    os.makedirs(root + "2")
    assert is_inside(root, root)
    assert not is_inside(root + "2", root)
    assert not is_inside(os.path.join(root, ".."), root)


def test_missing_root_has_no_runs(tmp_path):
    assert discover_runs(str(tmp_path / "nope")) == {}


def test_status_rules():
    assert run_status("finished", 0.0, 1e9) == "finished"
    assert run_status(None, 1e9 - 10, 1e9) == "live"
    assert run_status(None, 1e9 - 1000, 1e9) == "stale"
