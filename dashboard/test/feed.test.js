"use strict";
// The page's feed (app/feed.js) on a fake server: when the history requests go out at opening.
const test = require("node:test");
const assert = require("node:assert/strict");
const fs = require("node:fs");
const path = require("node:path");
const vm = require("node:vm");

const LIB = Object.assign({}, require("../src/lib/series.js"), require("../src/lib/rundata.js"), require("../src/lib/stream.js"));

function deferred() {
  let resolve, reject;
  const promise = new Promise((a, b) => ((resolve = a), (reject = b)));
  return { promise, resolve, reject };
}

/** A server whose answers the test gives: every request is logged and left pending until then. */
class FakeClient {
  constructor() {
    this.log = [];
    this.pending = [];
    this.sent = [];
    this.connected = false;
  }
  _ask(what) {
    const d = deferred();
    this.log.push(what);
    this.pending.push({ what, d });
    return d.promise;
  }
  runs() {
    return this._ask("runs");
  }
  history(name, params) {
    return this._ask("history " + name + " " + params.points);
  }
  answer(what, body, status) {
    const i = this.pending.findIndex((p) => p.what === what);
    assert.ok(i >= 0, "no pending " + what + " (pending: " + this.pending.map((p) => p.what) + ")");
    const [p] = this.pending.splice(i, 1);
    if (status) p.d.reject(Object.assign(new Error("HTTP " + status), { status }));
    else p.d.resolve(body);
  }
  answerOf(pending) {
    return pending; // (the fake early requests below resolve to bodies already)
  }
  connect() {
    this.connected = true;
  }
  send(msg) {
    this.sent.push(msg);
    return true;
  }
}

/** The Feed class as the page loads it (a classic script on `self`), with the fake client. */
function loadFeed(client, early) {
  const sandbox = { GradmonLib: LIB, GradmonApp: { Client: function () { return client; } }, GradmonEarly: early || undefined, console, setTimeout, clearTimeout };
  sandbox.self = sandbox;
  vm.runInNewContext(fs.readFileSync(path.join(__dirname, "..", "src", "app", "feed.js"), "utf8"), sandbox);
  return sandbox.GradmonApp.Feed;
}

/** A page opened on `named` runs (null: the default view) with `smoothing`, as main.js wires it. */
function openPage(named, smoothing, early, historyPoints) {
  const client = new FakeClient();
  const Feed = loadFeed(client, early);
  const state = { mode: "live", runs: new Map(), streams: new Map(), runsInfo: new Map(), fetches: 0 };
  const notices = [];
  let feed = null;
  feed = new Feed(state, {
    changed() {},
    streamed() {},
    setRunsInfo(list) {
      for (const r of list) state.runsInfo.set(r.name, r);
      const shown = named || list.map((r) => r.name);
      for (const n of shown) if (state.runsInfo.has(n)) feed.follow(n);
    },
    notice: (text) => notices.push(text),
    historyPoints: historyPoints || (() => 1200),
    namedRuns: () => named,
    smoothing: () => smoothing,
    xMode: () => "step",
    zoom: () => null,
    shown: () => Array.from(state.runs.values()),
    onConnection() {},
  });
  return { client, feed, state, notices, started: feed.start() };
}

const settle = () => new Promise((r) => setTimeout(r, 0));
const HISTORY = { run: "big", exact: false, cursor: { gen: "g", offset: 100 }, series: { loss: { step: [1, 500, 1000], value: [3, 2, 1] } } };

test("the runs the URL names are asked for beside the run list, once each; a named run the list lacks costs no notice", async () => {
  const { client, state, notices, started } = openPage(["big", "gone"], 0);
  assert.deepEqual(client.log, ["history big 1200", "history gone 1200", "runs"]); // not after the list
  client.answer("history big 1200", HISTORY);
  client.answer("history gone 1200", null, 404);
  await settle();
  assert.equal(state.runs.size, 0); // nothing is followed before the list says the run exists
  client.answer("runs", { runs: [{ name: "big", records: 1000 }] });
  await started;
  await settle();
  assert.deepEqual(client.log, ["history big 1200", "history gone 1200", "runs"]); // no second request
  assert.equal(state.runs.get("big").pointCount("loss"), 3);
  assert.ok(!state.streams.get("big").loading);
  // streamed from its cursor (JSON: the message was built in the page's realm)
  assert.deepEqual(JSON.parse(JSON.stringify(client.sent)), [{ type: "subscribe", runs: { big: { gen: "g", offset: 100 } } }]);
  assert.ok(client.connected);
  assert.deepEqual(notices, []);
  assert.equal(state.fetches, 3);
});

test("without runs in the URL, or with smoothing on, the history waits for the run list (it decides what to ask)", async () => {
  for (const [named, smoothing, points] of [[null, 0, 1200], [["big"], 0.6, 1200]]) {
    const { client, state, started } = openPage(named, smoothing);
    assert.deepEqual(client.log, ["runs"]);
    client.answer("runs", { runs: [{ name: "big", records: 200000 }] }); // beyond the full-resolution bound
    await started;
    await settle();
    assert.deepEqual(client.log, ["runs", "history big " + points]);
    client.answer("history big " + points, HISTORY);
    await settle();
    assert.equal(state.runs.get("big").pointCount("loss"), 3);
  }
  // smoothing on and a run small enough for exact smoothing: every step is asked for
  const { client, started } = openPage(["small"], 0.6);
  client.answer("runs", { runs: [{ name: "small", records: 5000 }] });
  await started;
  await settle();
  assert.deepEqual(client.log, ["runs", "history small 5600"]);
});

test("with smoothing on, a run whose list was read mid-indexing is fetched again in full when the list catches up", async () => {
  // The page opened while the server was still indexing: the list said 3000 records of a 6000-step
  // run, so the history asked for 3401 points came back downsampled (not exact).
  const { client, feed, state, started } = openPage(["small"], 0.6);
  client.answer("runs", { runs: [{ name: "small", records: 3000 }] });
  await started;
  await settle();
  assert.deepEqual(client.log, ["runs", "history small 3401"]);
  client.answer("history small 3401", Object.assign({}, HISTORY, { run: "small", exact: false, cursor: null }));
  await settle();
  assert.equal(state.runs.get("small").exact, false);
  // The same list again asks for nothing; the list with the whole run asks for every step.
  feed.onMessage({ type: "runs", runs: [{ name: "small", records: 3000 }] });
  await settle();
  assert.deepEqual(client.log, ["runs", "history small 3401"]);
  feed.onMessage({ type: "runs", runs: [{ name: "small", records: 6000 }] });
  await settle();
  assert.deepEqual(client.log, ["runs", "history small 3401", "history small 6701"]);
  client.answer("history small 6701", Object.assign({}, HISTORY, { run: "small", exact: true, cursor: null }));
  await settle();
  assert.equal(state.runs.get("small").exact, true);
  feed.onMessage({ type: "runs", runs: [{ name: "small", records: 6000 }] });
  await settle();
  assert.equal(client.log.length, 3); // exact now: nothing more
});

test("with smoothing on, a run list that catches up while the history is on its way still gets every step", async () => {
  // The list that said 3000 records is overtaken while the 3401-point request is answered: the
  // downsampled answer is taken, then every step is asked for (not left downsampled).
  const { client, feed, state, started } = openPage(["small"], 0.6);
  client.answer("runs", { runs: [{ name: "small", records: 3000 }] });
  await started;
  await settle();
  feed.onMessage({ type: "runs", runs: [{ name: "small", records: 6000 }] });
  await settle();
  assert.deepEqual(client.log, ["runs", "history small 3401"]);
  client.answer("history small 3401", Object.assign({}, HISTORY, { run: "small", exact: false, cursor: null }));
  await settle();
  assert.deepEqual(client.log, ["runs", "history small 3401", "history small 6701"]);
  client.answer("history small 6701", Object.assign({}, HISTORY, { run: "small", exact: true, cursor: null }));
  await settle();
  assert.equal(state.runs.get("small").exact, true);
  assert.equal(client.log.length, 3);
});

test("an early request that failed is asked again once the list names the run", async () => {
  const { client, state, notices, started } = openPage(["late"], 0);
  client.answer("history late 1200", null, 404); // (the run's file appeared just after)
  client.answer("runs", { runs: [{ name: "late", records: 1000 }] });
  await started;
  await settle();
  assert.deepEqual(client.log, ["history late 1200", "runs", "history late 1200"]);
  client.answer("history late 1200", Object.assign({}, HISTORY, { run: "late" }));
  await settle();
  assert.equal(state.runs.get("late").pointCount("loss"), 3);
  assert.deepEqual(notices, []);
});

/** What boot/early.js hands over (self.GradmonEarly): requests sent before the page's scripts ran, logged in `log`. */
class FakeEarly {
  constructor() {
    this.log = [];
    this.sent = new Map();
    this.list = deferred();
  }
  send(name) {
    const d = deferred();
    this.sent.set(name, d);
    return d;
  }
  runs() {
    this.log.push("runs taken");
    return this.list.promise;
  }
  history(name) {
    this.log.push("history taken " + name);
    const d = this.sent.get(name);
    this.sent.delete(name);
    return d ? d.promise : null;
  }
}

test("the page takes the list and the histories boot/early.js sent instead of asking again", async () => {
  for (const named of [null, ["b", "a"]]) {
    const early = new FakeEarly();
    const { client, state, notices, started } = openPage(named, 0, early);
    const a = early.send("a");
    const b = early.send("b");
    await settle();
    assert.deepEqual(client.log, []); // nothing of its own: not even the runs the URL names
    early.list.resolve({ runs: [{ name: "a", records: 1000 }, { name: "b", records: 1000 }] });
    await started;
    a.resolve(Object.assign({}, HISTORY, { run: "a" }));
    b.resolve(Object.assign({}, HISTORY, { run: "b" }));
    await settle();
    assert.deepEqual(client.log, []); // still nothing asked twice
    assert.equal(state.runs.get("a").pointCount("loss"), 3);
    assert.equal(state.runs.get("b").pointCount("loss"), 3);
    assert.ok(early.log.includes("runs taken") && early.log.includes("history taken a") && early.log.includes("history taken b"));
    assert.ok(client.connected);
    assert.deepEqual(notices, []);
    assert.equal(early.history("a"), null); // taken once
  }
});

test("a run boot/early.js sent nothing for, or whose early answer failed, is asked for by the page", async () => {
  const early = new FakeEarly();
  const { client, state, notices, started } = openPage(null, 0, early);
  const a = early.send("a"); // (none for "b": say, the list grew between the two answers)
  early.list.resolve({ runs: [{ name: "a", records: 1000 }, { name: "b", records: 1000 }] });
  await started;
  await settle();
  assert.deepEqual(client.log, ["history b 1200"]);
  a.reject(Object.assign(new Error("HTTP 503"), { status: 503 }));
  await settle();
  assert.deepEqual(client.log, ["history b 1200", "history a 1200"]);
  client.answer("history a 1200", Object.assign({}, HISTORY, { run: "a" }));
  client.answer("history b 1200", Object.assign({}, HISTORY, { run: "b" }));
  await settle();
  assert.equal(state.runs.get("a").pointCount("loss"), 3);
  assert.equal(state.runs.get("b").pointCount("loss"), 3);
  assert.deepEqual(notices, []);
});

test("a run list boot/early.js could not get is a notice, as the page's own would be", async () => {
  const early = new FakeEarly();
  const { notices, started, client } = openPage(null, 0, early);
  early.list.reject(new Error("HTTP 500"));
  await started;
  assert.deepEqual(notices, ["Could not list runs: HTTP 500"]);
  assert.ok(client.connected); // the stream's hello lists the runs later
});

test("a run fetched while others shared its charts is fetched again at twice the points when it is shown alone", async () => {
  // lib/opening.js: one point per pixel for each of several runs, two for a run drawn alone.
  let shown = 2;
  const { client, feed, state, started } = openPage(null, 0, null, () => (shown > 1 ? 430 : 860));
  client.answer("runs", { runs: [{ name: "a", records: 20000 }, { name: "b", records: 20000 }, { name: "tiny", records: 3 }] });
  await started;
  await settle();
  for (const n of ["a", "b", "tiny"]) client.answer("history " + n + " 430", Object.assign({}, HISTORY, { run: n, exact: n === "tiny" }));
  await settle();
  feed.selectionChanged(); // nothing changed: nothing asked
  assert.deepEqual(client.log.slice(4), []);
  shown = 1;
  feed.unfollow("b");
  feed.selectionChanged();
  await settle();
  // "a" again at 860; "tiny" holds every step already (exact); "b" is no longer followed
  assert.deepEqual(client.log.slice(4), ["history a 860"]);
  client.answer("history a 860", HISTORY);
  await settle();
  assert.ok(!state.streams.get("a").loading);
  feed.selectionChanged(); // asked for as many as it needs now: not again
  assert.deepEqual(client.log.slice(4), ["history a 860"]);
});
