"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const { decimateMinMax } = require("../src/lib/decimate.js");

function noisy(n, seed) {
  let x = seed;
  const out = [];
  for (let i = 0; i < n; i++) {
    x = (x * 1103515245 + 12345) % 2147483648;
    out.push(1 + (x / 2147483648) * 0.2);
  }
  return out;
}

test("reduces to about the target and keeps order, first and last", () => {
  const n = 10000;
  const steps = Array.from({ length: n }, (_, i) => i + 1);
  const values = noisy(n, 7);
  const r = decimateMinMax(steps, values, 400);
  assert.ok(r.steps.length <= 400 && r.steps.length >= 200, String(r.steps.length));
  for (let i = 1; i < r.steps.length; i++) assert.ok(r.steps[i] > r.steps[i - 1]);
  assert.equal(r.steps[0], 1);
  assert.equal(r.steps[r.steps.length - 1], n);
  r.kept.forEach((k, i) => assert.equal(r.values[i], values[k]));
});

test("a one-step spike and every non-finite value survive (LTTB-style sampling would drop them)", () => {
  const n = 5000;
  const steps = Array.from({ length: n }, (_, i) => i + 1);
  const values = noisy(n, 3);
  values[1234] = 50;
  values[77] = NaN;
  values[4000] = Infinity;
  values[4001] = -Infinity;
  const r = decimateMinMax(steps, values, 100);
  assert.ok(r.steps.includes(1235));
  assert.equal(r.values[r.steps.indexOf(1235)], 50);
  assert.ok(r.steps.includes(78) && Number.isNaN(r.values[r.steps.indexOf(78)]));
  assert.ok(r.steps.includes(4001) && r.steps.includes(4002));
  // the global min and max are kept
  const finite = values.filter(Number.isFinite);
  assert.ok(r.values.includes(Math.min(...finite)));
});

test("flagged indices are kept even when not extreme", () => {
  const n = 1000;
  const steps = Array.from({ length: n }, (_, i) => i);
  const values = noisy(n, 11);
  const r = decimateMinMax(steps, values, 40, (i) => i === 500);
  assert.ok(r.steps.includes(500));
});

test("small inputs are returned unchanged", () => {
  const r = decimateMinMax([1, 2, 3], [3, 2, 1], 100);
  assert.deepEqual(r.steps, [1, 2, 3]);
  assert.deepEqual(r.values, [3, 2, 1]);
});
