"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const { defaultView, parseView, formatView, sameView, panelView, changePanel } = require("../src/lib/viewstate.js");

test("a plain URL is the default view, and the default view formats to nothing", () => {
  assert.deepEqual(parseView("").view, defaultView());
  assert.deepEqual(parseView("?token=abc").other, [["token", "abc"]]);
  assert.equal(formatView(defaultView(), []), "");
  assert.equal(formatView(defaultView(), [["token", "abc"]]), "?token=abc");
});

test("every field round-trips through the query string", () => {
  const view = {
    runs: ["sweep/lr 3e-4", "a&b=c", "base+1"],
    filter: "^sweep/(lr|wd)",
    xMode: "relative",
    smoothing: 0.95,
    zoom: [1200.5, 3400],
    scale: { grad_norm: "log", loss: "linear" },
    outliers: { "system/rss_bytes": "show" },
    hidden: ["zscore", "clip_coef"],
    expanded: "grad_norm",
  };
  const q = formatView(view, [["token", "t0k"]]);
  assert.ok(q.startsWith("?token=t0k&run=sweep/lr%203e-4&run=a%26b%3Dc&run=base%2B1&"), q);
  const back = parseView(q);
  assert.deepEqual(back.view, view);
  assert.deepEqual(back.other, [["token", "t0k"]]);
  assert.ok(sameView(back.view, view));
  assert.equal(formatView(back.view, back.other), q); // stable
});

test("an explicit empty selection differs from the default", () => {
  const v = Object.assign(defaultView(), { runs: [] });
  assert.equal(formatView(v, []), "?run=");
  assert.deepEqual(parseView("?run=").view.runs, []);
  assert.equal(parseView("").view.runs, null);
});

test("bad values fall back to defaults instead of breaking the page", () => {
  const { view } = parseView("?x=sideways&smooth=abc&zoom=5,1&log=&hide=&run=a&run=a");
  assert.equal(view.xMode, "step");
  assert.equal(view.smoothing, 0);
  assert.equal(view.zoom, null);
  assert.deepEqual(view.scale, {});
  assert.deepEqual(view.hidden, []);
  assert.deepEqual(view.runs, ["a"]);
  assert.equal(parseView("?smooth=7").view.smoothing, 0.99);
  assert.equal(parseView("?smooth=0.333").view.smoothing, 0.33);
  assert.deepEqual(parseView("?zoom=1e3,2e3").view.zoom, [1000, 2000]);
});

test("wall-clock zoom bounds (ms since the epoch) keep millisecond precision", () => {
  const v = Object.assign(defaultView(), { xMode: "wall", zoom: [1764486000123.4, 1764486999999.6] });
  assert.deepEqual(parseView(formatView(v, [])).view.zoom, [1764486000123, 1764487000000]);
});

test("per-chart changes: scale, outliers, hidden, expanded (one at a time) and back to defaults", () => {
  const v = defaultView();
  assert.deepEqual(panelView(v, "loss"), { scale: "auto", ignoreOutliers: true, expanded: false, hidden: false });
  changePanel(v, "loss", "scale", "log");
  changePanel(v, "loss", "outliers", false);
  changePanel(v, "loss", "expanded", true);
  changePanel(v, "lr", "expanded", true);
  assert.deepEqual(panelView(v, "loss"), { scale: "log", ignoreOutliers: false, expanded: false, hidden: false });
  assert.equal(v.expanded, "lr");
  changePanel(v, "lr", "hidden", true);
  assert.deepEqual([v.hidden, v.expanded], [["lr"], null]);
  assert.equal(formatView(v, []), "?log=loss&outliers=loss&hide=lr");
  changePanel(v, "loss", "scale", "auto");
  changePanel(v, "loss", "outliers", true);
  changePanel(v, "lr", "hidden", false);
  assert.equal(formatView(v, []), "");
});

test("runs=a,b is read as a shorthand for run=a&run=b (and written in the long form)", () => {
  const { view } = parseView("runs=exp1,sweep/b");
  assert.deepEqual(view.runs, ["exp1", "sweep/b"]);
  assert.equal(formatView(view, []), "?run=exp1&run=sweep/b");
  assert.deepEqual(parseView("?run=x&runs=y").view.runs, ["x"]);
});
