"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const { emaDebiased } = require("../src/lib/smoothing.js");

const close = (a, b) => assert.ok(Math.abs(a - b) < 1e-12, `${a} != ${b}`);

test("debiased EMA: first value is the value itself, then the TensorBoard recurrence", () => {
  const a = 0.6;
  const out = emaDebiased([10, 20, 30], a);
  close(out[0], 10); // (1-a)*10 / (1-a)
  const s2 = a * (1 - a) * 10 + (1 - a) * 20;
  close(out[1], s2 / (1 - a * a));
  const s3 = a * s2 + (1 - a) * 30;
  close(out[2], s3 / (1 - a ** 3));
});

test("a constant series stays constant (no bias toward zero)", () => {
  for (const v of emaDebiased(new Array(50).fill(3.5), 0.95)) close(v, 3.5);
});

test("alpha 0 is the identity; alpha near 1 converges slowly", () => {
  assert.deepEqual(emaDebiased([1, 5, 2], 0), [1, 5, 2]);
  const out = emaDebiased([0, 0, 0, 100], 0.99);
  assert.ok(out[3] < 30 && out[3] > 20); // weight of the last point ~ 0.01/(1-0.99^4)
});

test("NaN and Infinity pass through at their index and do not poison the average", () => {
  const out = emaDebiased([1, NaN, 1, Infinity, 1, -Infinity, 1], 0.9);
  assert.ok(Number.isNaN(out[1]));
  assert.equal(out[3], Infinity);
  assert.equal(out[5], -Infinity);
  for (const i of [0, 2, 4, 6]) close(out[i], 1);
  // non-finite values do not count toward the bias correction either
  const ref = emaDebiased([2, 4], 0.5);
  const withGap = emaDebiased([2, NaN, 4], 0.5);
  close(withGap[2], ref[1]);
});

test("a constant series is returned exactly (no rounding noise)", () => {
  const out = emaDebiased([0.001, 0.001, NaN, 0.001, 0.001], 0.9);
  assert.equal(out[0], 0.001);
  assert.equal(out[4], 0.001);
  assert.ok(Number.isNaN(out[2]));
});

test("lead-in: 10/(1-alpha) steps make the omitted history weigh at most e^-10", () => {
  const { leadInSteps, leadInOk } = require("../src/lib/smoothing.js");
  assert.equal(leadInSteps(0), 0);
  assert.equal(leadInSteps(0.99), 1000);
  assert.ok(Math.pow(0.99, leadInSteps(0.99)) <= Math.exp(-10));
  assert.ok(Math.pow(0.6, leadInSteps(0.6)) <= Math.exp(-10));
  assert.equal(leadInOk(1, 1, 1, 0.99), true); // a window from the first step is exact
  assert.equal(leadInOk(4000, 5000, 1, 0.99), true);
  assert.equal(leadInOk(4001, 5000, 1, 0.99), false);
  // and the bound holds: an EMA started at the lead-in differs from the full one by < 1e-4 of the range
  const xs = Array.from({ length: 6000 }, (_, i) => (i < 2000 ? 100 : 1) + Math.sin(i));
  const full = emaDebiased(xs, 0.99);
  const part = emaDebiased(xs.slice(3000), 0.99);
  assert.ok(Math.abs(part[1000] - full[4000]) < 1e-4 * 100, String(part[1000] - full[4000]));
});
