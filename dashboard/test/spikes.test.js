"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const { detectSpikes, SpikeDetector } = require("../src/lib/spikes.js");

test("a norm above k x rolling median of the previous N is a spike", () => {
  const values = [];
  for (let i = 0; i < 30; i++) values.push(1 + 0.1 * Math.sin(i));
  values.push(9); // ~9x median
  values.push(1);
  values.push(4); // 4x: below k=5
  const steps = values.map((_, i) => i + 1);
  const spikes = detectSpikes(values, steps, { k: 5, window: 20, minHistory: 10 });
  assert.deepEqual(spikes.map((s) => s.step), [31]);
  assert.ok(spikes[0].ratio > 8 && spikes[0].ratio < 10);
});

test("nothing is flagged during warm-up", () => {
  const spikes = detectSpikes([1, 100, 1, 100], null, { k: 5, window: 10, minHistory: 10 });
  assert.equal(spikes.length, 0);
});

test("the window rolls: a new plateau stops being a spike", () => {
  const values = new Array(20).fill(1).concat(new Array(40).fill(10));
  const spikes = detectSpikes(values, null, { k: 5, window: 10, minHistory: 5 });
  // the first steps at 10 are spikes until the median of the last 10 becomes 10
  assert.ok(spikes.length >= 1 && spikes.length <= 6, String(spikes.length));
  assert.equal(spikes[0].index, 20);
  assert.ok(spikes.every((s) => s.index < 30));
});

test("non-finite norms are not spikes and do not enter the window", () => {
  const det = new SpikeDetector({ k: 3, window: 5, minHistory: 3 });
  for (const v of [1, 1, 1]) det.push(v);
  assert.equal(det.push(NaN).spike, false);
  assert.equal(det.push(Infinity).spike, false);
  assert.equal(det.recent.length, 3);
  assert.equal(det.push(3.5).spike, true);
});
