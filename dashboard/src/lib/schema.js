/* Field names of the run-log format (docs/format.md): the page's copy of gradmon/logformat/schema.py.
 *
 * tests/test_schema.py checks that the two agree; change both together.
 */
(function (root, factory) {
  "use strict";
  const api = factory();
  if (typeof module !== "undefined" && module.exports) module.exports = api;
  else Object.assign((root.GradmonLib = root.GradmonLib || {}), api);
})(typeof self !== "undefined" ? self : this, function () {
  "use strict";

  const SCHEMA = Object.freeze({
    // Keys whose values are text by definition: a "NaN" there is the word, not a number.
    TEXT_KEYS: ["type", "kind", "message", "name", "run_id", "host", "status", "mode", "device", "spike_mode", "unit",
      "parallel_mode", "norm_strategy", "initial_step_from", "steps_per_epoch_unknown", "reason", "skip_reason",
      "field", "source"],
    // Known fields that must be integers / numbers when present.
    INT_FIELDS: ["step", "epoch", "pid", "world_size", "rank", "schema", "steps"],
    NUMBER_FIELDS: ["ts", "start_time"],
    // Step-record flags (booleans, written only when true).
    FLAG_FIELDS: ["clipped", "spike", "skipped", "nonfinite"],
    // Step flags that put a mark on the charts, with the mark's kind.
    MARK_FLAGS: [["spike", "spike"], ["skipped", "skip"], ["nonfinite", "nonfinite"]],
    // The skip_reason of a loss-scale overflow step: a skip mark, its non-finite norm no nonfinite mark.
    OVERFLOW_REASON: "overflow",
    // Numeric fields of a step record that are coordinates or bookkeeping, not series.
    NOT_SERIES: ["step", "epoch", "ts", "schema", "pid", "rank", "world_size"],
    // Alarm events (gradmon/logformat/alarms.py): the kinds that open and close an incident, and its reasons.
    ALARM_KINDS: ["alarm", "alarm_end"],
    ALARM_REASONS: ["nonfinite", "grad_norm_spike", "loss_spike", "abort"],
    // The alarm event's field with the step cell's forensics of the alarm's step, and its keys.
    FORENSICS_FIELD: "forensics",
    FORENSICS_KEYS: ["step", "layers", "layer_count", "grouped", "rank_norms", "top_rank", "sample_ids", "missing", "error"],
    // The header field of a writer that runs the alarm rule, and the `source` of the alarm events
    // a server derived for a segment without it.
    ALARM_RULE_FIELD: "alarm_rule",
    DERIVED_SOURCE: "server",
  });

  return { SCHEMA };
});
