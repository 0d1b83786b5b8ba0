/* Debiased exponential moving average, as TensorBoard's scalar dashboard computes it.
 *
 * Exact smoothing needs every step: an EMA over downsampled points weighs each kept point for the
 * whole bucket it stands for (the issue measured +9 % on loss, +45 % on grad norm at 0.99). The page
 * smooths over every step when it holds them (rundata.js `smoothed`); for a zoom window of a run
 * too long to hold, it fetches the window plus a lead-in of LEAD_IN_E / (1 - alpha) steps: the
 * history before the lead-in then weighs alpha^lead-in <= e^-10 (4.5e-5) in the average.
 */
(function (root, factory) {
  "use strict";
  const api = factory();
  if (typeof module !== "undefined" && module.exports) module.exports = api;
  else Object.assign((root.GradmonLib = root.GradmonLib || {}), api);
})(typeof self !== "undefined" ? self : this, function () {
  "use strict";

  /**
   * Smooth `values` with weight `alpha` in [0, 1): s_t = alpha*s_{t-1} + (1-alpha)*x_t, divided by the
   * bias correction 1 - alpha^n where n counts the finite values seen so far (the EMA starts at 0).
   *
   * Non-finite inputs pass through unchanged at their index and do not enter the average, so one NaN
   * does not poison every later point. alpha <= 0 returns a copy of the input, and so does a
   * constant series (as in TensorBoard: the average would only add rounding noise to a flat line).
   */
  function emaDebiased(values, alpha) {
    const out = new Array(values.length);
    if (!(alpha > 0) || isConstant(values)) {
      for (let i = 0; i < values.length; i++) out[i] = values[i];
      return out;
    }
    const a = Math.min(alpha, 0.999999);
    let last = 0;
    let n = 0;
    for (let i = 0; i < values.length; i++) {
      const x = values[i];
      if (typeof x !== "number" || !Number.isFinite(x)) {
        out[i] = x;
        continue;
      }
      last = last * a + (1 - a) * x;
      n++;
      out[i] = last / (1 - Math.pow(a, n));
    }
    return out;
  }

  function isConstant(values) {
    let first;
    for (const x of values) {
      if (typeof x !== "number" || !Number.isFinite(x)) continue;
      if (first === undefined) first = x;
      else if (x !== first) return false;
    }
    return true;
  }

  const LEAD_IN_E = 10;

  /** Steps of lead-in before a window for an EMA of weight `alpha` (0 when not smoothing). */
  function leadInSteps(alpha) {
    return alpha > 0 ? Math.ceil(LEAD_IN_E / (1 - Math.min(alpha, 0.999999)) - 1e-9) : 0;
  }

  /**
   * Whether a window of every step from `windowStart`, trusted from `smoothFrom` on, gives the
   * smoothed values for `alpha` within the bound: it starts at the run's first step (exact), or
   * has at least leadInSteps(alpha) steps before `smoothFrom`.
   */
  function leadInOk(windowStart, smoothFrom, firstStep, alpha) {
    if (firstStep !== null && windowStart <= firstStep) return true;
    return smoothFrom - windowStart >= leadInSteps(alpha);
  }

  return { emaDebiased, LEAD_IN_E, leadInSteps, leadInOk };
});
