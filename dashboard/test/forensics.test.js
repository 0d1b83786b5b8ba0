"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const { forensicsView, forensicsSummary, idsText, fractions } = require("../src/lib/forensics.js");

const alarm = (forensics) => ({ type: "event", kind: "alarm", step: 24, reason: "grad_norm_spike", forensics });

test("layers become bars against the largest, ranks a strip with the top rank, ids text by rank", () => {
  const v = forensicsView(alarm({
    step: 24,
    layers: [{ name: "body.0.weight", grad_norm: 2121.4 }, { name: "body.2.weight", grad_norm: 1060.7 }, { name: "body.0.bias", grad_norm: 0 }],
    layer_count: 6, rank_norms: [0.46, 4831.5], top_rank: 1, sample_ids: [[368, 370], [369, 371]], grouped: false,
  }));
  assert.equal(v.step, 24);
  assert.deepEqual(v.layers.map((l) => [l.name, l.frac]), [["body.0.weight", 1], ["body.2.weight", 0.5], ["body.0.bias", 0]]);
  assert.equal(v.moreLayers, 3);
  assert.deepEqual(v.ranks.map((r) => [r.rank, r.top]), [[0, false], [1, true]]);
  assert.ok(Math.abs(v.ranks[0].frac - 0.46 / 4831.5) < 1e-12);
  assert.deepEqual(v.samples, [{ rank: 0, ids: [368, 370], text: "368, 370", top: false }, { rank: 1, ids: [369, 371], text: "369, 371", top: true }]);
  assert.equal(v.note, "");
  assert.equal(forensicsSummary(alarm({ step: 24, layers: [{ name: "body.0.weight", grad_norm: 3 }], rank_norms: [1, 9], top_rank: 1 })), "top layer body.0.weight · rank 1");
});

test("non-finite values are full bars and win the top rank when the writer did not name one", () => {
  const v = forensicsView(alarm({ step: 7, layers: [{ name: "w", grad_norm: NaN }, { name: "b", grad_norm: 2 }], rank_norms: [5, Infinity, 1] }));
  assert.deepEqual(v.layers.map((l) => [l.frac, l.nonfinite]), [[1, true], [1, false]]);
  assert.equal(v.topRank, 1);
  assert.deepEqual(v.ranks.map((r) => r.top), [false, true, false]);
  assert.deepEqual(fractions([NaN, 0, 0]), [1, 0, 0]);
});

test("no forensics: null; a step that left the ring: a note; one process: no rank strip", () => {
  assert.equal(forensicsView({ kind: "alarm", step: 3 }), null);
  assert.equal(forensicsSummary({ kind: "alarm", step: 3 }), null);
  const v = forensicsView(alarm({ step: 24, missing: "step 24 is not in the ring" }));
  assert.equal(v.note, "step 24 is not in the ring");
  assert.deepEqual([v.layers, v.ranks, v.samples], [[], [], []]);
  const one = forensicsView(alarm({ step: 24, layers: [{ name: "g", grad_norm: 1 }], sample_ids: [[1, 2, 3]] }));
  assert.equal(one.topRank, null);
  assert.equal(one.samples[0].top, false);
  assert.equal(forensicsSummary(alarm({ step: 1, layers: [{ name: "blocks.3", grad_norm: 1 }], grouped: true })), "top group blocks.3");
});

test("long id lists are cut with a count", () => {
  const ids = Array.from({ length: 70 }, (_, i) => i);
  assert.equal(idsText(ids, 3), "0, 1, 2, … +67 more");
  assert.ok(idsText(ids).endsWith("… +6 more"));
});
