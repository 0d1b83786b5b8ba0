"use strict";
// The page's stream-protocol decisions: every state × message combination that matters.
const test = require("node:test");
const assert = require("node:assert/strict");
const S = require("../src/lib/stream.js");

const cur = (offset, gen) => ({ gen: gen || "g1", offset });
function followed(offset, extra) {
  return Object.assign(S.newStreamState(), { cursor: cur(offset) }, extra || {});
}

test("records for an unfollowed, loading or cursor-less run are ignored (the history covers them)", () => {
  const msg = { prev: cur(0), cursor: cur(10), records: [] };
  assert.equal(S.recordsAction(null, msg).action, "ignore");
  assert.equal(S.recordsAction(followed(0, { loading: true }), msg).action, "ignore");
  assert.equal(S.recordsAction(S.newStreamState(), msg).action, "ignore");
});

test("a message starting at our cursor is applied and moves the cursor", () => {
  const st = followed(100, { awaitingCatchUp: true });
  const a = S.recordsAction(st, { prev: cur(100), cursor: cur(180) });
  assert.deepEqual(a, { action: "apply", cursor: cur(180) });
  S.applied(st, a.cursor);
  assert.deepEqual(st.cursor, cur(180));
  assert.equal(st.awaitingCatchUp, false);
});

test("a message entirely before our cursor is ignored; one straddling it is applied", () => {
  const st = followed(100);
  assert.equal(S.recordsAction(st, { prev: cur(40), cursor: cur(100) }).action, "ignore");
  assert.equal(S.recordsAction(st, { prev: cur(40), cursor: cur(90) }).action, "ignore");
  assert.deepEqual(S.recordsAction(st, { prev: cur(40), cursor: cur(150) }), { action: "apply", cursor: cur(150) });
});

test("a gap asks for a resubscribe once, then waits for the catch-up", () => {
  const st = followed(100);
  assert.equal(S.recordsAction(st, { prev: cur(120), cursor: cur(150) }).action, "resubscribe");
  assert.deepEqual(S.subscribeCursors(new Map([["r", st]])), { r: cur(100) });
  S.subscribed(new Map([["r", st]]), ["r"]);
  assert.equal(S.recordsAction(st, { prev: cur(150), cursor: cur(170) }).action, "wait");
  // the catch-up arrives: applied, in step again, so a later gap resubscribes again
  const a = S.recordsAction(st, { prev: cur(100), cursor: cur(170) });
  assert.equal(a.action, "apply");
  S.applied(st, a.cursor);
  assert.equal(S.recordsAction(st, { prev: cur(200), cursor: cur(210) }).action, "resubscribe");
});

test("another generation reloads; a message without prev (older server) is applied", () => {
  const st = followed(100);
  assert.equal(S.recordsAction(st, { prev: cur(0, "g2"), cursor: cur(10, "g2") }).action, "reload");
  assert.deepEqual(S.recordsAction(st, { cursor: cur(130) }), { action: "apply", cursor: cur(130) });
  assert.deepEqual(S.recordsAction(st, { records: [] }), { action: "apply", cursor: cur(100) });
});

test("advance never moves a cursor back within a generation", () => {
  assert.deepEqual(S.advance(cur(50), cur(40)), cur(50));
  assert.deepEqual(S.advance(cur(50), cur(60)), cur(60));
  assert.deepEqual(S.advance(cur(50), cur(5, "g2")), cur(5, "g2"));
  assert.deepEqual(S.advance(null, cur(5)), cur(5));
  assert.deepEqual(S.advance(cur(5), undefined), cur(5));
});

test("loads: one fetch at a time; a request during a fetch refetches after it", () => {
  const st = S.newStreamState();
  assert.equal(S.requestLoad(st), "fetch");
  assert.equal(st.loading, true);
  assert.equal(S.requestLoad(st), "queued"); // e.g. a reset while the first fetch runs
  assert.equal(S.loaded(st, cur(10)), "refetch");
  assert.equal(st.loading, true);
  assert.equal(S.loaded(st, cur(20)), "subscribe");
  assert.equal(st.loading, false);
  assert.deepEqual(st.cursor, cur(20));
  // a failed fetch keeps nothing to stream from
  assert.equal(S.requestLoad(st), "fetch");
  assert.equal(S.loaded(st, null), "subscribe");
  assert.equal(st.cursor, null);
  assert.deepEqual(S.subscribeCursors(new Map([["r", st]])), {});
});

test("subscribe cursors skip loading runs and honour `only`", () => {
  const states = new Map([["a", followed(1)], ["b", followed(2, { loading: true })], ["c", followed(3)]]);
  assert.deepEqual(S.subscribeCursors(states), { a: cur(1), c: cur(3) });
  assert.deepEqual(S.subscribeCursors(states, "c"), { c: cur(3) });
});

test("hello: reload runs whose file is another generation, and clear every pending catch-up", () => {
  const states = new Map([["a", followed(10, { awaitingCatchUp: true })], ["b", followed(10)], ["c", followed(5, { loading: true })]]);
  const reload = S.helloReloads(states, [
    { name: "a", cursor: cur(10) },
    { name: "b", cursor: cur(3, "g9") },
    { name: "c", cursor: cur(3, "g9") }, // loading: its fetch will bring the new generation
    { name: "unknown", cursor: cur(1) },
  ]);
  assert.deepEqual(reload, ["b"]);
  assert.equal(states.get("a").awaitingCatchUp, false);
});

test("reset: an empty new file waits for its first line; otherwise reload", () => {
  const st = followed(10);
  assert.equal(S.resetAction(null, { cursor: cur(0) }), "ignore");
  assert.equal(S.resetAction(st, { cursor: { gen: null, offset: 0 } }), "await-file");
  assert.equal(st.cursor, null);
  assert.equal(S.fileArrived(st, { cursor: { gen: null, offset: 0 } }), false);
  assert.equal(S.fileArrived(st, { cursor: cur(0, "g2") }), true);
  assert.equal(S.resetAction(followed(10), { cursor: cur(0, "g2") }), "reload");
});

test("early history: the runs the URL names are asked for at once, each answer taken once by its first load", async () => {
  const asked = [];
  const early = new S.EarlyHistory(["a", "b"], 0, (name) => {
    asked.push(name);
    return Promise.resolve({ run: name, cursor: cur(5) });
  });
  assert.deepEqual(asked, ["a", "b"]); // sent in the constructor, before any list
  assert.deepEqual(await early.take("a", false), { run: "a", cursor: cur(5) });
  assert.equal(await early.take("a", false), null); // a refetch asks the server again
  early.clear(); // the list came without "b": its answer is dropped
  assert.equal(await early.take("b", false), null);
});

test("early history: none for the default selection or with smoothing on; a failed or too coarse answer is asked again", async () => {
  const ask = () => {
    throw new Error("must not ask");
  };
  assert.equal(new S.EarlyHistory(null, 0, ask).pending.size, 0); // the runs shown come from the list
  assert.equal(new S.EarlyHistory(["a"], 0.6, ask).pending.size, 0); // how many points depends on the run's size
  const failing = new S.EarlyHistory(["gone"], 0, () => Promise.reject(new Error("HTTP 404")));
  assert.equal(await failing.take("gone", false), null); // (no unhandled rejection either: the test runner would fail)
  let dropped = false;
  const coarse = new S.EarlyHistory(["a"], 0, () => Promise.resolve({ run: "a" }).finally(() => (dropped = true)));
  assert.equal(await coarse.take("a", true), null); // exact smoothing wants every step: not this answer
  assert.ok(dropped);
  assert.equal(await new S.EarlyHistory(null).take("x", false), null);
});
