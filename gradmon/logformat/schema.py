"""Field names of the run-log format (docs/format.md), in one place.

Every Python module that reads or writes records takes its names from here: the writer
(``jsonl``, ``records``), the device ring's columns (``gradmon.cells.history``), the server's parser
and index. The page keeps a copy in ``dashboard/src/lib/schema.js``; ``tests/test_schema.py``
checks that the two agree. No imports, no I/O: safe to import from anywhere, MindSpore or not.
"""

from __future__ import annotations

__all__ = [
    "ALARM_KINDS",
    "ALARM_REASONS",
    "ALARM_RULE_FIELD",
    "DERIVED_SOURCE",
    "FLAG_FIELDS",
    "FORENSICS_FIELD",
    "FORENSICS_KEYS",
    "HISTORY_BASE_FIELDS",
    "HISTORY_COUNTER_NAMES",
    "INT_FIELDS",
    "LOSS_SPIKE_REASON",
    "LR_SPIKE_REASON",
    "MARK_FLAGS",
    "NOT_SERIES",
    "NUMBER_FIELDS",
    "OVERFLOW_REASON",
    "SCHEMA_VERSION",
    "SPIKE_REASON_FIELD",
    "TEXT_KEYS",
]

SCHEMA_VERSION = 1

# Keys whose values are text by definition: a "NaN" there is the word, not a number.
TEXT_KEYS = frozenset({
    "type", "kind", "message", "name", "run_id", "host", "status", "mode", "device", "spike_mode", "unit",
    "parallel_mode", "norm_strategy", "initial_step_from", "steps_per_epoch_unknown", "reason", "skip_reason",
    "field", "source",
})

# Known fields and the JSON types they must have when present (bool is not a number here).
INT_FIELDS = ("step", "epoch", "pid", "world_size", "rank", "schema", "steps")
# The integers INT_FIELDS may hold: a signed 64-bit integer's, which every reader stores them in
# (the server's step columns and sidecar). JSON itself has no bound.
INT_MIN, INT_MAX = -(1 << 63), (1 << 63) - 1
NUMBER_FIELDS = ("ts", "start_time")

# Step-record flags: JSON booleans, written only when true (readers treat absent as false).
FLAG_FIELDS = ("clipped", "spike", "skipped", "nonfinite")

# Step flags that put a mark on the charts, with the mark's kind.
MARK_FLAGS = (("spike", "spike"), ("skipped", "skip"), ("nonfinite", "nonfinite"))

# A spike step's `spike_reason` when the detector's loss test tripped it (absent: the norm tests alone).
# Not in TEXT_KEYS (whose list the page mirrors): "loss" is no non-finite number's spelling.
SPIKE_REASON_FIELD = "spike_reason"
LOSS_SPIKE_REASON = "loss"
LR_SPIKE_REASON = "lr"  # the detector's learning-rate test tripped

# The `skip_reason` of a loss-scale overflow step: its non-finite gradient norm is expected, so the
# step is a `skip` mark, and only a non-finite `loss` on it is a `nonfinite` mark.
OVERFLOW_REASON = "overflow"

# Numeric fields of a step record that are coordinates or bookkeeping, not series.
NOT_SERIES = frozenset({"step", "epoch", "ts", "schema", "pid", "rank", "world_size"})

# Columns of the device history ring every monitored step keeps (flags as 0.0/1.0), and the
# int32 totals kept beside it (after the step count).
HISTORY_BASE_FIELDS = ("loss", "grad_norm", "clip_coef", "zscore", *FLAG_FIELDS)
HISTORY_COUNTER_NAMES = ("clipped", "spikes", "skipped", "nonfinite")

# Alarms (gradmon/logformat/alarms.py): the event kinds that open and close an incident, and the reasons an
# incident opens for.
ALARM_KINDS = ("alarm", "alarm_end")
ALARM_REASONS = ("nonfinite", "grad_norm_spike", "loss_spike", "abort")

# The field of an `alarm` event holding what the step cell kept of the alarm's step (forensics=K), and
# the keys it may have (docs/format.md, "Forensics").
FORENSICS_FIELD = "forensics"
FORENSICS_KEYS = ("step", "layers", "layer_count", "grouped", "rank_norms", "top_rank", "sample_ids",
                  "missing", "error")

# The header field saying that the writer runs the alarm rule and writes its events; a segment
# without it gets its alarms from the reader (`gradmon serve` derives them, docs/format.md).
ALARM_RULE_FIELD = "alarm_rule"
# The `source` of the alarm events a reader derived (not lines of the log).
DERIVED_SOURCE = "server"
