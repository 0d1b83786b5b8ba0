"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const { RunData } = require("../src/lib/rundata.js");
const { buildSeries, xExtent } = require("../src/lib/chartopts.js");
const { panelsFor } = require("../src/lib/panels.js");
const { formatValue } = require("../src/lib/format.js");

function runWith(records, opts) {
  const run = new RunData("r", opts);
  run.ingestRecord({ type: "header", schema: 1, start_time: 100, max_norm: 2.0 });
  for (const r of records) run.ingestRecord(Object.assign({ type: "step", ts: 100 + r.step }, r));
  return run;
}

test("non-finite values are drawn as markers at the last finite value, not dropped", () => {
  const run = runWith([
    { step: 1, loss: 2 },
    { step: 2, loss: 1.5 },
    { step: 3, loss: "NaN" },
    { step: 4, loss: "-Infinity" },
    { step: 5, loss: 1 },
  ]);
  const panel = panelsFor(run.fields())[0];
  const { series, markerPoints } = buildSeries(panel, [{ run, color: "#1f77b4" }], { xMode: "step" });
  assert.equal(markerPoints, 2);
  const raw = series.find((s) => s.id === "r|loss|raw");
  assert.deepEqual(raw.data.map((p) => p[1]), [2, 1.5, null, null, 1]);
  assert.equal(raw.connectNulls, true);
  const m = series.find((s) => s.gradmonRole === "nonfinite");
  assert.deepEqual(m.data.map((d) => d.value), [[3, 1.5, 3], [4, 1.5, 4]]);
  assert.deepEqual(m.data.map((d) => d.nonfinite), ["NaN", "-Infinity"]);
  assert.equal(m.data[1].symbolRotate, 180);
});

test("a non-finite first value is anchored at the first finite value after it", () => {
  const run = runWith([{ step: 1, loss: "Infinity" }, { step: 2, loss: 3 }]);
  const { series } = buildSeries(panelsFor(["loss"])[0], [{ run, color: "#000" }], {});
  assert.deepEqual(series.find((s) => s.gradmonRole === "nonfinite").data[0].value, [1, 3, 1]);
});

test("grad-norm chart: flagged spikes ringed, skips marked, max_norm line, log scale hides non-positive values", () => {
  const recs = [];
  for (let s = 1; s <= 20; s++) recs.push({ step: s, grad_norm: s === 15 ? 30 : s === 3 ? 0 : 1, spike: s === 15 || undefined, skipped: s === 16 || undefined });
  const run = runWith(recs);
  const panel = panelsFor(run.fields()).find((p) => p.id === "grad_norm");
  const { series, log } = buildSeries(panel, [{ run, color: "#000" }], { scale: "log", ignoreOutliers: false });
  assert.equal(log, true);
  const spikes = series.find((s) => s.gradmonRole === "spike");
  assert.deepEqual(spikes.data.map((d) => d.value), [[15, 30, 15]]);
  const skips = series.find((s) => s.gradmonRole === "skip");
  assert.deepEqual(skips.data.map((d) => d.value), [[16, 1, 16]]);
  const raw = series.find((s) => s.id === "r|grad_norm|raw");
  assert.equal(raw.data[2][1], null); // 0 on a log axis
  assert.equal(raw.markLine.data[0].yAxis, 2.0);
});

test("a loss-scale overflow is drawn as a skip at the top of the range, not as a non-finite triangle", () => {
  const recs = [];
  for (let s = 1; s <= 10; s++) recs.push({ step: s, grad_norm: 1 + s / 10 });
  recs[4] = { step: 5, grad_norm: "Infinity", skipped: true, skip_reason: "overflow", loss_scale: 65536 };
  recs[6] = { step: 7, grad_norm: "NaN", nonfinite: true, skipped: true, skip_reason: "nonfinite" };
  const run = runWith(recs);
  const panel = panelsFor(run.fields()).find((p) => p.id === "grad_norm");
  const { series, range } = buildSeries(panel, [{ run, color: "#000" }], {});
  const triangles = series.find((s) => s.gradmonRole === "nonfinite");
  assert.deepEqual(triangles.data.map((d) => d.value[2]), [7]); // the real non-finite step only
  const skips = series.find((s) => s.gradmonRole === "skip");
  assert.deepEqual(skips.data.map((d) => d.value), [[5, range.max, 5]]);
  assert.equal(skips.data[0].trueValue, Infinity); // as measured
  assert.equal(skips.data[0].mark.reason, "overflow");
});

test("y axis: outliers ignored by default with an edge marker per clipped stretch; a flagged spike stays marked", () => {
  const recs = [];
  for (let s = 1; s <= 400; s++) recs.push({ step: s, grad_norm: 1 + 0.05 * Math.sin(s), spike: s === 200 || undefined });
  recs[199].grad_norm = 80; // flagged spike
  recs[299].grad_norm = 60; // an unflagged excursion
  const run = runWith(recs);
  const panel = panelsFor(run.fields()).find((p) => p.id === "grad_norm");
  const built = buildSeries(panel, [{ run, color: "#000" }], {});
  assert.equal(built.log, false);
  assert.ok(built.range.max < 2, JSON.stringify(built.range));
  const clipped = built.series.find((s) => s.gradmonRole === "clipped");
  assert.deepEqual(clipped.data.map((d) => [d.clipped.step, d.clipped.value, d.value[1]]), [[200, 80, built.range.max], [300, 60, built.range.max]]);
  assert.equal(built.clippedPoints, 2);
  const spike = built.series.find((s) => s.gradmonRole === "spike").data[0];
  assert.deepEqual([spike.value[2], spike.value[1], spike.trueValue], [200, built.range.max, 80]); // at the edge, true value kept
  const all = buildSeries(panel, [{ run, color: "#000" }], { ignoreOutliers: false });
  assert.ok(all.range.max >= 80);
  assert.equal(all.series.find((s) => s.gradmonRole === "clipped"), undefined);
});

test("y axis: automatic log for a series spanning four decades, unless forced linear", () => {
  const a = [];
  const b = [];
  for (let s = 1; s <= 2000; s++) {
    a.push({ step: s, grad_norm: 0.4 + 0.01 * Math.sin(s) });
    b.push({ step: s, grad_norm: s < 900 ? 0.4 : 300 + 3000 * Math.abs(Math.sin(s)) });
  }
  const entries = [{ run: runWith(a), color: "#1" }, { run: runWith(b), color: "#2" }];
  const panel = panelsFor(["grad_norm"])[0];
  const auto = buildSeries(panel, entries, {});
  assert.equal(auto.log, true);
  assert.equal(auto.autoLog, true);
  assert.ok(auto.range.min < 0.4 && auto.range.max > 3000, JSON.stringify(auto.range));
  const lin = buildSeries(panel, entries, { scale: "linear" });
  assert.equal(lin.log, false);
  assert.equal(lin.autoLog, false);
});

test("y range follows the zoom window", () => {
  const recs = [];
  for (let s = 1; s <= 1000; s++) recs.push({ step: s, loss: s <= 500 ? 10 : 1 + 0.001 * s });
  const run = runWith(recs);
  const win = buildSeries(panelsFor(["loss"])[0], [{ run, color: "#0" }], { window: { startValue: 600, endValue: 900 }, ignoreOutliers: false });
  assert.ok(win.range.min >= 1.5 && win.range.max < 2, JSON.stringify(win.range));
});

test("smoothing: over every step the run holds, whatever the drawn resolution; quality reported", () => {
  const { emaDebiased } = require("../src/lib/smoothing.js");
  const recs = [];
  for (let s = 1; s <= 5000; s++) recs.push({ step: s, loss: 2 + Math.sin(s / 7) + (s % 97 === 0 ? 5 : 0) });
  const run = runWith(recs);
  const ref = emaDebiased(recs.map((r) => r.loss), 0.99);
  const built = buildSeries(panelsFor(["loss"])[0], [{ run, color: "#0" }], { smoothing: 0.99, maxPoints: 300 });
  const sm = built.series.find((s) => s.id === "r|loss|smooth").data;
  assert.ok(sm.length <= 300 && sm.length > 50);
  for (const [x, y, step] of sm) assert.ok(Math.abs(y - ref[step - 1]) < 1e-12, `${step}: ${y} vs ${ref[step - 1]}`);
  assert.equal(built.smoothing, "exact");
  assert.equal(buildSeries(panelsFor(["loss"])[0], [{ run, color: "#0" }], {}).smoothing, null);
});

test("smoothing adds a debiased curve and fades the raw one; x by relative time", () => {
  const run = runWith([{ step: 1, loss: 1 }, { step: 2, loss: 3 }]);
  const { series } = buildSeries(panelsFor(["loss"])[0], [{ run, color: "#000" }], { smoothing: 0.5, xMode: "relative" });
  const raw = series.find((s) => s.id === "r|loss|raw");
  const sm = series.find((s) => s.id === "r|loss|smooth");
  assert.ok(raw.lineStyle.opacity < 0.5);
  assert.deepEqual(sm.data.map((p) => p[0]), [1, 2]); // ts 101, 102 minus start 100
  assert.equal(sm.data[0][1], 1);
  assert.ok(Math.abs(sm.data[1][1] - (0.25 * 1 + 0.5 * 3) / 0.75) < 1e-12);
});

test("formatValue names non-finite values", () => {
  assert.equal(formatValue(NaN), "NaN");
  assert.equal(formatValue(-Infinity), "-Infinity");
  assert.equal(formatValue(0.000012346), "1.235e-5");
  assert.equal(formatValue(12), "12");
  assert.equal(formatValue(undefined), "—");
});

test("formatValue trims exponent mantissas", () => {
  assert.equal(formatValue(0.0008), "8e-4");
  assert.equal(formatValue(0.00081), "8.1e-4");
  assert.equal(formatValue(25000000.5), "2.5e+7");
});

test("long curves are drawn decimated to the pixel budget, spikes and NaN kept; a window shows its own points", () => {
  const recs = [];
  for (let s = 1; s <= 5000; s++) recs.push({ step: s, loss: 1 + 0.01 * Math.sin(s), grad_norm: s === 2345 ? 99 : 1 + 0.01 * Math.cos(s) });
  recs[3999].loss = "NaN";
  const run = runWith(recs);
  const panels = panelsFor(run.fields());
  const norm = panels.find((p) => p.id === "grad_norm");
  const all = buildSeries(norm, [{ run, color: "#000" }], { maxPoints: 400 });
  const raw = all.series.find((s) => s.id === "r|grad_norm|raw").data;
  assert.ok(raw.length <= 400 && raw.length > 100, String(raw.length));
  assert.ok(raw.some((p) => p[2] === 2345 && p[1] === 99));
  const loss = buildSeries(panels[0], [{ run, color: "#000" }], { maxPoints: 400, smoothing: 0.5 });
  const lraw = loss.series.find((s) => s.id === "r|loss|raw").data;
  assert.ok(lraw.some((p) => p[2] === 4000 && p[1] === null)); // the NaN step is still there
  assert.ok(loss.series.find((s) => s.id === "r|loss|smooth").data.length <= 400);
  assert.equal(loss.markerPoints, 1);
  // zoomed to [1000, 1100]: every step of the window (plus a margin) at full resolution
  const win = buildSeries(norm, [{ run, color: "#000" }], { maxPoints: 400, window: { startValue: 1000, endValue: 1100 } });
  const steps = win.series.find((s) => s.id === "r|grad_norm|raw").data.map((p) => p[2]);
  for (let s = 1000; s <= 1100; s++) assert.ok(steps.includes(s));
  assert.ok(steps.length < 200);
});

test("the x extent spans every run in each x mode; an empty run adds nothing, one step gets a width", () => {
  const a = runWith([{ step: 3, loss: 1 }, { step: 9, loss: 1 }]);
  const b = runWith([{ step: 5, loss: 1 }, { step: 20, loss: 1 }]);
  const empty = new RunData("e");
  assert.deepEqual(xExtent([a, b, empty], "step"), { min: 3, max: 20 });
  assert.deepEqual(xExtent([a], "relative"), { min: 3, max: 9 }); // ts = 100 + step, start_time 100
  assert.deepEqual(xExtent([a, b], "wall"), { min: 103000, max: 120000 });
  assert.deepEqual(xExtent([empty], "step"), { min: null, max: null });
  assert.deepEqual(xExtent([runWith([{ step: 7, loss: 1 }])], "step"), { min: 7, max: 8 });
});

test("a rollback is a dashed line and a pin at the restored step on every chart, its message in the tooltip", () => {
  const { tooltipRows } = require("../src/lib/tooltip.js");
  const run = new RunData("r");
  run.ingestRecord({ type: "header", schema: 1, start_time: 100 });
  for (let s = 1; s <= 25; s++) run.ingestRecord({ type: "step", step: s, ts: 100 + s, loss: s === 25 ? "NaN" : 2 - s / 50 });
  run.ingestRecord({ type: "end", status: "rolled_back", steps: 25 });
  run.ingestRecord({ type: "header", schema: 1, start_time: 130, initial_step: 20, initial_step_from: "rollback" });
  const message = "rolled back to the snapshot after step 20: alarm (nonfinite) from step 25; 7 batches skipped";
  run.ingestRecord({ type: "event", kind: "rollback", step: 20, restored_step: 20, from_step: 25, reason: "alarm", message });
  for (let s = 21; s <= 30; s++) run.ingestRecord({ type: "step", step: s, ts: 110 + s, loss: 1.6 - s / 100 });
  assert.deepEqual(run.rollbacks().map((e) => e.step), [20]);
  const { series } = buildSeries(panelsFor(run.fields())[0], [{ run, color: "#000" }], { xMode: "step" });
  const rb = series.find((s) => s.gradmonRole === "rollback");
  assert.deepEqual(rb.data.map((d) => d.value), [[20, 2 - 20 / 50, 20]]);
  assert.deepEqual(rb.markLine.data, [{ xAxis: 20 }]);
  // The tooltip at step 20 names the rollback with its message.
  const raw = series.find((s) => s.id === "r|loss|raw");
  const at20 = raw.data.find((p) => p[2] === 20);
  const rows = tooltipRows([{ seriesId: raw.id, data: at20 }, { seriesId: rb.id, data: rb.data[0] }]);
  assert.deepEqual(rows[0].marks, ["rollback (" + message + ")"]);
  // Steps 21-25 of the first segment are replaced: one value per step, none non-finite.
  assert.deepEqual(run.view("loss").steps.length, 30);
});

test("grad-norm chart: one max_norm line for the runs that share a max_norm, one per value otherwise", () => {
  const recs = [{ step: 1, grad_norm: 1 }, { step: 2, grad_norm: 1.5 }];
  const runs = ["a", "b", "c"].map((name, k) => {
    const run = new RunData(name);
    run.ingestRecord({ type: "header", schema: 1, start_time: 100, max_norm: k === 2 ? 5.0 : 2.0 });
    for (const r of recs) run.ingestRecord(Object.assign({ type: "step", ts: 100 + r.step }, r));
    return { run, color: ["#111", "#222", "#333"][k] };
  });
  const panel = panelsFor(["grad_norm"]).find((p) => p.id === "grad_norm");
  const lines = buildSeries(panel, runs, {}).series.filter((s) => s.markLine).map((s) => [s.id, s.markLine.data[0].yAxis, s.markLine.lineStyle.color]);
  assert.deepEqual(lines, [["a|grad_norm|raw", 2.0, "#111"], ["c|grad_norm|raw", 5.0, "#333"]]);
});
