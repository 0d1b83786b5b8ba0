"""The writer-rank rule (pure): one log per job, by the rank that holds the loss."""

from __future__ import annotations

import pytest

from gradmon.monitor.settings import MonitorSettings
from gradmon.monitor.writer_rank import writer_rank


@pytest.mark.parametrize(("world", "stages", "rank"), [(1, 1, 0), (8, 1, 0), (8, 2, 7), (8, 4, 7), (4, 4, 3)])
def test_default_is_rank0_or_the_last_pipeline_stage(world, stages, rank):
    assert writer_rank(world, stages) == rank
    assert writer_rank(world, stages, "auto") == rank


def test_the_last_rank_is_on_the_last_stage():
    # MindSpore's stages and mindformers 2.x's ParallelDims: stage = rank // (world // stages).
    for world, stages in [(8, 2), (8, 4), (16, 4), (6, 3)]:
        assert writer_rank(world, stages) // (world // stages) == stages - 1


@pytest.mark.parametrize(("choice", "rank"), [("first", 0), ("last_stage", 7), (3, 3), (-1, 7), (-8, 0)])
def test_configurable(choice, rank):
    assert writer_rank(8, 2, choice) == rank


@pytest.mark.parametrize("choice", [8, -9])
def test_a_rank_outside_the_job_is_refused(choice):
    with pytest.raises(ValueError, match=r"outside the job's ranks 0\.\.7"):
        writer_rank(8, 1, choice)


@pytest.mark.parametrize("choice", ["last", True, 1.5])
def test_bad_settings_are_refused_when_the_monitor_is_built(choice):
    with pytest.raises((TypeError, ValueError), match="writer_rank"):
        MonitorSettings(log_file="x.jsonl", writer_rank=choice)


def test_settings_keep_a_valid_choice():
    assert MonitorSettings(log_file="x.jsonl", writer_rank="last_stage").writer_rank == "last_stage"
    assert MonitorSettings(log_file="x.jsonl").writer_rank is None
