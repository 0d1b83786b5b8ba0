"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const { quantile, autoLog, yRange, clippedStretches } = require("../src/lib/yaxis.js");

// Deterministic noise: a fixed linear congruential sequence mapped to roughly N(0, 1).
function noise(n, seed) {
  let x = seed || 1;
  const out = [];
  for (let i = 0; i < n; i++) {
    let s = 0;
    for (let k = 0; k < 12; k++) {
      x = (x * 1103515245 + 12345) % 2147483648;
      s += x / 2147483648;
    }
    out.push(s - 6);
  }
  return out;
}

test("quantile interpolates linearly", () => {
  assert.equal(quantile([1, 2, 3, 4], 0.5), 2.5);
  assert.equal(quantile([5], 0.9), 5);
  assert.ok(Number.isNaN(quantile([], 0.5)));
});

test("auto log: a diverged run spanning four decades turns it on; a lone spike or a zero does not", () => {
  const healthy = noise(20000, 3).map((z) => 0.4 + 0.02 * z);
  const diverged = healthy.map((v, i) => (i >= 9000 ? 300 + 3000 * Math.abs(Math.sin(i)) : v));
  assert.equal(autoLog([healthy, diverged]), true);
  const spiky = healthy.slice();
  spiky[12000] = 5000;
  assert.equal(autoLog([healthy, spiky]), false);
  assert.equal(autoLog([diverged.map((v, i) => (i === 5 ? 0 : v))]), false); // 0 has no place on a log axis
  assert.equal(autoLog([[NaN, Infinity]]), false);
  assert.equal(autoLog([]), false);
});

test("ignoring outliers: Gaussian noise is never clipped, a spike is", () => {
  const values = noise(2000, 7).map((z) => 1 + 0.1 * z);
  const noisy = yRange([{ values }], false, true);
  assert.ok(noisy.min <= Math.min(...values) && noisy.max >= Math.max(...values), JSON.stringify(noisy));
  const spiky = values.slice();
  spiky[1000] = 40;
  const r = yRange([{ values: spiky }], false, true);
  assert.ok(r.max < 2, JSON.stringify(r));
  const all = yRange([{ values: spiky }], false, false);
  assert.ok(all.max >= 40);
});

test("flagged points are left out of the range; a chart of only flagged points still shows them", () => {
  const values = [1, 1.1, 0.9, 1, 50, 1.05, 0.95, 1, 1.02, 0.98];
  const skip = (i) => i === 4;
  assert.ok(yRange([{ values, skip }], false, true).max < 2);
  const only = yRange([{ values: [5, 6], skip: () => true }], false, true);
  assert.ok(only.min <= 5 && only.max >= 6);
  assert.equal(yRange([{ values: [NaN, null] }], false, true), null);
});

test("a log range covers several series on log10; a non-negative series gets no negative axis", () => {
  const a = noise(1000, 1).map((z) => 0.4 * Math.pow(10, 0.05 * z));
  const b = noise(1000, 2).map((z) => 2000 * Math.pow(10, 0.05 * z));
  const r = yRange([{ values: a }, { values: b }], true, true);
  assert.ok(r.min > 0 && r.min < 0.4 && r.max > 2000, JSON.stringify(r));
  const lin = yRange([{ values: [0, 0.1, 0.2, 0.1, 0] }], false, true);
  assert.equal(lin.min, 0);
  const flat = yRange([{ values: [3, 3, 3] }], false, true);
  assert.ok(flat.min < 3 && flat.max > 3);
});

test("one marker per clipped stretch, at its most extreme point", () => {
  const pts = [[1, 1, 1], [2, 9, 2], [3, 12, 3], [4, 8, 4], [5, 1, 5], [6, -7, 6], [7, null, 7], [8, 20, 8], [9, 1, 9]];
  const m = clippedStretches(pts, 0, 5);
  assert.deepEqual(m.map((s) => [s.side, s.step, s.value, s.count]), [
    ["above", 3, 12, 3],
    ["below", 6, -7, 1],
    ["above", 8, 20, 1],
  ]);
  assert.deepEqual(clippedStretches(pts, -100, 100), []);
});
