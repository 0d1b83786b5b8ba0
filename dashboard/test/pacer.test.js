"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const { RedrawPacer, passOrder, inViewport, REDRAW } = require("../src/lib/pacer.js");

test("pacer: passes start at most every minGapMs, whoever asks", () => {
  const p = new RedrawPacer({ minGapMs: 100, streamLoad: 3 });
  assert.equal(p.due(0, true), 0); // nothing drawn yet: now
  p.started(1000);
  p.ended(1005, 5);
  assert.equal(p.due(1010, false), 1100);
  assert.equal(p.due(1010, true), 1100); // 3 x 5 ms after the end is sooner than the gap
  assert.equal(p.due(1200, false), 1200);
});

test("pacer: a streaming pass waits streamLoad x the last pass's script time after it ended", () => {
  const p = new RedrawPacer({ minGapMs: 100, streamLoad: 3 });
  p.started(0);
  p.ended(80, 60); // a 60 ms pass spread over slices
  assert.equal(p.due(90, true), 80 + 180);
  assert.equal(p.due(90, false), 100); // the reader's action does not wait for the stream's share
  // The streaming share of the main thread stays <= 1 / (1 + streamLoad) whatever a pass costs.
  for (const work of [1, 10, 100, 1000]) {
    p.started(0);
    p.ended(work, work);
    const next = p.due(work, true);
    assert.ok(work / next <= 1 / (1 + 3) + 1e-9, `work ${work} ms, next pass at ${next}`);
  }
});

test("pacer: a streaming pass's slice ends once it used sliceMs; the reader's pass is one slice", () => {
  const p = new RedrawPacer({ sliceMs: 8 });
  assert.equal(p.sliceDone(100, 104, true), false);
  assert.equal(p.sliceDone(100, 108, true), true);
  assert.equal(p.sliceDone(100, 1000, false), false);
  // Once the charts in the viewport are drawn, a slice stops (they are painted before the others).
  assert.equal(p.sliceDone(100, 101, false, true), true);
  assert.equal(p.sliceDone(100, 101, true, true), true);
  assert.equal(p.sliceDone(100, 1000, false, false), false);
  assert.equal(new RedrawPacer().sliceMs, REDRAW.SLICE_MS);
  p.ended(10, -3); // a clock step back never makes a negative cost
  assert.equal(p.lastWorkMs, 0);
});

test("passOrder: charts in the viewport first, then the others near it, each top to bottom", () => {
  const items = [
    { id: "below", top: 950, bottom: 1250 },
    { id: "b", top: 400, bottom: 700 },
    { id: "above", top: -400, bottom: -100 },
    { id: "a", top: -50, bottom: 250 },
    { id: "c", top: 800, bottom: 1100 },
  ];
  assert.deepEqual(passOrder(items, 900).map((it) => it.id), ["a", "b", "c", "above", "below"]);
  assert.deepEqual(passOrder([], 900), []);
  assert.equal(items[0].id, "below"); // the input is left as it was
  assert.deepEqual(items.map((it) => inViewport(it, 900)), [false, true, false, true, true]);
  assert.equal(inViewport({ top: 900, bottom: 1200 }, 900), false); // starts at the viewport's bottom edge
  assert.equal(inViewport({ top: -300, bottom: 0 }, 900), false); // ends at its top edge
});
