"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const { tooltipRows, tooltipHtml } = require("../src/lib/tooltip.js");

const params = [
  { seriesId: "a|b|loss|raw", data: [10, 2.5, 10] }, // a run name holding "|"
  { seriesId: "a|b|loss|smooth", data: [10, 2.4, 10] },
  { seriesId: "a|b|eval/loss|raw", data: [12, 2.9, 12] },
  { seriesId: "a|b|loss|nonfinite", data: { value: [10, 2.5, 10], nonfinite: "NaN", field: "loss" } },
  { seriesId: "other|loss|raw", data: [11, 3.25, 11] },
  { seriesId: "other|spikes", data: { value: [40, 9, 40], mark: { kind: "spike" } } }, // another step: not shown
  { seriesId: "other|skips", data: { value: [11, 9, 11], mark: { kind: "skip", reason: "overflow" } } },
];

test("one row per run: this chart's value (smoothed first), raw, eval and the marks at that step", () => {
  assert.deepEqual(tooltipRows(params), [
    { run: "a|b", step: 10, value: 2.4, raw: 2.5, eval: { step: 12, value: 2.9 }, marks: ["loss NaN"] },
    { run: "other", step: 11, value: 3.25, raw: undefined, eval: null, marks: ["skip (overflow)"] },
  ]);
});

test("HTML: escaped names, the step in the head, another run's step shown beside it", () => {
  const html = tooltipHtml([{ seriesId: "<b>|rss_bytes|raw", data: [5, 1.2e9, 5] }, { seriesId: "x|rss_bytes|raw", data: [6, 2e9, 6] }],
    { field: "system/rss_bytes", colorOf: () => "#123", smoothing: 0 });
  assert.ok(html.includes("&lt;b&gt;"));
  assert.ok(!html.includes("<b>"));
  assert.ok(html.includes("step 5"));
  assert.ok(html.includes("1.2 GB") && html.includes("2 GB"));
  assert.ok(html.includes("@6"));
  assert.equal((html.match(/<tr>/g) || []).length, 2);
});
