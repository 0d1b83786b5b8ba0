/* Loading a run's server answers into its RunData (rundata.js): a whole-run /history response
 * replaces everything, a zoom window is kept beside the base series (docs/protocol.md). Pure:
 * functions of a RunData and a decoded response.
 */
(function (root, factory) {
  "use strict";
  const isNode = typeof module !== "undefined" && module.exports;
  const deps = isNode ? Object.assign({}, require("./jsonl.js"), require("./series.js")) : root.GradmonLib;
  const api = factory(deps);
  if (isNode) module.exports = api;
  else Object.assign((root.GradmonLib = root.GradmonLib || {}), api);
})(typeof self !== "undefined" ? self : this, function (lib) {
  "use strict";

  /** Each series of a response's groups (train fields bare, eval/ and system/ prefixed) that is a curve. */
  function forEachSeries(resp, notCurves, fn) {
    for (const [prefix, group] of [["", resp.series], ["eval/", resp.eval], ["system/", resp.system]]) {
      for (const name of Object.keys(group || {})) {
        if (prefix === "" && notCurves.has(name) && name !== "ts") continue;
        fn(prefix, name, group[name].step || [], lib.decodeArray(group[name].value));
      }
    }
  }

  /**
   * Replace everything `run` holds with a whole-run /history response. `info` (the run's /api/runs
   * entry) supplies first_ts/last_ts to place history steps in time when the response carries no
   * `ts` series (linear between the first and last step).
   */
  function loadHistory(run, resp, info) {
    const keepSkipped = run.skippedLines;
    run.reset();
    run.skippedLines = keepSkipped;
    run.cursor = resp.cursor || null;
    run.segments.fromServer = true;
    for (const m of resp.marks || []) run.noted.addServerMark(m);
    for (const h of resp.headers || []) run.addHeader(lib.decodeNonFinite(h));
    // The history already applied the latest-segment rule; live steps of the latest segment
    // extend its cover from its last step on (unknown from an older server: from the next step).
    run.segments.continueFrom(resp.latest_segment);
    for (const e of resp.events || []) run.noted.addEvent(lib.decodeNonFinite(e));
    const keep = (step) => run.flagged(step);
    run.exact = true;
    forEachSeries(resp, run.notCurves, (prefix, name, steps, values) => {
      const series = run.get(prefix + name);
      series.setAll(steps, values, keep);
      if (series.length) run.segments.held(series.steps[series.length - 1]);
      steps.forEach((st, i) => {
        if (Number.isFinite(values[i]) || (prefix === "" && name !== "loss" && run.overflowAt(st))) return;
        run.addMark("nonfinite", st, prefix + name, values[i], "server");
      });
    });
    if (resp.exact === false) run.exact = false;
    if (resp.layers) run.setLayers(lib.decodeNonFinite(resp.layers));
    const ts = run.series.get("ts");
    if ((!ts || !ts.length) && info && typeof info.first_ts === "number" && typeof info.last_ts === "number") {
      const a = run.firstStep;
      const b = run.lastStep;
      if (a !== null && b !== null) run.get("ts").setAll(a === b ? [a] : [a, b], a === b ? [info.last_ts] : [info.first_ts, info.last_ts]);
    }
    run.malformed = typeof resp.malformed === "number" ? resp.malformed : 0;
    run.segments.fromServer = false;
    run.version++;
  }

  /**
   * Keep a window of a zoomed range on `run` (resp null drops it). `smoothFrom`: the first step
   * whose smoothed value is trusted (the window was fetched with a lead-in before it), when known.
   */
  function setDetail(run, resp, smoothFrom) {
    if (!resp) {
      run.detail = null;
      run.version++;
      return;
    }
    const series = new Map();
    forEachSeries(resp, run.notCurves, (prefix, name, steps, values) => {
      series.set(prefix + name, { start: resp.start, end: resp.end, steps, values });
    });
    run.segments.fromServer = true;
    for (const m of resp.marks || []) run.noted.addServerMark(m);
    run.segments.fromServer = false;
    const exact = resp.exact !== false;
    run.detail = { start: resp.start, end: resp.end, exact, smoothFrom: exact ? smoothFrom : undefined, series };
    run.version++;
  }

  return { loadHistory, setDetail };
});
