"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const R = require("../src/lib/runtable.js");

test("by default every run is shown, newest first, up to the cap", () => {
  const infos = [
    { name: "old", first_ts: 10 },
    { name: "new", first_ts: 30 },
    { name: "mid", first_ts: 20 },
    { name: "nots" },
  ];
  assert.deepEqual(R.defaultSelection(infos), ["new", "mid", "old", "nots"]);
  assert.deepEqual(R.defaultSelection(infos, 2), ["new", "mid"]);
  const many = Array.from({ length: 25 }, (_, i) => ({ name: "r" + i, first_ts: i }));
  assert.equal(R.defaultSelection(many).length, R.DEFAULT_RUN_CAP);
  assert.equal(R.defaultSelection(many)[0], "r24");
});

test("run filter: case-insensitive regex; invalid text matches nothing and says why", () => {
  const f = R.runFilter("^sweep/(lr|wd)");
  assert.equal(f.test("sweep/lr-3e-4"), true);
  assert.equal(f.test("SWEEP/wd"), true);
  assert.equal(f.test("baseline"), false);
  assert.equal(R.runFilter("").test("anything"), true);
  const bad = R.runFilter("(unclosed");
  assert.equal(bad.test("(unclosed"), false);
  assert.match(bad.error, /Invalid|unterminated/i);
});

test("config is flattened to dotted keys; arrays and empty objects stay values", () => {
  const flat = R.flattenConfig({ lr: 3e-4, opt: { name: "adamw", betas: [0.9, 0.95], sched: { warmup: 1000 } }, tags: {}, x: null });
  assert.deepEqual(flat, { lr: 3e-4, "opt.name": "adamw", "opt.betas": [0.9, 0.95], "opt.sched.warmup": 1000, tags: {}, x: null });
  assert.deepEqual(R.flattenConfig(null), {});
});

test("config columns: differing keys (or missing in some runs) first and flagged", () => {
  const rows = [
    { name: "a", config: { lr: 3e-4, bs: 256, model: "gpt", seed: 1 } },
    { name: "b", config: { lr: 1e-3, bs: 256, model: "gpt" } },
    { name: "c", config: { lr: 3e-4, bs: 256, model: "gpt", seed: 1 } },
  ];
  assert.deepEqual(R.configColumns(rows), [
    { key: "lr", differs: true },
    { key: "seed", differs: true },
    { key: "bs", differs: false },
    { key: "model", differs: false },
  ]);
  assert.deepEqual(R.configColumns([rows[0]]).map((c) => c.differs), [false, false, false, false]);
  assert.deepEqual(R.configColumns([{ name: "x", config: { a: [1, 2] } }, { name: "y", config: { a: [1, 2] } }]), [{ key: "a", differs: false }]);
});

test("config values as text", () => {
  assert.equal(R.configText("adamw"), "adamw");
  assert.equal(R.configText(0.001), "0.001");
  assert.equal(R.configText([1, 2]), "[1,2]");
  assert.equal(R.configText(undefined), "—");
  assert.equal(R.configText(NaN), "NaN");
});
