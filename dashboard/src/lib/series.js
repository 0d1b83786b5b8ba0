/* Step-sorted series: one point per step, bounded memory. Pure; RunData (rundata.js) holds them.
 *
 * History (possibly downsampled) and live records merge into the same step-keyed series, so a
 * record seen twice (reconnect, resubscribe races) replaces itself instead of duplicating. Memory is
 * bounded: over `cap` points a series decimates its older half with min/max preservation.
 */
(function (root, factory) {
  "use strict";
  const isNode = typeof module !== "undefined" && module.exports;
  const deps = isNode
    ? Object.assign({}, require("./jsonl.js"), require("./decimate.js"))
    : root.GradmonLib;
  const api = factory(deps);
  if (isNode) module.exports = api;
  else Object.assign((root.GradmonLib = root.GradmonLib || {}), api);
})(typeof self !== "undefined" ? self : this, function (lib) {
  "use strict";

  const DEFAULT_CAP = 20000;

  /** First index i with arr[i] >= x (arr sorted ascending). */
  function lowerBound(arr, x) {
    let lo = 0;
    let hi = arr.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (arr[mid] < x) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }

  /** Points (step, value) sorted by step, one per step. */
  class Series {
    constructor(cap, onCompact) {
      this.cap = cap || DEFAULT_CAP;
      this.onCompact = onCompact || null; // told when decimation drops points (the series is no longer every step)
      this.steps = [];
      this.values = [];
      this.version = 0; // bumped on every change, for render caches
    }

    get length() {
      return this.steps.length;
    }

    /** Insert or replace the point at `step`. `keep(step)` marks steps decimation must keep. */
    put(step, value, keep) {
      const n = this.steps.length;
      if (n === 0 || step > this.steps[n - 1]) {
        this.steps.push(step);
        this.values.push(value);
      } else {
        const i = lowerBound(this.steps, step);
        if (this.steps[i] === step) this.values[i] = value;
        else {
          this.steps.splice(i, 0, step);
          this.values.splice(i, 0, value);
        }
      }
      this.version++;
      if (this.steps.length > this.cap) this.compact(keep);
    }

    /** Replace everything with parallel arrays (sorted and deduplicated here, last one wins). */
    setAll(steps, values, keep) {
      const order = steps.map((_, i) => i).sort((a, b) => steps[a] - steps[b] || a - b);
      this.steps = [];
      this.values = [];
      for (const i of order) {
        const n = this.steps.length;
        if (n && this.steps[n - 1] === steps[i]) this.values[n - 1] = values[i];
        else {
          this.steps.push(steps[i]);
          this.values.push(values[i]);
        }
      }
      this.version++;
      if (this.steps.length > this.cap) this.compact(keep);
    }

    /** Decimate the older half to a quarter of the cap, keeping min/max, non-finite and kept steps. */
    compact(keep) {
      const n = this.steps.length;
      const half = Math.floor(n - this.cap / 2);
      const old = lib.decimateMinMax(
        this.steps.slice(0, half),
        this.values.slice(0, half),
        Math.max(4, Math.floor(this.cap / 4)),
        keep ? (i) => keep(this.steps[i]) : undefined,
      );
      this.steps = old.steps.concat(this.steps.slice(half));
      this.values = old.values.concat(this.values.slice(half));
      this.version++;
      if (this.onCompact) this.onCompact();
    }

    /** Drop the points at steps in [from, to] (a resumed run rolled back: a newer segment replaces them). */
    removeRange(from, to) {
      const i = lowerBound(this.steps, from);
      const j = lowerBound(this.steps, to + 1e-9);
      if (i >= j) return false;
      this.steps.splice(i, j - i);
      this.values.splice(i, j - i);
      this.version++;
      return true;
    }

    indexOf(step) {
      const i = lowerBound(this.steps, step);
      return this.steps[i] === step ? i : -1;
    }

    /** Value at the point nearest to `step`: {step, value} or null when empty. */
    nearest(step) {
      const n = this.steps.length;
      if (!n) return null;
      const i = lowerBound(this.steps, step);
      let j = i;
      if (i >= n) j = n - 1;
      else if (i > 0 && step - this.steps[i - 1] < this.steps[i] - step) j = i - 1;
      return { step: this.steps[j], value: this.values[j] };
    }
  }

  /** Merge a base series with an exact window [start, end]: base outside, window inside. */
  function spliceWindow(baseSteps, baseValues, win) {
    if (!win) return { steps: baseSteps, values: baseValues };
    const a = lowerBound(baseSteps, win.start);
    const b = lowerBound(baseSteps, win.end + 1e-9);
    return {
      steps: baseSteps.slice(0, a).concat(win.steps, baseSteps.slice(b)),
      values: baseValues.slice(0, a).concat(win.values, baseValues.slice(b)),
    };
  }

  function decodeArray(arr) {
    return (arr || []).map((v) => {
      const d = lib.decodeNumber(v);
      return d === undefined ? NaN : d;
    });
  }

  function slope(s, i) {
    const ds = s.steps[i + 1] - s.steps[i];
    return ds ? (s.values[i + 1] - s.values[i]) / ds : 0;
  }

  return { DEFAULT_CAP, lowerBound, Series, spliceWindow, decodeArray, slope };
});
