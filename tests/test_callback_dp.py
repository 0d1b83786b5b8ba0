"""Two data-parallel CPU workers under msrun: one global log, written by rank 0 only."""

from __future__ import annotations

from pathlib import Path

import pytest

from gradmon.logformat.reader import ReadStats, read_records
from tests.msrun_util import ROOT, run_msrun

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

SCRIPT = ROOT / "tests" / "dp_monitor_train.py"


@pytest.fixture(scope="module")
def run_dirs(tmp_path_factory) -> dict[str, Path]:
    """One msrun job for both cases: its workers train twice (tests/dp_monitor_train.py)."""
    tmp = tmp_path_factory.mktemp("callback_dp")
    dirs = {"global": tmp / "run", "per_rank": tmp / "run-per-rank"}
    run_msrun(SCRIPT, [str(d / "metrics.jsonl") for d in dirs.values()], tmp, timeout=300)
    return dirs


def segment(path: Path) -> list[dict]:
    stats = ReadStats()
    recs = list(read_records(path, stats=stats))
    assert stats.malformed == 0 and stats.partial_tail_bytes == 0
    return recs


def check_log(recs: list[dict], rank: int) -> None:
    assert [r["type"] for r in recs if r["type"] == "header"] == ["header"]  # one writer, one segment
    header = recs[0]
    assert (header["world_size"], header["rank"]) == (2, rank)
    assert (header["parallel_mode"], header["device_num"]) == ("data_parallel", 2)
    steps = [r for r in recs if r["type"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, 9))  # every step, from the device history
    assert all(r["grad_norm"] > 0 for r in steps)
    assert recs[-1]["type"] == "end" and recs[-1]["status"] == "finished"


def test_only_rank0_writes_the_global_log(run_dirs):
    run_dir = run_dirs["global"]
    assert sorted(p.name for p in run_dir.iterdir()) == ["metrics.jsonl"]
    check_log(segment(run_dir / "metrics.jsonl"), rank=0)


def test_per_rank_files(run_dirs):
    run_dir = run_dirs["per_rank"]
    assert sorted(p.name for p in run_dir.iterdir()) == ["metrics.jsonl", "metrics.rank0.jsonl",
                                                          "metrics.rank1.jsonl"]
    check_log(segment(run_dir / "metrics.jsonl"), rank=0)
    for rank in (0, 1):
        recs = segment(run_dir / f"metrics.rank{rank}.jsonl")
        check_log(recs, rank=rank)
    per_rank = [segment(run_dir / f"metrics.rank{r}.jsonl") for r in (0, 1)]
    assert per_rank[0][0]["pid"] != per_rank[1][0]["pid"]  # written by the two workers
    norms = [[r["grad_norm"] for r in recs if r["type"] == "step"] for recs in per_rank]
    assert norms[0] == pytest.approx(norms[1], rel=1e-5)  # the all-reduced norm: the same on both ranks
