"use strict";
// system records from history (and live), byte formatting, and the layers table.
const test = require("node:test");
const assert = require("node:assert/strict");
const { RunData } = require("../src/lib/rundata.js");
const { panelsFor } = require("../src/lib/panels.js");
const { formatBytes, formatField, isBytesField, layerRows } = require("../src/lib/format.js");

test("history's system series load by step and merge with live records without duplicates", () => {
  const run = new RunData("r");
  run.loadHistory({
    cursor: { gen: "g", offset: 10 },
    series: { loss: { step: [1, 2, 3], value: [1, 0.5, 0.25] } },
    system: { rss_bytes: { step: [1, 3], value: [1.2e9, 1.3e9] }, cpu_percent: { step: [3], value: ["NaN"] } },
    layers: { type: "layers", step: 3, top: [{ name: "w", grad_norm: "Infinity", param_norm: 2, update_ratio: 0.001 }] },
  });
  assert.deepEqual(run.series.get("system/rss_bytes").steps, [1, 3]);
  assert.ok(Number.isNaN(run.series.get("system/cpu_percent").values[0]));
  assert.equal(run.layers.top[0].grad_norm, Infinity);
  // the same sample again live (overlap after a resubscribe) replaces itself; a new one appends
  run.ingestRecord({ type: "system", ts: 5, step: 3, rss_bytes: 1.3e9 });
  run.ingestRecord({ type: "system", ts: 6, step: 5, rss_bytes: 1.4e9 });
  assert.deepEqual(run.series.get("system/rss_bytes").steps, [1, 3, 5]);
  assert.deepEqual(run.series.get("system/rss_bytes").values, [1.2e9, 1.3e9, 1.4e9]);
  assert.ok(run.fields().includes("system/rss_bytes"));
  // a live layers record replaces the table; one without `top` is ignored
  assert.equal(run.ingestRecord({ type: "layers", step: 6, top: [{ name: "b", grad_norm: 1 }] }), true);
  assert.equal(run.ingestRecord({ type: "layers", step: 7 }), false);
  assert.equal(run.layers.step, 6);
});

test("a zoomed history's system window is spliced in like the train series", () => {
  const run = new RunData("r");
  run.loadHistory({ cursor: null, system: { cpu_percent: { step: [1, 50, 100], value: [1, 2, 3] } } });
  run.setDetail({ start: 40, end: 60, system: { cpu_percent: { step: [45, 50, 55], value: [7, 8, 9] } } });
  assert.deepEqual(run.view("system/cpu_percent").steps, [1, 45, 50, 55, 100]);
});

test("byte-valued fields get a bytes panel and readable units", () => {
  assert.equal(isBytesField("system/rss_bytes"), true);
  assert.equal(isBytesField("system/device_mem_peak_bytes"), true);
  assert.equal(isBytesField("system/cpu_percent"), false);
  assert.equal(isBytesField("megabytes_ratio"), false);
  const panels = panelsFor(["loss", "system/rss_bytes", "system/cpu_percent"]);
  assert.equal(panels.find((p) => p.id === "system/rss_bytes").unit, "bytes");
  assert.equal(panels.find((p) => p.id === "system/cpu_percent").unit, undefined);
  assert.equal(formatBytes(1200000000), "1.2 GB");
  assert.equal(formatBytes(123456789), "123 MB");
  assert.equal(formatBytes(999999), "1 MB");
  assert.equal(formatBytes(512), "512 B");
  assert.equal(formatBytes(0), "0 B");
  assert.equal(formatBytes(2.5e12), "2.5 TB");
  assert.equal(formatBytes(NaN), "NaN");
  assert.equal(formatField("system/rss_bytes", 1.5e9), "1.5 GB");
  assert.equal(formatField("system/cpu_percent", 83), "83");
});

test("layerRows formats the top-k table, capped, with non-finite and missing values named", () => {
  const rec = {
    step: 9,
    top: [
      { name: "enc.q.weight", grad_norm: NaN, param_norm: 12, update_ratio: 0.0012 },
      { name: "enc.k.weight", grad_norm: 3.1 },
      { name: "head.bias", grad_norm: 0.5, param_norm: 1, update_ratio: 1e-7 },
    ],
  };
  assert.deepEqual(layerRows(rec, 2), [
    { name: "enc.q.weight", grad_norm: "NaN", param_norm: "12", update_ratio: "0.0012" },
    { name: "enc.k.weight", grad_norm: "3.1", param_norm: "—", update_ratio: "—" },
  ]);
  assert.equal(layerRows(rec, 0).length, 3);
  assert.equal(layerRows(rec, 0)[2].update_ratio, "1e-7");
  assert.deepEqual(layerRows(null, 5), []);
});
