/* In-memory data of one run: step-sorted series per field, marks, headers, cursor.
 *
 * History (possibly downsampled) and live records merge into the same step-keyed series, so a
 * record seen twice (reconnect, resubscribe races) replaces itself instead of duplicating. Memory is
 * bounded: over `cap` points a series decimates its older half with min/max preservation.
 */
(function (root, factory) {
  "use strict";
  const isNode = typeof module !== "undefined" && module.exports;
  const deps = isNode
    ? Object.assign({}, require("./schema.js"), require("./jsonl.js"), require("./decimate.js"), require("./spikes.js"))
    : root.GradmonLib;
  const api = factory(deps);
  if (isNode) module.exports = api;
  else Object.assign((root.GradmonLib = root.GradmonLib || {}), api);
})(typeof self !== "undefined" ? self : this, function (lib) {
  "use strict";

  const DEFAULT_CAP = 20000;
  // Step-record keys that are not curves: identity, bookkeeping, time, and flags (booleans, or 0/1
  // from a server).
  const NOT_CURVES = new Set(["type", ...lib.SCHEMA.NOT_SERIES, ...lib.SCHEMA.FLAG_FIELDS]);
  const MAX_MARKS = 5000;
  const MAX_EVENTS = 1000;

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
    constructor(cap) {
      this.cap = cap || DEFAULT_CAP;
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

  /** Everything the page keeps of one run. */
  class RunData {
    constructor(name, options) {
      const opts = options || {};
      this.name = name;
      this.cap = opts.cap || DEFAULT_CAP;
      this.spikeRule = opts.spikeRule;
      this.reset();
    }

    reset() {
      this.series = new Map();
      this.marks = new Map(); // "kind:step" -> {kind, step, field, value, sources: [...]}
      this.events = [];
      this.headers = [];
      this.cursor = null;
      this.exact = true; // the base series hold every step (false after a downsampled history)
      this.detail = null; // exact window fetched on zoom: {start, end, series: Map}
      this.ended = null;
      this.layers = null; // the latest `layers` record (per-parameter top-k table), decoded
      this.skippedLines = 0;
      this.malformed = 0;
      this.version = 0;
      this.detector = new lib.SpikeDetector(this.spikeRule);
      this.ruleSpikeSteps = new Set();
    }

    get header() {
      return this.headers.length ? this.headers[this.headers.length - 1] : null;
    }

    get maxNorm() {
      const h = this.header;
      return h && typeof h.max_norm === "number" && Number.isFinite(h.max_norm) ? h.max_norm : null;
    }

    get lastStep() {
      let last = -Infinity;
      for (const [name, s] of this.series) if (name !== "ts" && s.length) last = Math.max(last, s.steps[s.length - 1]);
      return Number.isFinite(last) ? last : null;
    }

    get firstStep() {
      let first = Infinity;
      for (const [name, s] of this.series) if (name !== "ts" && s.length) first = Math.min(first, s.steps[0]);
      return Number.isFinite(first) ? first : null;
    }

    /** Chartable field names (train fields bare, eval fields as "eval/<name>", system as "system/<name>"). */
    fields() {
      return Array.from(this.series.keys()).filter((f) => f !== "ts" && this.series.get(f).length > 0);
    }

    get(field) {
      let s = this.series.get(field);
      if (!s) {
        s = new Series(this.cap);
        this.series.set(field, s);
      }
      return s;
    }

    pointCount(field) {
      const s = this.series.get(field);
      return s ? s.length : 0;
    }

    _keep() {
      return (step) => this.marks.has("spike:" + step) || this.marks.has("skip:" + step);
    }

    _put(field, step, value) {
      this.get(field).put(step, value, this._keep());
    }

    addMark(kind, step, field, value, source) {
      // One spike/skip mark per step; non-finite marks per field (loss and norm can both be NaN).
      const key = kind === "nonfinite" ? "nonfinite:" + field + ":" + step : kind + ":" + step;
      const m = this.marks.get(key);
      if (m) {
        if (!m.sources.includes(source)) m.sources.push(source);
        if (m.value === undefined && value !== undefined) m.value = value;
        return m;
      }
      const mark = { kind, step, field, value, sources: [source] };
      this.marks.set(key, mark);
      if (this.marks.size > MAX_MARKS) this.marks.delete(this.marks.keys().next().value);
      return mark;
    }

    /** Marks of a kind ("spike", "nonfinite", "skip"), sorted by step. */
    marksOf(kind) {
      const out = [];
      for (const m of this.marks.values()) if (m.kind === kind) out.push(m);
      return out.sort((a, b) => a.step - b.step);
    }

    _ruleSpike(step, value) {
      if (typeof value !== "number") return;
      const r = this.detector.push(value);
      if (r.spike) {
        const m = this.addMark("spike", step, "grad_norm", value, "rule");
        m.median = r.median;
      }
    }

    /** Take one decoded or wire record (non-finite strings are decoded here). Returns true if it changed data. */
    ingestRecord(wire) {
      const rec = lib.decodeNonFinite(wire);
      if (lib.recordError(rec)) {
        this.skippedLines++;
        return false;
      }
      this.version++;
      switch (rec.type) {
        case "step":
          this._ingestStep(rec);
          return true;
        case "eval":
        case "system":
          if (typeof rec.step !== "number") return false;
          for (const k of Object.keys(rec)) {
            const v = rec[k];
            if (typeof v !== "number" || NOT_CURVES.has(k)) continue;
            this._put(rec.type + "/" + k, rec.step, v);
          }
          return true;
        case "header":
          this.headers.push(rec);
          this.ended = null;
          return true;
        case "event":
          this._ingestEvent(rec);
          return true;
        case "end":
          this.ended = rec;
          return true;
        case "layers":
          return this._setLayers(rec);
        default:
          return false; // unknown record types are ignored (forward compatibility)
      }
    }

    /**
     * Keep the latest `layers` record in file order (a resumed run's lower step still wins; records
     * re-sent after a resubscribe end with the newest one again).
     */
    _setLayers(rec) {
      if (!rec || !Array.isArray(rec.top)) return false;
      this.layers = rec;
      return true;
    }

    _ingestStep(rec) {
      const step = rec.step;
      const g = this.series.get("grad_norm");
      const newNorm = !g || !g.length || step > g.steps[g.length - 1]; // a replayed step is not judged twice
      if (typeof rec.ts === "number") this._put("ts", step, rec.ts);
      if (rec.spike === true) this.addMark("spike", step, "grad_norm", rec.grad_norm, "cell");
      if (rec.skipped === true) this.addMark("skip", step, "grad_norm", rec.grad_norm, "cell");
      for (const k of Object.keys(rec)) {
        const v = rec[k];
        if (typeof v !== "number" || NOT_CURVES.has(k)) continue;
        this._put(k, step, v);
        if (!Number.isFinite(v)) this.addMark("nonfinite", step, k, v, "cell");
      }
      if (typeof rec.grad_norm === "number" && newNorm) this._ruleSpike(step, rec.grad_norm);
    }

    _ingestEvent(rec) {
      this.events.push(rec);
      if (this.events.length > MAX_EVENTS) this.events.shift();
      if (typeof rec.step === "number" && (rec.kind === "spike" || rec.kind === "skip" || rec.kind === "nonfinite")) {
        const value = typeof rec.grad_norm === "number" ? rec.grad_norm : undefined;
        this.addMark(rec.kind, rec.step, "grad_norm", value, "event");
      }
    }

    /**
     * Replace everything with a /history response (see docs/protocol.md). `info` (the run's
     * /api/runs entry) supplies first_ts/last_ts to place history steps in time when the response
     * carries no `ts` series (linear between the first and last step).
     */
    loadHistory(resp, info) {
      const keepSkipped = this.skippedLines;
      this.reset();
      this.skippedLines = keepSkipped;
      this.cursor = resp.cursor || null;
      this.exact = resp.exact !== false;
      for (const m of resp.marks || []) {
        const v = lib.decodeNumber(m.value);
        this.addMark(m.kind, m.step, m.field || "grad_norm", v, "server");
      }
      for (const h of resp.headers || []) this.headers.push(lib.decodeNonFinite(h));
      for (const e of resp.events || []) this._ingestEvent(lib.decodeNonFinite(e));
      const keep = this._keep();
      const load = (prefix, group) => {
        for (const name of Object.keys(group || {})) {
          if (prefix === "" && NOT_CURVES.has(name) && name !== "ts") continue;
          const s = group[name];
          const values = decodeArray(s.value);
          this.get(prefix + name).setAll(s.step || [], values, keep);
          s.step.forEach((st, i) => {
            if (!Number.isFinite(values[i])) this.addMark("nonfinite", st, prefix + name, values[i], "server");
          });
        }
      };
      load("", resp.series);
      load("eval/", resp.eval);
      load("system/", resp.system);
      if (resp.layers) this._setLayers(lib.decodeNonFinite(resp.layers));
      const ts = this.series.get("ts");
      if ((!ts || !ts.length) && info && typeof info.first_ts === "number" && typeof info.last_ts === "number") {
        const a = this.firstStep;
        const b = this.lastStep;
        if (a !== null && b !== null) this.get("ts").setAll(a === b ? [a] : [a, b], a === b ? [info.last_ts] : [info.first_ts, info.last_ts]);
      }
      this.malformed = typeof resp.malformed === "number" ? resp.malformed : 0;
      const g = this.series.get("grad_norm");
      if (g) for (let i = 0; i < g.length; i++) this._ruleSpike(g.steps[i], g.values[i]);
      this.version++;
    }

    /** Keep an exact (or finer) window of a zoomed range; pass null to drop it. */
    setDetail(resp) {
      if (!resp) {
        this.detail = null;
        this.version++;
        return;
      }
      const series = new Map();
      const add = (prefix, group) => {
        for (const name of Object.keys(group || {})) {
          if (prefix === "" && NOT_CURVES.has(name) && name !== "ts") continue;
          series.set(prefix + name, { start: resp.start, end: resp.end, steps: group[name].step || [], values: decodeArray(group[name].value) });
        }
      };
      add("", resp.series);
      add("eval/", resp.eval);
      add("system/", resp.system);
      for (const m of resp.marks || []) this.addMark(m.kind, m.step, m.field || "grad_norm", lib.decodeNumber(m.value), "server");
      this.detail = { start: resp.start, end: resp.end, exact: resp.exact !== false, series };
      this.version++;
    }

    /** The points to draw for `field`: the base series with the zoom window spliced in. */
    view(field) {
      const s = this.series.get(field);
      const base = s ? { steps: s.steps, values: s.values } : { steps: [], values: [] };
      const win = this.detail && this.detail.series.get(field);
      return win && win.start !== undefined && win.end !== undefined ? spliceWindow(base.steps, base.values, win) : base;
    }

    /** Value of `field` at `step`: exact point, else the nearest one (flagged approx). */
    valueAt(field, step) {
      const v = this.view(field);
      if (!v.steps.length) return null;
      const i = lowerBound(v.steps, step);
      if (v.steps[i] === step) return { step, value: v.values[i], exact: true };
      let j = i >= v.steps.length ? v.steps.length - 1 : i;
      if (i > 0 && i < v.steps.length && step - v.steps[i - 1] < v.steps[i] - step) j = i - 1;
      return { step: v.steps[j], value: v.values[j], exact: false };
    }

    /** Wall time of `step` (Unix s), interpolated between known points; NaN when no times are known. */
    tsAt(step) {
      const s = this.series.get("ts");
      if (!s || !s.length) return NaN;
      const i = lowerBound(s.steps, step);
      if (s.steps[i] === step) return s.values[i];
      if (i === 0) return s.values[0] - (s.length > 1 ? (s.steps[0] - step) * slope(s, 0) : 0);
      if (i >= s.length) return s.values[s.length - 1] + (s.length > 1 ? (step - s.steps[s.length - 1]) * slope(s, s.length - 2) : 0);
      const f = (step - s.steps[i - 1]) / (s.steps[i] - s.steps[i - 1]);
      return s.values[i - 1] + f * (s.values[i] - s.values[i - 1]);
    }

    /** Step at wall time `ts` (inverse of tsAt, for zoom ranges in time modes). */
    stepAtTs(ts) {
      const s = this.series.get("ts");
      if (!s || !s.length) return NaN;
      const i = lowerBound(s.values, ts);
      if (i === 0) return s.steps[0];
      if (i >= s.length) return s.steps[s.length - 1];
      const f = (ts - s.values[i - 1]) / (s.values[i] - s.values[i - 1] || 1);
      return s.steps[i - 1] + f * (s.steps[i] - s.steps[i - 1]);
    }

    /** Start time of the run (first header's start_time, else the first step's ts). */
    get startTime() {
      for (const h of this.headers) if (typeof h.start_time === "number") return h.start_time;
      const s = this.series.get("ts");
      return s && s.length ? s.values[0] : NaN;
    }
  }

  function slope(s, i) {
    const ds = s.steps[i + 1] - s.steps[i];
    return ds ? (s.values[i + 1] - s.values[i]) / ds : 0;
  }

  return { DEFAULT_CAP, NOT_CURVES, lowerBound, Series, RunData, spliceWindow };
});
