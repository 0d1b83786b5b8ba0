"use strict";
// What the page asks for as it opens (lib/opening.js): boot/early.js and the page decide alike.
const test = require("node:test");
const assert = require("node:assert/strict");
const O = require("../src/lib/opening.js");

test("chart width in the grid: 440 px columns with 12 px gaps, less the card's padding", () => {
  assert.equal(O.chartWidthIn(1368), 432); // 1400 px window: three columns of 448
  assert.equal(O.chartWidthIn(900), 428); // two columns
  assert.equal(O.chartWidthIn(0), O.chartWidthIn(900)); // not laid out yet: 900 assumed
  assert.equal(O.chartWidthIn(300), 284); // one column, the whole width
  assert.equal(O.chartWidthIn(100), 240); // never narrower than 240
});

test("history points: the URL's points=N (N >= 4), else what the charts draw per pixel, within [200, 8000]", () => {
  assert.equal(O.historyPoints(432, NaN), 864);
  assert.equal(O.historyPoints(50, NaN), 200);
  assert.equal(O.historyPoints(9000, NaN), 8000);
  assert.equal(O.historyPoints(432, 5000.4), 5000);
  assert.equal(O.historyPoints(432, 3), 864); // too few to draw: ignored
  // what the charts draw: two points per pixel for one run, one each for several
  assert.equal(O.historyPoints(432, NaN, 1), 864);
  assert.equal(O.historyPoints(432, NaN, 4), 432);
  assert.equal(O.historyPoints(432, 5000, 4), 5000); // the URL's points= still wins
  assert.deepEqual([0, 1, 2, 10].map(O.pointsPerPixel), [2, 2, 1, 1]);
});

test("opening plan: the named runs, token, points; early requests only without smoothing", () => {
  assert.deepEqual(O.openingPlan(""), { token: null, named: null, smoothing: 0, points: NaN, early: true });
  const p = O.openingPlan("?token=t0k&run=b&run=a&points=300&x=wall");
  assert.deepEqual([p.token, p.named, p.points, p.early], ["t0k", ["b", "a"], 300, true]);
  assert.equal(O.openingPlan("?smooth=0.6").early, false);
  assert.deepEqual(O.openingPlan("?run=").named, []); // run= alone: none shown
});

test("runs asked for once the list is in: the named runs it has, or the newest ten; none with smoothing", () => {
  const infos = Array.from({ length: 12 }, (_, i) => ({ name: "r" + i, first_ts: 100 + i }));
  assert.deepEqual(O.runsAfterList(O.openingPlan(""), infos), ["r11", "r10", "r9", "r8", "r7", "r6", "r5", "r4", "r3", "r2"]);
  assert.deepEqual(O.runsAfterList(O.openingPlan("?run=r3&run=gone&run=r1"), infos), ["r3", "r1"]);
  assert.deepEqual(O.runsAfterList(O.openingPlan("?smooth=0.5"), infos), []);
  assert.deepEqual(O.runsAfterList(O.openingPlan(""), null), []);
});

test("API URLs: run names' segments encoded, the token added, absent parameters left out", () => {
  assert.equal(O.runPath("sweep/a b#1", "/history"), "/api/runs/sweep/a%20b%231/history");
  assert.equal(O.apiUrl("http://h:1/x/?run=a", "/api/runs", null, null), "http://h:1/api/runs");
  assert.equal(O.apiUrl("http://h:1/", "/api/runs/a/history", { points: 864, start: undefined, end: null }, "t&k"),
    "http://h:1/api/runs/a/history?points=864&token=t%26k");
});
