"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const { RunData } = require("../src/lib/rundata.js");
const { buildSeries } = require("../src/lib/chartopts.js");
const { panelsFor } = require("../src/lib/panels.js");
const { REHEARSAL_PANEL, REHEARSAL_RUN, rehearsalHistory } = require("../src/lib/rehearsal.js");

// The rehearsal chart is there to compile what the first real charts run: it must draw every kind
// of series a chart of the first viewport can hold, on the axis types they use.
test("the rehearsal run draws every kind of series the first charts can hold", () => {
  const run = new RunData(REHEARSAL_RUN);
  run.loadHistory(rehearsalHistory(300), null);
  assert.deepEqual(run.fields().sort(), ["eval/loss", "grad_norm", "loss"]);
  const panel = panelsFor(run.fields()).find((p) => p.id === REHEARSAL_PANEL);
  const built = buildSeries(panel, [{ run, color: "#1f77b4" }], { xMode: "step", scale: "auto", ignoreOutliers: true, maxPoints: 100 });
  assert.equal(built.log, true); // the norm spans four decades: the log axis
  const roles = built.series.map((s) => s.gradmonRole || s.type);
  assert.deepEqual(roles.sort(), ["clipped", "line", "nonfinite", "rollback", "skip", "spike"]);
  const line = built.series.find((s) => s.type === "line");
  assert.ok(line.markLine, "the clip threshold's line"); // from the header's max_norm
  assert.ok(line.data.length < 300 && line.data.length > 50, "decimated to about maxPoints");
  assert.ok(line.data.some((p) => p[1] === null), "a gap at the NaN");
  // The loss chart's curves (train and eval) come from the same run.
  const loss = buildSeries(panelsFor(run.fields())[0], [{ run, color: "#1f77b4" }], { xMode: "step", maxPoints: 100 });
  assert.deepEqual(loss.series.slice(0, 2).map((s) => s.id), ["rehearsal|loss|raw", "rehearsal|eval/loss|raw"]);
});

test("a rehearsal of any size has at least 40 steps and its marks on steps it holds", () => {
  for (const n of [0, 7, 40, 1000]) {
    const h = rehearsalHistory(n);
    const steps = h.series.grad_norm.step;
    assert.equal(steps.length, Math.max(40, n || 240));
    for (const m of h.marks) assert.ok(steps.includes(m.step));
    assert.equal(h.end, steps[steps.length - 1]);
  }
});
