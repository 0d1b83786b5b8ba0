"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const R = require("../src/lib/runstatus.js");

test("a run's status; while the server reads its log, how far (never 100 % before the end)", () => {
  assert.deepEqual(R.runStatus({ status: "live", indexing: false }), { text: "live", cls: "live", title: "" });
  assert.deepEqual(R.runStatus({ status: "replay" }), { text: "replay", cls: "replay", title: "" });
  assert.deepEqual(R.runStatus({}), { text: "", cls: "", title: "" });
  const reading = { status: "live", indexing: true, cursor: { gen: "g", offset: 680e6 }, file_bytes: 2038e6, last_step: 3335000 };
  const s = R.runStatus(reading);
  assert.equal(s.text, "reading 33%");
  assert.equal(s.cls, "indexing");
  assert.match(s.title, /still reading this run's log: 680 MB of 2\.04 GB \(up to step 3335000 so far\)\. Its curves show what had been read/);
  assert.equal(R.runStatus({ ...reading, cursor: { offset: 2037.9e6 } }).text, "reading 99%"); // (floor, capped)
  assert.equal(R.runStatus({ ...reading, cursor: { offset: 0 } }).text, "reading 0%");
  // an entry without the sizes (another server's): reading, no percentage
  const bare = R.runStatus({ status: "live", indexing: true, cursor: { offset: 10 } });
  assert.equal(bare.text, "reading");
  assert.doesNotMatch(bare.title, / of |so far/);
  assert.equal(R.runStatus({ ...reading, file_bytes: 0 }).text, "reading");
});
