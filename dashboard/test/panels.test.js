"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const { panelsFor, sectionsFor, sectionOf } = require("../src/lib/panels.js");

test("panels: known fields first in a fixed order, then the rest, eval/system last", () => {
  const ids = panelsFor(["zscore", "grad_norm", "eval/accuracy", "loss", "my_metric", "lr", "eval/loss", "system/cpu_percent"])
    .map((p) => p.id);
  assert.deepEqual(ids, ["loss", "grad_norm", "lr", "my_metric", "zscore", "eval/accuracy", "system/cpu_percent"]);
  assert.deepEqual(panelsFor(["eval/loss"]).map((p) => p.id), ["loss"]);
  assert.equal(panelsFor(["system/rss_bytes"])[0].unit, "bytes");
});

test("sections: train, eval, name prefixes, defence, system", () => {
  assert.equal(sectionOf("loss"), "train");
  assert.equal(sectionOf("attn/entropy"), "attn");
  assert.equal(sectionOf("clip_coef"), "defence");
  assert.equal(sectionOf("eval/accuracy"), "eval");
  assert.equal(sectionOf("system/rss_bytes"), "system");
  const fields = ["loss", "grad_norm", "lr", "throughput", "step_time", "clip_coef", "zscore", "eval/accuracy", "system/rss_bytes", "attn/entropy", "moe/load", "my_metric"];
  const sections = sectionsFor(panelsFor(fields));
  assert.deepEqual(sections.map((s) => s.id), ["train", "eval", "attn", "moe", "defence", "system"]);
  assert.deepEqual(sections[0].panels.map((p) => p.id), ["loss", "grad_norm", "lr", "my_metric"]);
  assert.deepEqual(sections[4].panels.map((p) => p.id), ["clip_coef", "zscore"]);
  assert.deepEqual(sections[5].panels.map((p) => p.id), ["throughput", "step_time", "system/rss_bytes"]);
  assert.equal(sections[0].title, "Training");
  assert.equal(sections[2].title, "attn");
});
