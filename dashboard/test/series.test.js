"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const { Series, spliceWindow } = require("../src/lib/series.js");
const { RunData } = require("../src/lib/rundata.js");

function history(steps, extra) {
  return Object.assign(
    {
      run: "r",
      cursor: { gen: "g1", offset: 1000 },
      exact: false,
      start: steps[0],
      end: steps[steps.length - 1],
      series: {
        loss: { step: steps, value: steps.map((s) => 1 / s) },
        grad_norm: { step: steps, value: steps.map(() => 1) },
        ts: { step: steps, value: steps.map((s) => 1000 + s) },
      },
      eval: { loss: { step: [50], value: [0.5] } },
      marks: [],
      events: [],
      headers: [{ type: "header", schema: 1, start_time: 999.5, max_norm: 1.0 }],
    },
    extra || {},
  );
}

const step = (s, fields) => Object.assign({ type: "step", step: s, ts: 1000 + s, loss: 1 / s, grad_norm: 1 }, fields || {});

test("history then live records merge by step with no duplicate", () => {
  const run = new RunData("r");
  run.loadHistory(history([1, 10, 20, 40, 60, 80, 100]));
  assert.equal(run.pointCount("loss"), 7);
  assert.equal(run.exact, false);
  assert.deepEqual(run.cursor, { gen: "g1", offset: 1000 });
  // a resubscribe race replays steps 95..100 before the new ones
  for (let s = 95; s <= 110; s++) run.ingestRecord(step(s));
  const loss = run.series.get("loss");
  assert.deepEqual(loss.steps, [1, 10, 20, 40, 60, 80, 95, 96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110]);
  assert.equal(new Set(loss.steps).size, loss.steps.length);
  // a record seen twice replaces itself
  run.ingestRecord(step(110, { loss: 7 }));
  assert.equal(run.pointCount("loss"), 22);
  assert.equal(loss.values[loss.length - 1], 7);
  assert.equal(run.lastStep, 110);
  assert.equal(run.maxNorm, 1.0);
  assert.equal(run.pointCount("eval/loss"), 1);
});

test("wire records with non-finite strings become values and marks", () => {
  const run = new RunData("r");
  run.ingestRecord(step(1));
  run.ingestRecord({ type: "step", step: 2, loss: "NaN", grad_norm: "Infinity", nonfinite: true, skipped: true });
  assert.ok(Number.isNaN(run.valueAt("loss", 2).value));
  assert.equal(run.valueAt("grad_norm", 2).value, Infinity);
  const nf = run.marksOf("nonfinite");
  assert.deepEqual(nf.map((m) => m.field).sort(), ["grad_norm", "loss"]);
  assert.equal(run.marksOf("skip").length, 1);
  // flags are not curves
  assert.deepEqual(run.fields().sort(), ["grad_norm", "loss"]);
});

test("history series values arrive as strings and are decoded; server marks kept", () => {
  const h = history([1, 2, 3]);
  h.series.loss.value = [1, "NaN", "-Infinity"];
  h.marks = [{ step: 3, kind: "spike", field: "grad_norm", value: "Infinity" }];
  const run = new RunData("r");
  run.loadHistory(h);
  const v = run.series.get("loss").values;
  assert.ok(Number.isNaN(v[1]));
  assert.equal(v[2], -Infinity);
  assert.equal(run.marksOf("nonfinite").length, 2);
  assert.equal(run.marksOf("spike")[0].value, Infinity);
});

test("marks are the writer's flags, events and non-finite values only: no rule of the page's own", () => {
  const run = new RunData("r");
  for (let s = 1; s <= 30; s++) run.ingestRecord(step(s, { grad_norm: 1 + (s % 3) * 0.01 }));
  run.ingestRecord(step(31, { grad_norm: 20 })); // extreme, but not flagged: no mark
  run.ingestRecord(step(32, { grad_norm: 1.5, spike: true })); // cell flag, not extreme
  run.ingestRecord({ type: "event", kind: "spike", step: 33, ts: 1, grad_norm: 2.0, message: "spike" });
  run.ingestRecord(step(34, { nonfinite: true, skipped: true })); // flags without a non-finite value
  assert.deepEqual(run.marksOf("spike").map((m) => [m.step, m.sources[0]]), [[32, "cell"], [33, "event"]]);
  assert.deepEqual(run.marksOf("skip").map((m) => m.step), [34]);
  assert.deepEqual(run.marksOf("nonfinite").map((m) => [m.step, m.field]), [[34, "grad_norm"]]);
  assert.equal(run.flagged(32), true);
  assert.equal(run.flagged(31), false);
  // replaying step 32 does not create a second mark
  run.ingestRecord(step(32, { grad_norm: 1.5, spike: true }));
  assert.equal(run.marksOf("spike").length, 2);
});

test("a resumed run rolled back: the new segment replaces the steps it covers, later old steps stay", () => {
  const run = new RunData("r");
  const hdr = (id) => ({ type: "header", schema: 1, run_id: id, start_time: 100 });
  run.ingestRecord(hdr("a"));
  for (let s = 1; s <= 40; s++) {
    run.ingestRecord(step(s, { loss: 1, spike: s === 15 || s === 30, clip_coef: s === 15 || s === 25 ? 0.5 : undefined }));
    if (s === 15 || s === 30) run.ingestRecord({ type: "event", kind: "note", step: s });
  }
  run.ingestRecord({ type: "eval", step: 20, loss: 0.9 });
  run.ingestRecord({ type: "eval", step: 35, loss: 0.8 });
  run.ingestRecord(hdr("b")); // resumed from the step-10 checkpoint, 10 steps trained again
  for (let s = 11; s <= 20; s++) run.ingestRecord(step(s, { loss: 2 }));
  const loss = run.series.get("loss");
  assert.deepEqual(loss.steps, Array.from({ length: 40 }, (_, i) => i + 1));
  assert.deepEqual(loss.values, [...Array(10).fill(1), ...Array(10).fill(2), ...Array(20).fill(1)]);
  assert.deepEqual(run.series.get("eval/loss").steps, [35]); // the old eval at step 20 is replaced
  assert.deepEqual(run.series.get("clip_coef").steps, [25]); // a field only the old segment wrote goes too
  assert.deepEqual(run.marksOf("spike").map((m) => m.step), [30]); // its spike at 15 goes, 30 stays
  assert.deepEqual(run.events.map((e) => e.step), [30]);
  assert.equal(run.headers.length, 2);
  // the same header re-sent (a resubscribe overlap) is not a new segment: nothing more is replaced
  run.ingestRecord(hdr("b"));
  run.ingestRecord(step(15, { loss: 2 }));
  assert.equal(run.pointCount("loss"), 40);
  assert.equal(run.headers.length, 2);
  // a resume from the old run's end continues the numbering: nothing is replaced
  run.ingestRecord(hdr("c"));
  run.ingestRecord(step(41, { loss: 3 }));
  assert.equal(run.pointCount("loss"), 41);
  assert.deepEqual(run.marksOf("spike").map((m) => m.step), [30]);
});

test("flagged steps follow the marks: added live, dropped by a rollback, gone after a reset", () => {
  const run = new RunData("r");
  const hdr = (id) => ({ type: "header", schema: 1, run_id: id, start_time: 100 });
  run.ingestRecord(hdr("a"));
  for (let s = 1; s <= 20; s++) run.ingestRecord(step(s, { spike: s === 5 || s === 15 }));
  assert.equal(run.hasFlags(), true);
  assert.deepEqual([5, 6, 15].map((s) => run.flagged(s)), [true, false, true]); // (the set is built here)
  run.ingestRecord(step(21, { nonfinite: true, skipped: true })); // a skip added after it was built
  assert.equal(run.flagged(21), true);
  run.ingestRecord(hdr("b")); // resumed from step 10: the old spike at 15 goes, 5 stays
  for (let s = 11; s <= 16; s++) run.ingestRecord(step(s));
  assert.deepEqual([5, 15, 21].map((s) => run.flagged(s)), [true, false, true]);
  const version = run.version;
  run.reset();
  assert.equal(run.hasFlags(), false);
  assert.equal(run.flagged(5), false);
  assert.ok(run.version > version, "a reset never repeats an earlier version (redraw keys)");
});

test("a rollback under way in the history: live steps go on replacing from the latest segment's last step", () => {
  const steps = Array.from({ length: 40 }, (_, i) => i + 1);
  const h = history(steps, {
    exact: true,
    headers: [{ type: "header", run_id: "a", start_time: 1 }, { type: "header", run_id: "b", start_time: 2 }],
    latest_segment: { first_step: 11, last_step: 15 }, // b rolled back to 10, trained 11-15 so far
    marks: [{ step: 17, kind: "spike", field: "grad_norm", value: 9 }, { step: 30, kind: "spike", field: "grad_norm", value: 8 }],
    events: [{ type: "event", kind: "spike", step: 17 }, { type: "event", kind: "note", step: 30 }],
  });
  const run = new RunData("r");
  run.loadHistory(h);
  // b's event for step 18 comes before its step record: it is b's own, and stays
  run.ingestRecord({ type: "event", kind: "skip", step: 18, reason: "overflow", grad_norm: "Infinity" });
  for (const s of [16, 17, 18]) run.ingestRecord(step(s, { loss: 5 }));
  assert.deepEqual(run.marksOf("spike").map((m) => m.step), [30]); // a's spike at 17 is replaced
  assert.deepEqual(run.marksOf("skip").map((m) => [m.step, m.reason]), [[18, "overflow"]]);
  assert.deepEqual(run.events.map((e) => e.step), [30, 18]);
  assert.deepEqual(run.series.get("loss").values.slice(14, 19), [1 / 15, 5, 5, 5, 1 / 19]);
  assert.equal(run.pointCount("loss"), 40);
});

test("a loss-scale overflow is a skip mark, not a non-finite one (live, replayed and from history)", () => {
  const run = new RunData("r");
  run.ingestRecord(step(1));
  run.ingestRecord(step(2, { grad_norm: "Infinity", grad_norm_local: "NaN", loss_scale: 65536, skipped: true, skip_reason: "overflow" }));
  run.ingestRecord(step(3, { loss: "NaN", grad_norm: "Infinity", skipped: true, skip_reason: "overflow" })); // a NaN loss stays one
  assert.deepEqual(run.marksOf("skip").map((m) => [m.step, m.reason]), [[2, "overflow"], [3, "overflow"]]);
  assert.deepEqual(run.marksOf("nonfinite").map((m) => [m.step, m.field]), [[3, "loss"]]);
  assert.equal(run.overflowAt(2), true);
  assert.equal(run.overflowAt(1), false);
  assert.equal(run.valueAt("grad_norm", 2).value, Infinity); // the norm as measured is kept

  const h = history([1, 2, 3]);
  h.series.grad_norm.value = [1, "Infinity", "NaN"];
  h.marks = [{ step: 2, kind: "skip", field: "grad_norm", value: "Infinity", reason: "overflow" },
    { step: 3, kind: "nonfinite", field: "grad_norm", value: "NaN" }];
  const loaded = new RunData("r");
  loaded.loadHistory(h);
  assert.deepEqual(loaded.marksOf("nonfinite").map((m) => m.step), [3]);
  assert.deepEqual(loaded.marksOf("skip").map((m) => [m.step, m.reason]), [[2, "overflow"]]);
});

test("a replayed file applies the same rules as the server (rollback and overflow)", () => {
  const { parseJsonl } = require("../src/lib/jsonl.js");
  const lines = ['{"type":"header","run_id":"a","start_time":1}'];
  for (let s = 1; s <= 30; s++) lines.push(JSON.stringify({ type: "step", step: s, loss: 1 }));
  lines.push('{"type":"header","run_id":"b","start_time":2}');
  for (let s = 6; s <= 10; s++) lines.push(JSON.stringify({ type: "step", step: s, loss: 2 }));
  lines.push('{"type":"step","step":11,"loss":2,"grad_norm":Infinity,"skipped":true,"skip_reason":"overflow"}');
  const run = new RunData("r");
  for (const r of parseJsonl(lines.join("\n") + "\n", { final: true }).records) run.ingestRecord(r);
  const loss = run.series.get("loss");
  assert.deepEqual(loss.steps, Array.from({ length: 30 }, (_, i) => i + 1));
  assert.deepEqual(loss.values, [...Array(5).fill(1), ...Array(6).fill(2), ...Array(19).fill(1)]);
  assert.deepEqual(run.marksOf("skip").map((m) => [m.step, m.reason]), [[11, "overflow"]]);
  assert.equal(run.marksOf("nonfinite").length, 0);
});

test("alarm events are kept apart from the other events (never pushed out by them)", () => {
  const run = new RunData("r");
  run.ingestRecord({ type: "event", kind: "alarm", step: 5, reason: "nonfinite" });
  for (let i = 0; i < 1500; i++) run.ingestRecord({ type: "event", kind: "spike", step: 10 + i });
  run.ingestRecord({ type: "event", kind: "alarm_end", step: 9, start: 5, flagged: 2 });
  assert.deepEqual(run.alarmEvents.map((e) => e.kind), ["alarm", "alarm_end"]);
  assert.equal(run.events.length, 1000);
});

test("memory is bounded: over the cap old points are decimated, spikes and NaN kept", () => {
  const run = new RunData("r", { cap: 1000 });
  for (let s = 1; s <= 5000; s++) {
    const f = {};
    if (s === 123) f.grad_norm = 40;
    if (s === 456) f.loss = "NaN";
    if (s === 789) Object.assign(f, { spike: true, grad_norm: 1.01 });
    run.ingestRecord(step(s, f));
  }
  const g = run.series.get("grad_norm");
  assert.ok(g.length <= 1000, String(g.length));
  assert.ok(g.length >= 500);
  assert.equal(g.steps[g.length - 1], 5000);
  assert.equal(run.valueAt("grad_norm", 123).value, 40);
  assert.ok(run.valueAt("grad_norm", 789).exact); // flagged step kept though not extreme
  assert.ok(Number.isNaN(run.valueAt("loss", 456).value));
  for (let i = 1; i < g.length; i++) assert.ok(g.steps[i] > g.steps[i - 1]);
  assert.equal(run.exact, false); // decimated: no longer every step
});

test("a zoom window replaces the base points inside its range only", () => {
  const run = new RunData("r");
  run.loadHistory(history([1, 10, 20, 30, 40]));
  run.setDetail({ start: 10, end: 20, exact: true, series: { loss: { step: [10, 11, 12, 20], value: [5, 6, 7, 8] } } });
  const v = run.view("loss");
  assert.deepEqual(v.steps, [1, 10, 11, 12, 20, 30, 40]);
  assert.deepEqual(v.values.slice(1, 5), [5, 6, 7, 8]);
  assert.deepEqual(run.view("grad_norm").steps, [1, 10, 20, 30, 40]); // no window for it
  run.setDetail(null);
  assert.deepEqual(run.view("loss").steps, [1, 10, 20, 30, 40]);
  assert.deepEqual(spliceWindow([1, 2, 3], [1, 2, 3], null).steps, [1, 2, 3]);
});

test("wall time of a step is interpolated from known times; inverse too", () => {
  const run = new RunData("r");
  run.loadHistory(history([1, 11, 21]));
  assert.equal(run.tsAt(11), 1011);
  assert.equal(run.tsAt(16), 1016);
  assert.equal(run.tsAt(31), 1031);
  assert.equal(run.startTime, 999.5);
  assert.equal(run.stepAtTs(1016), 16);
});

test("loadHistory (after reset/lagged) replaces earlier data", () => {
  const run = new RunData("r");
  for (let s = 1; s <= 10; s++) run.ingestRecord(step(s));
  run.loadHistory(history([1, 2]));
  assert.equal(run.pointCount("loss"), 2);
});

test("Series.setAll sorts and deduplicates", () => {
  const s = new Series();
  s.setAll([3, 1, 2, 3], [30, 10, 20, 31]);
  assert.deepEqual(s.steps, [1, 2, 3]);
  assert.deepEqual(s.values, [10, 20, 31]);
  s.put(2.5, 25);
  assert.deepEqual(s.steps, [1, 2, 2.5, 3]);
  assert.deepEqual(s.nearest(2.9), { step: 3, value: 31 });
});

test("unknown record types and invalid records are ignored", () => {
  const run = new RunData("r");
  assert.equal(run.ingestRecord({ type: "future_thing", x: 1 }), false);
  assert.equal(run.ingestRecord({ type: "step", step: "x" }), false);
  assert.equal(run.skippedLines, 1);
  assert.equal(run.ingestRecord({ type: "end", status: "finished", ts: 1 }), true);
  assert.equal(run.ended.status, "finished");
});

test("records of other writers: no type but an integer step is a step", () => {
  const run = new RunData("r");
  assert.equal(run.ingestRecord({ step: 1, loss: 2, lr: 0.1 }), true);
  assert.equal(run.valueAt("loss", 1).value, 2);
  assert.equal(run.ingestRecord({ loss: 2 }), false);
});

test("smoothing is exact over every step held, or marked approximate over downsampled points", () => {
  const { emaDebiased } = require("../src/lib/smoothing.js");
  const steps = Array.from({ length: 400 }, (_, i) => i + 1);
  const full = history(steps, { exact: true });
  const run = new RunData("r");
  run.loadHistory(full);
  const sm = run.smoothed("loss", 0.9);
  assert.equal(sm.quality, "exact");
  assert.deepEqual(sm.values, emaDebiased(steps.map((s) => 1 / s), 0.9));
  const down = new RunData("d");
  down.loadHistory(history(steps.filter((s) => s % 10 === 1)));
  assert.equal(down.smoothed("loss", 0.9).quality, "approx");
  // a zoom window fetched with enough lead-in is trusted from its smoothFrom step on
  down.setDetail({ start: 100, end: 400, exact: true, series: { loss: { step: steps.slice(99), value: steps.slice(99).map((s) => 1 / s) } } }, 200);
  assert.equal(down.smoothed("loss", 0.9).quality, "lead-in"); // 100 >= 10/(1-0.9) steps
  assert.equal(down.smoothed("loss", 0.9).steps[0], 200);
  assert.equal(down.smoothed("loss", 0.99).quality, "approx"); // needs 1000 steps of lead-in
  down.setDetail({ start: 1, end: 400, exact: true, series: { loss: { step: steps, value: steps.map((s) => 1 / s) } } }, 1);
  assert.equal(down.smoothed("loss", 0.99).quality, "exact"); // from the first step: no lead-in needed
});
