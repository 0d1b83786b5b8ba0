/* The rehearsal chart: a small made-up run that the page draws once, off screen, while the first
 * history answers are still on their way (app/rehearsal.js). The first chart a fresh page draws
 * costs several times what the next ones do (ECharts' and the page's functions are compiled and
 * their caches filled on first use); drawn while the page would otherwise wait, that cost is off
 * the path to the first viewport. Pure: the run, as a /history answer (docs/protocol.md).
 */
(function (root, factory) {
  "use strict";
  const isNode = typeof module !== "undefined" && module.exports;
  const api = factory();
  if (isNode) module.exports = api;
  else Object.assign((root.GradmonLib = root.GradmonLib || {}), api);
})(typeof self !== "undefined" ? self : this, function () {
  "use strict";

  const REHEARSAL_RUN = "rehearsal";
  // The chart rehearsed: the one with every kind of mark (spike rings, skip diamonds, non-finite
  // triangles, the clip threshold's line), on a log y axis (its norm spans decades).
  const REHEARSAL_PANEL = "grad_norm";

  /**
   * A /history answer for `n` steps (>= 40): loss (with an eval curve), grad_norm spanning four
   * decades with a NaN, an outlier, a spike and a skip mark, and a rollback; a header with max_norm. Enough
   * points (`n` > the chart's `maxPoints`) that the decimation runs too.
   */
  function rehearsalHistory(n) {
    const count = Math.max(40, Math.floor(n || 240));
    const nan = Math.floor(count * 0.7);
    const outlier = Math.floor(count * 0.9); // beyond the y range (outliers ignored): an edge marker
    const steps = [];
    const loss = [];
    const norm = [];
    const ts = [];
    for (let s = 1; s <= count; s++) {
      steps.push(s);
      loss.push(2 + 8 * Math.exp(-s / 30) + 0.05 * Math.sin(s * 1.7));
      norm.push(s === nan ? "NaN" : s === outlier ? 1e6 : 0.01 * Math.pow(10, 4 * (1 - s / count)) * (1 + 0.2 * Math.cos(s * 2.3)));
      ts.push(1.7e9 + s);
    }
    const spike = Math.floor(count / 2);
    const skip = Math.floor(count * 0.6);
    const evalSteps = steps.filter((s) => s % 20 === 0);
    return {
      run: REHEARSAL_RUN,
      exact: true,
      start: 1,
      end: count,
      series: {
        loss: { step: steps, value: loss },
        grad_norm: { step: steps, value: norm },
        ts: { step: steps, value: ts },
      },
      eval: { loss: { step: evalSteps, value: evalSteps.map((s) => 2.2 + 8 * Math.exp(-s / 30)) } },
      system: {},
      marks: [
        { step: spike, kind: "spike", field: "grad_norm", value: 50 },
        { step: skip, kind: "skip", field: "grad_norm", value: norm[skip - 1] },
      ],
      events: [{ type: "event", kind: "rollback", step: Math.floor(count / 4), ts: 1.7e9 + count / 4, message: "rehearsal" }],
      headers: [{ type: "header", schema: 1, run_id: REHEARSAL_RUN, start_time: 1.7e9, max_norm: 1.0 }],
      latest_segment: { first_step: 1, last_step: count },
      malformed: 0,
    };
  }

  return { REHEARSAL_RUN, REHEARSAL_PANEL, rehearsalHistory };
});
