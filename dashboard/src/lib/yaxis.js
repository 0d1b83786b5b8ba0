/* A chart's y axis: automatic log scale, a range that ignores outliers, markers for what it clips.
 *
 * - Automatic log: when every value of the chart is > 0 and one of its series spans more than
 *   three orders of magnitude between its 1st and 99th percentiles (a regime change such as a
 *   diverged run, not one spike: a lone spike is what the outlier range and its markers are for).
 * - Ignoring outliers (the default, as in TensorBoard): the range is the 5th..95th percentile of
 *   each series' points in view (detector-flagged steps left out), widened by that span on each
 *   side, and never beyond the data. Gaussian noise (±4.9 σ) is never clipped; a spike is.
 * - Each stretch of consecutive points beyond the range gets one marker at the chart's edge
 *   (the stretch's most extreme point), so clipping never hides a spike.
 * On a log axis all of this is done on log10 of the values.
 */
(function (root, factory) {
  "use strict";
  const api = factory();
  if (typeof module !== "undefined" && module.exports) module.exports = api;
  else Object.assign((root.GradmonLib = root.GradmonLib || {}), api);
})(typeof self !== "undefined" ? self : this, function () {
  "use strict";

  const AUTO_LOG_SPAN = 1000; // three orders of magnitude
  const CORE = [0.05, 0.95];
  const SAMPLE = 4000; // values looked at per series for the log decision (a strided sample)

  /** The q-quantile (0..1) of sorted numbers, linear between neighbours. */
  function quantile(sorted, q) {
    const n = sorted.length;
    if (!n) return NaN;
    const pos = (n - 1) * q;
    const i = Math.floor(pos);
    const f = pos - i;
    return i + 1 < n ? sorted[i] + f * (sorted[i + 1] - sorted[i]) : sorted[i];
  }

  function finiteSorted(values, stride) {
    const out = [];
    for (let i = 0; i < values.length; i += stride || 1) {
      const v = values[i];
      if (typeof v === "number" && Number.isFinite(v)) out.push(v);
    }
    return out.sort((a, b) => a - b);
  }

  /**
   * Whether a chart whose series hold `valueLists` (arrays of numbers, any length) is drawn on a
   * log axis automatically: all finite values > 0 and some series spanning > 1000x (p1..p99).
   */
  function autoLog(valueLists) {
    let span = false;
    for (const values of valueLists) {
      const sorted = finiteSorted(values, Math.max(1, Math.ceil(values.length / SAMPLE)));
      if (!sorted.length) continue;
      if (sorted[0] <= 0 || !allPositive(values)) return false;
      if (quantile(sorted, 0.99) > AUTO_LOG_SPAN * quantile(sorted, 0.01)) span = true;
    }
    return span;
  }

  function allPositive(values) {
    for (const v of values) if (typeof v === "number" && Number.isFinite(v) && v <= 0) return false;
    return true;
  }

  /**
   * The y range {min, max} of a chart, or null when it has nothing to show. `series`: [{values,
   * skip}] with the points in view (`skip(i)`: leave point i out of the range, e.g. a flagged
   * step); `log`: values are drawn on a log axis (only > 0 count); `ignoreOutliers`: the robust
   * range above, else the full extent.
   */
  function yRange(series, log, ignoreOutliers) {
    const t = log ? Math.log10 : (v) => v;
    let lo = Infinity;
    let hi = -Infinity;
    let dataLo = Infinity;
    let dataHi = -Infinity;
    for (const s of series) {
      const kept = [];
      for (let i = 0; i < s.values.length; i++) {
        const v = s.values[i];
        if (typeof v !== "number" || !Number.isFinite(v) || (log && v <= 0)) continue;
        const y = t(v);
        dataLo = Math.min(dataLo, y);
        dataHi = Math.max(dataHi, y);
        if (!(s.skip && s.skip(i))) kept.push(y);
      }
      if (!kept.length) continue;
      kept.sort((a, b) => a - b);
      if (!ignoreOutliers) {
        lo = Math.min(lo, kept[0]);
        hi = Math.max(hi, kept[kept.length - 1]);
        continue;
      }
      const a = quantile(kept, CORE[0]);
      const b = quantile(kept, CORE[1]);
      lo = Math.min(lo, Math.max(kept[0], a - (b - a)));
      hi = Math.max(hi, Math.min(kept[kept.length - 1], b + (b - a)));
    }
    if (!Number.isFinite(lo)) {
      if (!Number.isFinite(dataLo)) return null;
      lo = dataLo; // only flagged points: show them
      hi = dataHi;
    }
    if (!ignoreOutliers) {
      lo = Math.min(lo, dataLo);
      hi = Math.max(hi, dataHi);
    }
    const pad = hi > lo ? 0.04 * (hi - lo) : Math.abs(hi) * 0.05 || 1;
    let min = lo - pad;
    let max = hi + pad;
    if (!log && lo >= 0 && min < 0) min = 0; // a non-negative quantity does not get a negative axis
    if (log) {
      min = Math.pow(10, min);
      max = Math.pow(10, max);
    }
    return { min, max };
  }

  /**
   * One marker per stretch of consecutive points beyond [min, max]: [{index, step, x, value,
   * count, side: "above"|"below"}] where `index` is the stretch's most extreme point. `points` are
   * [x, y, step] with y null for a gap (a gap ends a stretch).
   */
  function clippedStretches(points, min, max) {
    const out = [];
    let cur = null;
    for (let i = 0; i < points.length; i++) {
      const y = points[i][1];
      const side = y === null || y === undefined ? null : y > max ? "above" : y < min ? "below" : null;
      if (cur && side !== cur.side) {
        out.push(cur);
        cur = null;
      }
      if (!side) continue;
      if (!cur) cur = { side, index: i, count: 0 };
      cur.count++;
      const best = points[cur.index][1];
      if (side === "above" ? y > best : y < best) cur.index = i;
    }
    if (cur) out.push(cur);
    return out.map((c) => ({ index: c.index, step: points[c.index][2], x: points[c.index][0], value: points[c.index][1], count: c.count, side: c.side }));
  }

  return { AUTO_LOG_SPAN, quantile, autoLog, yRange, clippedStretches };
});
