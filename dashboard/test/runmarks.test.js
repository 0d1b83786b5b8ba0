"use strict";
// RunMarks (lib/runmarks.js) alone, and runload.js's answers through RunData: marks, events and
// their segments, without curves.
const test = require("node:test");
const assert = require("node:assert/strict");
const { RunMarks } = require("../src/lib/runmarks.js");
const { SegmentCover } = require("../src/lib/segments.js");
const { RunData } = require("../src/lib/rundata.js");

test("one spike/skip mark per step, non-finite marks per field, sources merged", () => {
  const m = new RunMarks(new SegmentCover());
  m.add("spike", 5, "grad_norm", 9.5, "cell");
  m.add("spike", 5, "grad_norm", undefined, "server");
  m.add("nonfinite", 7, "loss", NaN, "cell");
  m.add("nonfinite", 7, "grad_norm", Infinity, "cell");
  m.add("skip", 9, "grad_norm", 1, "cell", "overflow");
  assert.equal(m.marks.size, 4);
  assert.deepEqual(m.of("spike")[0].sources, ["cell", "server"]);
  assert.equal(m.of("spike")[0].value, 9.5);
  assert.deepEqual(m.of("nonfinite").map((x) => x.field).sort(), ["grad_norm", "loss"]);
  assert.ok(m.overflowAt(9) && !m.overflowAt(5));
  assert.ok(m.flagged(5) && m.flagged(9) && !m.flagged(7));
  assert.ok(m.hasFlags());
});

test("an alarm arrives once however often it is sent; events from a mark kind mark the step", () => {
  const m = new RunMarks(new SegmentCover());
  const alarm = { type: "event", kind: "alarm", step: 12, reason: "grad_norm_spike", incident: 1, ts: 3 };
  m.addEvent(alarm);
  m.addEvent({ ...alarm });
  m.addEvent({ type: "event", kind: "skip", step: 13, reason: "spike", grad_norm: 40 });
  assert.equal(m.alarmEvents.length, 1);
  assert.equal(m.events.length, 1);
  assert.equal(m.of("skip")[0].step, 13);
  assert.ok(m.flagged(13));
});

test("a newer segment replaces older segments' marks and events in its range only", () => {
  const seg = new SegmentCover();
  const m = new RunMarks(seg);
  seg.newSegment();
  m.add("spike", 4, "grad_norm", 1, "cell");
  m.add("spike", 20, "grad_norm", 1, "cell");
  m.addEvent({ type: "event", kind: "alarm", step: 5, reason: "nonfinite", incident: 1 });
  seg.newSegment();
  m.add("spike", 6, "grad_norm", 1, "cell"); // the new segment's own mark stays
  m.replaceRange(3, 10);
  assert.deepEqual(m.of("spike").map((x) => x.step), [6, 20]);
  assert.equal(m.alarmEvents.length, 0);
  assert.ok(!m.flagged(4) && m.flagged(20));
});

test("a history answer loads curves and marks; a zoom window is kept beside them", () => {
  const run = new RunData("r");
  run.loadHistory({
    cursor: { gen: "g", offset: 10 },
    series: { loss: { step: [1, 2, 3], value: [1, "NaN", 0.5] }, grad_norm: { step: [1, 2, 3], value: [2, 3, 4] } },
    marks: [{ kind: "spike", step: 3, field: "grad_norm", value: 4 }],
    headers: [{ type: "header", run_id: "a", start_time: 1 }],
    events: [{ type: "event", kind: "alarm", step: 2, reason: "nonfinite", incident: 1 }],
    malformed: 2,
  });
  assert.deepEqual(run.fields().sort(), ["grad_norm", "loss"]);
  assert.equal(run.marksOf("nonfinite")[0].step, 2);
  assert.ok(run.flagged(3));
  assert.equal(run.alarmEvents.length, 1);
  assert.equal(run.malformed, 2);
  run.setDetail({ start: 2, end: 3, series: { loss: { step: [2, 3], value: [0.9, 0.4] } } }, 2);
  assert.deepEqual(run.view("loss").values.slice(-2), [0.9, 0.4]);
  run.setDetail(null);
  assert.equal(run.detail, null);
});
