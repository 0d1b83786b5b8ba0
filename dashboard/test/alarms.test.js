"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const { incidentsOf, incidentText, newIncidents, reasonTitle } = require("../src/lib/alarms.js");

const ev = (fields) => Object.assign({ type: "event", ts: 1 }, fields);
const fmt = (v) => String(v);

test("an alarm and its end make one incident with its flagged count", () => {
  const incs = incidentsOf("r", [
    ev({ kind: "spike", step: 12000 }), // detector flags are not alarms
    ev({ kind: "alarm", step: 12000, reason: "grad_norm_spike", field: "grad_norm", value: 31.2, baseline: 0.41, message: "norm 76x its level", extra: { x: 1 } }),
    ev({ kind: "spike", step: 12001 }),
    ev({ kind: "alarm_end", step: 12019, start: 12000, flagged: 20, message: "closed" }),
  ]);
  assert.equal(incs.length, 1);
  const i = incs[0];
  assert.deepEqual([i.reason, i.start, i.end, i.flagged, i.ongoing], ["grad_norm_spike", 12000, 12019, 20, false]);
  assert.equal(i.alarm.extra.x, 1); // extra fields are carried, not refused
  assert.equal(incidentText(i, fmt), "gradient-norm spike · steps 12000–12019 · 20 flagged steps · grad_norm 31.2 vs 0.41");
});

test("an alarm without an end is ongoing; ends are matched by start (and reason when given)", () => {
  const incs = incidentsOf("r", [
    ev({ kind: "alarm", step: 50, reason: "nonfinite", field: "loss", value: NaN }),
    ev({ kind: "alarm", step: 50, reason: "grad_norm_spike", value: 9 }),
    ev({ kind: "alarm_end", step: 52, start: 50, flagged: 3, reason: "grad_norm_spike" }),
    ev({ kind: "alarm", step: 90, reason: "loss_spike" }),
    ev({ kind: "alarm_end", step: 70, start: 60, flagged: 1 }), // names no open alarm: ignored
  ]);
  assert.deepEqual(incs.map((i) => [i.reason, i.start, i.end, i.ongoing]), [
    ["nonfinite", 50, 50, true],
    ["grad_norm_spike", 50, 52, false],
    ["loss_spike", 90, 90, true],
  ]);
  assert.equal(incidentText(incs[2], fmt), "loss spike · since step 90 · ongoing");
  assert.equal(incidentText(incs[0], fmt), "non-finite value · since step 50 · ongoing · loss NaN");
});

test("an abort event is an incident unless an abort alarm stands for it", () => {
  const a = incidentsOf("r", [ev({ kind: "abort", step: 70, message: "10 non-finite steps" })]);
  assert.deepEqual(a.map((i) => [i.reason, i.start, i.message]), [["abort", 70, "10 non-finite steps"]]);
  const b = incidentsOf("r", [ev({ kind: "alarm", step: 70, reason: "abort" }), ev({ kind: "abort", step: 70 })]);
  assert.equal(b.length, 1);
  assert.equal(incidentText(b[0], fmt), "training aborted · since step 70 · ongoing");
});

test("malformed events are skipped; unknown reasons are shown as written", () => {
  const incs = incidentsOf("r", [ev({ kind: "alarm" }), ev({ kind: "alarm", step: 1.5 }), null, ev({ kind: "alarm", step: 3, reason: "data_stall" })]);
  assert.equal(incs.length, 1);
  assert.equal(reasonTitle("data_stall"), "data stall");
});

test("newIncidents reports each incident once", () => {
  const seen = new Set();
  const incs = incidentsOf("r", [ev({ kind: "alarm", step: 5, reason: "nonfinite" })]);
  assert.equal(newIncidents(incs, seen).length, 1);
  assert.equal(newIncidents(incs, seen).length, 0);
  const more = incidentsOf("r", [ev({ kind: "alarm", step: 5, reason: "nonfinite" }), ev({ kind: "alarm", step: 9, reason: "loss_spike" })]);
  assert.deepEqual(newIncidents(more, seen).map((i) => i.start), [9]);
});

test("alarmKey: kind, step and reason (an alarm_end's start stands for its reason)", () => {
  const { alarmKey } = require("../src/lib/alarms.js");
  assert.equal(alarmKey(ev({ kind: "alarm", step: 7, reason: "nonfinite", source: "server" })), "alarm|7|nonfinite");
  assert.equal(alarmKey(ev({ kind: "alarm_end", step: 9, start: 7, flagged: 3 })), "alarm_end|9|7");
  assert.equal(alarmKey(ev({ kind: "abort", step: 9 })), "abort|9|");
  assert.notEqual(alarmKey(ev({ kind: "alarm", step: 7, reason: "loss_spike" })), alarmKey(ev({ kind: "alarm", step: 7, reason: "nonfinite" })));
});

test("a derived alarm from the history, then again in live records (resent), is one incident", () => {
  const { RunData } = require("../src/lib/rundata.js");
  const { recordsAction, newStreamState, loaded, applied } = require("../src/lib/stream.js");
  const step = (s, extra) => Object.assign({ type: "step", step: s, loss: 1, grad_norm: 1 }, extra);
  const alarm = ev({ kind: "alarm", step: 31, reason: "nonfinite", field: "loss", value: "NaN", source: "server" });
  const end = ev({ kind: "alarm_end", step: 31, start: 31, flagged: 1, reasons: { nonfinite: 1 }, source: "server" });
  const run = new RunData("r");
  const st = newStreamState();
  st.loading = true;
  const cursor = { gen: "g", offset: 3000 };
  run.loadHistory({ cursor, exact: true, series: { loss: { step: [30, 31], value: [1, "NaN"] } }, events: [alarm], marks: [], headers: [] });
  assert.equal(loaded(st, cursor), "subscribe");
  // A message that starts before our cursor and ends beyond it (resent after a resubscribe) is
  // applied whole: its alarm is the one the history had.
  const msg = { type: "records", run: "r", prev: { gen: "g", offset: 2900 }, cursor: { gen: "g", offset: 3300 },
    records: [step(31, { loss: "NaN" }), Object.assign({}, alarm), step(32), step(82), Object.assign({}, end)] };
  const act = recordsAction(st, msg);
  assert.equal(act.action, "apply");
  for (const r of msg.records) run.ingestRecord(r);
  applied(st, act.cursor);
  for (const r of msg.records) run.ingestRecord(r); // and once more: still one of each
  assert.equal(run.alarmEvents.length, 2);
  const incs = incidentsOf("r", run.alarmEvents);
  assert.equal(incs.length, 1);
  assert.deepEqual([incs[0].start, incs[0].end, incs[0].flagged, incs[0].ongoing], [31, 31, 1, false]);
  // a history reload starts over: the same incident again, once
  run.loadHistory({ cursor: msg.cursor, exact: true, series: {}, events: [alarm, end], marks: [], headers: [] });
  assert.equal(incidentsOf("r", run.alarmEvents).length, 1);
  assert.equal(run.alarmEvents.length, 2);
});
