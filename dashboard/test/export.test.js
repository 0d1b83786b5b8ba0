"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const { sliceRange, toCSV, toJSON, fileName } = require("../src/lib/export.js");

const part = {
  run: 'sweep/a,"b"',
  field: "loss",
  exact: true,
  step: [10, 11, 12],
  wall_time: [1700000000.125, 1700000000.25, NaN],
  value: [0.1 + 0.2, NaN, -Infinity],
  smoothed: null,
};

test("CSV: one row per step, full precision, non-finite values named, names quoted", () => {
  const csv = toCSV([part, Object.assign({}, part, { run: "b", step: [10], wall_time: null, value: [1], smoothed: [0.5] })]);
  assert.equal(
    csv,
    "run,field,step,wall_time,value,smoothed\n" +
      '"sweep/a,""b""",loss,10,1700000000.125,0.30000000000000004,\n' +
      '"sweep/a,""b""",loss,11,1700000000.25,NaN,\n' +
      '"sweep/a,""b""",loss,12,NaN,-Infinity,\n' +
      "b,loss,10,,1,0.5\n",
  );
  assert.equal(toCSV([]), "run,field,step,wall_time,value\n");
});

test("JSON: strict (non-finite values as the log writes them) and round-trips", () => {
  const text = toJSON([part], { chart: "loss", x_range: [10, 12] });
  const doc = JSON.parse(text);
  assert.equal(doc.chart, "loss");
  assert.deepEqual(doc.series[0].value, [0.30000000000000004, "NaN", "-Infinity"]);
  assert.deepEqual(doc.series[0].step, [10, 11, 12]);
  assert.equal(doc.series[0].smoothed, null);
  assert.equal(doc.series[0].exact, true);
});

test("sliceRange keeps the steps of [a, b]; file names are safe", () => {
  assert.deepEqual(sliceRange([1, 2, 3, 4, 5], [10, 20, 30, 40, 50], 2, 4), { steps: [2, 3, 4], values: [20, 30, 40] });
  assert.deepEqual(sliceRange([1, 2], [1, 2], NaN, NaN).steps, [1, 2]);
  assert.equal(fileName(["gradmon", "system/rss bytes", 1, 200], "csv"), "gradmon-system_rss_bytes-1-200.csv");
});
