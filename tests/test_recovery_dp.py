"""Two data-parallel CPU ranks under msrun roll back together, when only one of them sees the trigger."""

from __future__ import annotations

import json

import pytest

from tests.msrun_util import ROOT, run_msrun
from tests.train_util import segments

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

SCRIPT = ROOT / "tests" / "dp_recovery_train.py"


def test_ranks_roll_back_together(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run_msrun(SCRIPT, [str(run_dir)], tmp_path, timeout=240)
    results = [json.loads((run_dir / f"result.rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["rollbacks"] for r in results] == [1, 1]
    # 16 batches: steps 1-12, the rule (rank 1) rolls back to the snapshot after step 10, one batch
    # undone, the last 3 batches train steps 11-13. The replicas stay identical.
    assert [r["step"] for r in results] == [13, 13]
    assert results[0]["weights"] == results[1]["weights"]
    for name in ("metrics.rank0.jsonl", "metrics.rank1.jsonl"):
        first, second = segments(run_dir / name)
        assert first[-1]["status"] == "rolled_back" and second[0]["initial_step"] == 10
        rollback = second[1]
        assert rollback["kind"] == "rollback" and rollback["restored_step"] == 10
        assert [r["step"] for r in second if r["type"] == "step"] == [11, 12, 13]
    # Rank 1 saw its own rule; rank 0 followed it.
    r0 = segments(run_dir / "metrics.rank0.jsonl")[1][1]
    r1 = segments(run_dir / "metrics.rank1.jsonl")[1][1]
    assert (r0["reason"], r0["detail"]) == ("rank", "another rank's rule trigger")
    assert (r1["reason"], r1["detail"], r1["incident_step"]) == ("rule", "rank 1's rule", 12)
