/* The host-side gradient-norm spike rule: a norm above k times the rolling median of the last N. */
(function (root, factory) {
  "use strict";
  const api = factory();
  if (typeof module !== "undefined" && module.exports) module.exports = api;
  else Object.assign((root.GradmonLib = root.GradmonLib || {}), api);
})(typeof self !== "undefined" ? self : this, function () {
  "use strict";

  const DEFAULT_SPIKE_RULE = { k: 5, window: 50, minHistory: 10 };

  function median(sorted) {
    const n = sorted.length;
    const m = n >> 1;
    return n % 2 ? sorted[m] : (sorted[m - 1] + sorted[m]) / 2;
  }

  /**
   * Incremental detector. push(value) returns {spike, median} for that value, judged against the
   * previous `window` finite values (the value itself is not part of its own baseline). Non-finite
   * values are never spikes here (they are marked as non-finite) and do not enter the window. Nothing
   * is flagged before `minHistory` finite values have been seen.
   */
  class SpikeDetector {
    constructor(rule) {
      this.rule = Object.assign({}, DEFAULT_SPIKE_RULE, rule || {});
      this.recent = []; // the last `window` finite values, in arrival order
    }

    push(value) {
      if (typeof value !== "number" || !Number.isFinite(value)) return { spike: false, median: NaN };
      const { k, window, minHistory } = this.rule;
      let spike = false;
      let med = NaN;
      if (this.recent.length >= minHistory) {
        med = median(this.recent.slice().sort((x, y) => x - y));
        spike = value > k * med && med >= 0 && value > 0;
      }
      this.recent.push(value);
      if (this.recent.length > window) this.recent.shift();
      return { spike, median: med };
    }
  }

  /**
   * Apply the rule over a whole series. Returns [{index, step, value, median, ratio}] of the spikes.
   * `steps` may be omitted (indices are then used as steps).
   */
  function detectSpikes(values, steps, rule) {
    const det = new SpikeDetector(rule);
    const out = [];
    for (let i = 0; i < values.length; i++) {
      const r = det.push(values[i]);
      if (r.spike) {
        out.push({ index: i, step: steps ? steps[i] : i, value: values[i], median: r.median, ratio: values[i] / r.median });
      }
    }
    return out;
  }

  return { DEFAULT_SPIKE_RULE, SpikeDetector, detectSpikes };
});
