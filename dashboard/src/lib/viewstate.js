/* The view state in the page URL's query string: parse and format, pure.
 *
 * ?run=a&run=b        runs shown (absent: every run, up to the cap; `run=` alone: none); read
 *                     also as ?runs=a,b (written as run=...)
 *  &filter=RE         run filter (regular expression on run names)
 *  &x=wall            x axis: step (default) | wall | relative
 *  &smooth=0.9        EMA weight in [0, 0.99]
 *  &zoom=1000,2000    x range in x-axis units (steps; ms since the epoch; seconds since start)
 *  &log=ID &linear=ID a chart's y scale forced (default: automatic, see yaxis.js)
 *  &outliers=ID       a chart's y range covers every point (default: outliers ignored)
 *  &hide=ID           a hidden chart;  &expand=ID  the chart shown full width and height
 * Other parameters (token, points) are kept as they are, first. Defaults are left out, so a page
 * opened plainly keeps a plain URL.
 */
(function (root, factory) {
  "use strict";
  const api = factory();
  if (typeof module !== "undefined" && module.exports) module.exports = api;
  else Object.assign((root.GradmonLib = root.GradmonLib || {}), api);
})(typeof self !== "undefined" ? self : this, function () {
  "use strict";

  const X_MODES = ["step", "wall", "relative"];
  const MAX_SMOOTHING = 0.99;
  const VIEW_KEYS = new Set(["run", "runs", "filter", "x", "smooth", "zoom", "log", "linear", "outliers", "hide", "expand"]);

  function defaultView() {
    return { runs: null, filter: "", xMode: "step", smoothing: 0, zoom: null, scale: {}, outliers: {}, hidden: [], expanded: null };
  }

  /** {view, other}: the view found in a query string ("?a=b..." or "a=b..."), and the other parameters. */
  function parseView(search) {
    const q = new URLSearchParams(search || "");
    const view = defaultView();
    const other = [];
    for (const [k, v] of q) if (!VIEW_KEYS.has(k)) other.push([k, v]);
    if (q.has("run")) view.runs = unique(q.getAll("run").filter((r) => r !== ""));
    else if (q.has("runs")) view.runs = unique((q.get("runs") || "").split(",").filter((r) => r !== "")); // a shorthand
    view.filter = q.get("filter") || "";
    const x = q.get("x");
    if (X_MODES.includes(x)) view.xMode = x;
    const s = Number(q.get("smooth"));
    if (Number.isFinite(s) && s > 0) view.smoothing = Math.min(MAX_SMOOTHING, Math.round(s * 100) / 100);
    const z = (q.get("zoom") || "").split(",").map(Number);
    if (z.length === 2 && z.every(Number.isFinite) && z[0] < z[1]) view.zoom = [z[0], z[1]];
    for (const id of q.getAll("log")) if (id) view.scale[id] = "log";
    for (const id of q.getAll("linear")) if (id) view.scale[id] = "linear";
    for (const id of q.getAll("outliers")) if (id) view.outliers[id] = "show";
    view.hidden = unique(q.getAll("hide").filter(Boolean));
    view.expanded = q.get("expand") || null;
    return { view, other };
  }

  /** The query string ("?..." or "" when nothing) for a view plus the other parameters, in a stable order. */
  function formatView(view, other) {
    const parts = [];
    const add = (k, v) => parts.push(k + "=" + enc(String(v)));
    for (const [k, v] of other || []) add(k, v);
    if (Array.isArray(view.runs)) {
      if (view.runs.length) for (const r of view.runs) add("run", r);
      else add("run", "");
    }
    if (view.filter) add("filter", view.filter);
    if (view.xMode && view.xMode !== "step") add("x", view.xMode);
    if (view.smoothing > 0) add("smooth", Number(view.smoothing.toFixed(2)));
    if (view.zoom) add("zoom", roundX(view.zoom[0]) + "," + roundX(view.zoom[1]));
    for (const id of Object.keys(view.scale || {}).sort()) add(view.scale[id] === "log" ? "log" : "linear", id);
    for (const id of Object.keys(view.outliers || {}).sort()) if (view.outliers[id] === "show") add("outliers", id);
    for (const id of view.hidden || []) add("hide", id);
    if (view.expanded) add("expand", view.expanded);
    return parts.length ? "?" + parts.join("&") : "";
  }

  /** Percent-encoding that keeps "/", "," and ":" readable (all allowed in a query). */
  function enc(s) {
    return encodeURIComponent(s).replace(/%2F/gi, "/").replace(/%2C/gi, ",").replace(/%3A/gi, ":");
  }

  /** An x bound with no float noise: at most 6 significant decimals beyond the integer part. */
  function roundX(v) {
    return Math.abs(v) >= 1e6 ? Math.round(v) : Number(v.toPrecision(10));
  }

  function unique(list) {
    return Array.from(new Set(list));
  }

  /** A chart's settings in a view: {scale: "auto"|"log"|"linear", ignoreOutliers, expanded, hidden}. */
  function panelView(view, id) {
    return { scale: view.scale[id] || "auto", ignoreOutliers: view.outliers[id] !== "show", expanded: view.expanded === id, hidden: view.hidden.includes(id) };
  }

  /**
   * Apply a change of one chart's setting to a view (in place): `what` is "scale" (value "auto" |
   * "log" | "linear"), "outliers" (value: ignore them?), "hidden" or "expanded" (booleans). Only
   * one chart is expanded at a time; hiding the expanded chart un-expands it.
   */
  function changePanel(view, id, what, value) {
    if (what === "scale") {
      if (value === "auto") delete view.scale[id];
      else view.scale[id] = value;
    } else if (what === "outliers") {
      if (value) delete view.outliers[id];
      else view.outliers[id] = "show";
    } else if (what === "hidden") {
      view.hidden = view.hidden.filter((h) => h !== id).concat(value ? [id] : []);
      if (value && view.expanded === id) view.expanded = null;
    } else if (what === "expanded") {
      view.expanded = value ? id : null;
    }
    return view;
  }

  /** Whether two views are the same (for "did the user change anything" checks). */
  function sameView(a, b) {
    return formatView(a, []) === formatView(b, []);
  }

  return { X_MODES, MAX_SMOOTHING, defaultView, parseView, formatView, sameView, panelView, changePanel };
});
