"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const { parseJsonl, decodeLine, decodeNonFinite, normalizeRecord, quoteBareTokens } = require("../src/lib/jsonl.js");

test("non-finite strings decode to numbers in numeric fields only", () => {
  const rec = decodeLine('{"type":"step","step":2,"loss":"NaN","grad_norm":"Infinity","lr":"-Infinity","message":"NaN"}');
  assert.ok(Number.isNaN(rec.loss));
  assert.equal(rec.grad_norm, Infinity);
  assert.equal(rec.lr, -Infinity);
  assert.equal(rec.message, "NaN"); // a text field keeps the word
  const nested = decodeNonFinite({ config: { a: ["NaN", 1] }, type: "NaN" });
  assert.ok(Number.isNaN(nested.config.a[0]));
  assert.equal(nested.type, "NaN");
});

test("other strings are not numbers", () => {
  const rec = decodeLine('{"type":"step","step":1,"loss":"nan","note":"inf"}');
  assert.equal(rec.loss, "nan");
  assert.equal(rec.note, "inf");
});

test("non-objects, records with neither type nor integer step, and bad known fields are rejected", () => {
  assert.throws(() => decodeLine("[1,2]"), /object/);
  assert.throws(() => decodeLine('{"loss":1}'), /type/);
  assert.throws(() => decodeLine('{"step":1.5,"loss":1}'), /type/);
  assert.throws(() => decodeLine('{"type":"step","step":1.5}'), /integer/);
  assert.throws(() => decodeLine('{"type":"step","step":"3"}'), /integer/);
  assert.throws(() => decodeLine('{"type":"step","step":true}'), /integer/);
  assert.throws(() => decodeLine('{"type":"eval","step":1,"ts":"x"}'), /number/);
  assert.throws(() => decodeLine('{"type":"step"}'), /step/);
  assert.throws(() => decodeLine('{"type":"step","step":1,"loss":nan}'), /not JSON/); // only the exact tokens
  assert.throws(() => decodeLine('{"type":"step","step":1,"loss":NaN'), /not JSON/); // broken for another reason
});

test("integer fields hold signed 64-bit integers, as the server stores them (schema.py INT_MIN..INT_MAX)", () => {
  assert.throws(() => decodeLine('{"type":"step","step":9223372036854775808,"loss":1}'), /64-bit/);
  assert.throws(() => decodeLine('{"type":"step","step":1000000000000000000000000000000}'), /64-bit/);
  assert.throws(() => decodeLine('{"step":1e300,"loss":1}'), /64-bit/); // (another writer's, no type)
  assert.throws(() => decodeLine('{"type":"eval","step":1,"epoch":-9223372036854777856}'), /64-bit/);
  assert.equal(decodeLine('{"type":"step","step":-9223372036854775808}').step, -(2 ** 63));
  assert.equal(decodeLine('{"type":"step","step":9223372036854774784}').step, 2 ** 63 - 1024);
  const { records, skipped } = parseJsonl('{"type":"step","step":1}\n{"type":"step","step":1e30}\n{"type":"step","step":3}\n');
  assert.deepEqual(records.map((r) => r.step), [1, 3]);
  assert.equal(skipped, 1);
});

test("other writers: a line without type but with an integer step is a step record", () => {
  const rec = decodeLine('{"step": 1, "loss": 2.5, "lr": 0.001, "throughput": 900}');
  assert.deepEqual(rec, { type: "step", step: 1, loss: 2.5, lr: 0.001, throughput: 900 });
  assert.equal(normalizeRecord({ type: "eval", step: 1 }).type, "eval");
  assert.equal(normalizeRecord({ step: "1" }).type, undefined);
});

test("other writers: bare NaN / Infinity / -Infinity tokens (Python's json.dumps) are read outside strings only", () => {
  const rec = decodeLine('{"step": 7, "loss": NaN, "grad_norm": Infinity, "lr": -Infinity, "note": "NaN, Infinity: \\"NaN\\"", "a": [NaN, 1]}');
  assert.equal(rec.type, "step");
  assert.ok(Number.isNaN(rec.loss));
  assert.equal(rec.grad_norm, Infinity);
  assert.equal(rec.lr, -Infinity);
  assert.equal(rec.note, 'NaN, Infinity: "NaN"'); // text inside a string is left alone
  assert.ok(Number.isNaN(rec.a[0]));
  assert.equal(quoteBareTokens('{"m":"x NaN","v":NaN}'), '{"m":"x NaN","v":"NaN"}');
  const r = parseJsonl('{"step":1,"loss":NaN}\n{"type":"step","step":2,"loss":1}\n');
  assert.equal(r.skipped, 0);
  assert.deepEqual(r.records.map((x) => x.step), [1, 2]);
});

test("parseJsonl skips and counts malformed lines, keeps going", () => {
  const text = [
    '{"type":"header","schema":1}',
    "not json",
    '{"type":"step","step":1,"loss":1.5}',
    '{"type":"step","step":2,"loss":nan}',
    "",
    '{"type":"step","step":3,"loss":"NaN"}',
    "",
  ].join("\n");
  const r = parseJsonl(text);
  assert.equal(r.records.length, 3);
  assert.equal(r.skipped, 2);
  assert.deepEqual(r.errors.map((e) => e.line), [2, 4]);
  assert.ok(Number.isNaN(r.records[2].loss));
  assert.equal(r.rest, "");
});

test("a trailing partial line is never parsed; kept as rest, counted only when final", () => {
  const text = '{"type":"step","step":1,"loss":1}\n{"type":"step","step":2,"lo';
  const live = parseJsonl(text);
  assert.equal(live.records.length, 1);
  assert.equal(live.skipped, 0);
  assert.equal(live.rest, '{"type":"step","step":2,"lo');
  // Even a partial line that happens to be valid JSON is not a record until its newline arrives.
  const valid = parseJsonl('{"type":"step","step":1,"loss":1}\n{"type":"step","step":2,"loss":1}');
  assert.equal(valid.records.length, 1);
  const fin = parseJsonl(text, { final: true });
  assert.equal(fin.records.length, 1);
  assert.equal(fin.skipped, 1);
  assert.equal(fin.partial, true);
  assert.match(fin.errors[0].error, /partial/);
});

test("CRLF line endings are accepted", () => {
  const r = parseJsonl('{"type":"step","step":1,"loss":1}\r\n{"type":"step","step":2,"loss":2}\r\n');
  assert.equal(r.records.length, 2);
  assert.equal(r.skipped, 0);
});
