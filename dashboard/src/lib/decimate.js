/* Min/max-preserving decimation: bounded memory without hiding spikes or non-finite values. */
(function (root, factory) {
  "use strict";
  const api = factory();
  if (typeof module !== "undefined" && module.exports) module.exports = api;
  else Object.assign((root.GradmonLib = root.GradmonLib || {}), api);
})(typeof self !== "undefined" ? self : this, function () {
  "use strict";

  /**
   * Reduce parallel arrays (`steps`, `values`, optional `extra`) to about `target` points.
   *
   * The input is cut into consecutive buckets of equal count; each bucket keeps its first, last,
   * minimum and maximum finite points (so a spike — a bucket maximum — always survives, unlike LTTB),
   * every non-finite point, and every index for which `keep(i)` is true (flagged steps). Order is
   * preserved. Returns {steps, values, extra, kept} where `kept` are the chosen input indices.
   * When the input already has <= target points it is returned as is (copied).
   */
  function decimateMinMax(steps, values, target, keep, extra) {
    const n = values.length;
    if (n <= target || target < 4) {
      const all = Array.from({ length: n }, (_, i) => i);
      return pick(steps, values, extra, all);
    }
    const buckets = Math.max(1, Math.floor(target / 4));
    const size = n / buckets;
    const kept = [];
    for (let b = 0; b < buckets; b++) {
      const lo = Math.floor(b * size);
      const hi = Math.min(n, Math.floor((b + 1) * size));
      if (hi <= lo) continue;
      let iMin = -1;
      let iMax = -1;
      const chosen = new Set([lo, hi - 1]);
      for (let i = lo; i < hi; i++) {
        const v = values[i];
        if (typeof v !== "number" || !Number.isFinite(v) || (keep && keep(i))) {
          chosen.add(i);
          continue;
        }
        if (iMin < 0 || v < values[iMin]) iMin = i;
        if (iMax < 0 || v > values[iMax]) iMax = i;
      }
      if (iMin >= 0) chosen.add(iMin);
      if (iMax >= 0) chosen.add(iMax);
      for (const i of Array.from(chosen).sort((x, y) => x - y)) kept.push(i);
    }
    return pick(steps, values, extra, kept);
  }

  function pick(steps, values, extra, idx) {
    return {
      steps: idx.map((i) => steps[i]),
      values: idx.map((i) => values[i]),
      extra: extra ? idx.map((i) => extra[i]) : undefined,
      kept: idx,
    };
  }

  return { decimateMinMax };
});
