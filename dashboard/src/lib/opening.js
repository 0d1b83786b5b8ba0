/* What the page asks the server for as it opens, decided before any chart exists: by boot/early.js,
 * which sends those requests while the page's scripts are still being parsed, and by the page itself
 * (app/feed.js, app/charts.js), which asks the same. Pure.
 */
(function (root, factory) {
  "use strict";
  const isNode = typeof module !== "undefined" && module.exports;
  const deps = isNode ? Object.assign({}, require("./viewstate.js"), require("./runtable.js")) : root.GradmonLib;
  const api = factory(deps);
  if (isNode) module.exports = api;
  else Object.assign((root.GradmonLib = root.GradmonLib || {}), api);
})(typeof self !== "undefined" ? self : this, function (lib) {
  "use strict";

  // The chart grid (style.css): columns of minmax(min(100%, 440px), 1fr) with 12 px gaps; a
  // chart is its card less 16 px of padding.
  const CARD_MIN_PX = 440;
  const GAP_PX = 12;
  const CARD_PADDING_PX = 16;

  /** The width (px) a chart will get in a grid `containerWidth` px wide (0: not laid out, 900 assumed). */
  function chartWidthIn(containerWidth) {
    const w = containerWidth || 900;
    const cols = Math.max(1, Math.floor((w + GAP_PX) / (CARD_MIN_PX + GAP_PX)));
    return Math.max(240, Math.floor((w - GAP_PX * (cols - 1)) / cols) - CARD_PADDING_PX);
  }

  /**
   * Points a chart draws per pixel of its width for each run: two for one run, one each when
   * several runs share it (the min/max decimation keeps every spike and non-finite point either
   * way). The page draws (app/charts.js) and asks the server (historyPoints) by this one rule.
   */
  function pointsPerPixel(runs) {
    return runs > 1 ? 1 : 2;
  }

  /**
   * History points per request: the URL's `points=N` (N >= 4), else pointsPerPixel(`runs`, the
   * runs shown; absent: one) times the chart width: what the charts draw, no more.
   */
  function historyPoints(chartWidth, asked, runs) {
    if (asked >= 4) return Math.round(asked);
    return Math.max(200, Math.min(8000, Math.round(pointsPerPixel(runs) * chartWidth)));
  }

  /**
   * What a page opened at `search` (location.search) asks for before its run list comes: {token,
   * named (the runs the URL names, or null: the default selection), smoothing, points (the URL's
   * `points`, NaN when absent)}. `early`: whether history requests may go out before the page
   * knows the runs' sizes (not with smoothing on: then a small run is fetched at full resolution).
   */
  function openingPlan(search) {
    const { view, other } = lib.parseView(search);
    const param = (k) => other.filter(([key]) => key === k).map(([, v]) => v)[0];
    return {
      token: param("token") || null,
      named: view.runs,
      smoothing: view.smoothing,
      points: Number(param("points")),
      early: !(view.smoothing > 0),
    };
  }

  /**
   * The runs whose histories go out as soon as the run list (`infos`) is in: those the URL names
   * that the list has, or the default selection; none with smoothing on (plan.early).
   */
  function runsAfterList(plan, infos) {
    if (!plan.early) return [];
    const list = infos || [];
    if (plan.named === null) return lib.defaultSelection(list, lib.DEFAULT_RUN_CAP);
    const listed = new Set(list.map((i) => i.name));
    return plan.named.filter((n) => listed.has(n));
  }

  /** Path of a run's API resource; run names may contain "/" (sub-directories): each segment is encoded. */
  function runPath(name, tail) {
    return "/api/runs/" + name.split("/").map(encodeURIComponent).join("/") + tail;
  }

  /** The URL of an API `path` relative to the page at `base`, with `params` (null/undefined left out) and the token. */
  function apiUrl(base, path, params, token) {
    const u = new URL(path, base);
    for (const [k, v] of Object.entries(params || {})) if (v !== undefined && v !== null) u.searchParams.set(k, String(v));
    if (token) u.searchParams.set("token", token);
    return u.toString();
  }

  return { chartWidthIn, historyPoints, pointsPerPixel, openingPlan, runsAfterList, runPath, apiUrl };
});
