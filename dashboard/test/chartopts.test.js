"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const { RunData } = require("../src/lib/series.js");
const { panelsFor, buildSeries, formatValue } = require("../src/lib/chartopts.js");

function runWith(records, opts) {
  const run = new RunData("r", opts);
  run.ingestRecord({ type: "header", schema: 1, start_time: 100, max_norm: 2.0 });
  for (const r of records) run.ingestRecord(Object.assign({ type: "step", ts: 100 + r.step }, r));
  return run;
}

test("panels: known fields first in a fixed order, then the rest, eval/system last", () => {
  const ids = panelsFor(["zscore", "grad_norm", "eval/accuracy", "loss", "my_metric", "lr", "eval/loss", "system/cpu_percent"])
    .map((p) => p.id);
  assert.deepEqual(ids, ["loss", "grad_norm", "lr", "my_metric", "zscore", "eval/accuracy", "system/cpu_percent"]);
  assert.deepEqual(panelsFor(["eval/loss"]).map((p) => p.id), ["loss"]);
});

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

test("grad-norm chart: spikes ringed, max_norm line, log scale hides non-positive values", () => {
  const recs = [];
  for (let s = 1; s <= 20; s++) recs.push({ step: s, grad_norm: s === 15 ? 30 : s === 3 ? 0 : 1 });
  const run = runWith(recs, { spikeRule: { k: 5, window: 10, minHistory: 5 } });
  const panel = panelsFor(run.fields()).find((p) => p.id === "grad_norm");
  const { series, log } = buildSeries(panel, [{ run, color: "#000" }], { log: true });
  assert.equal(log, true);
  const spikes = series.find((s) => s.gradmonRole === "spike");
  assert.deepEqual(spikes.data.map((d) => d.value), [[15, 30, 15]]);
  const raw = series.find((s) => s.id === "r|grad_norm|raw");
  assert.equal(raw.data[2][1], null); // 0 on a log axis
  assert.equal(raw.markLine.data[0].yAxis, 2.0);
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
  const run = runWith(recs, { spikeRule: { k: 1e9 } });
  const panels = panelsFor(run.fields());
  const norm = panels.find((p) => p.id === "grad_norm");
  const all = buildSeries(norm, [{ run, color: "#000" }], { maxPoints: 400 });
  const raw = all.series.find((s) => s.id === "r|grad_norm|raw").data;
  assert.ok(raw.length <= 400 && raw.length > 100, String(raw.length));
  assert.ok(raw.some((p) => p[2] === 2345 && p[1] === 99));
  const loss = buildSeries(panels[0], [{ run, color: "#000" }], { maxPoints: 400, smoothing: 0.5 });
  const lraw = loss.series.find((s) => s.id === "r|loss|raw").data;
  assert.ok(lraw.some((p) => p[2] === 4000 && p[1] === null)); // the NaN step is still there
  assert.equal(loss.series.find((s) => s.id === "r|loss|smooth").data.length, lraw.length);
  assert.equal(loss.markerPoints, 1);
  // zoomed to [1000, 1100]: every step of the window (plus a margin) at full resolution
  const win = buildSeries(norm, [{ run, color: "#000" }], { maxPoints: 400, window: { startValue: 1000, endValue: 1100 } });
  const steps = win.series.find((s) => s.id === "r|grad_norm|raw").data.map((p) => p[2]);
  for (let s = 1000; s <= 1100; s++) assert.ok(steps.includes(s));
  assert.ok(steps.length < 200);
});
