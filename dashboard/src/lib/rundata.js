/* Everything the page keeps of one run: a series per field, headers, cursor, and (runmarks.js) its
 * marks and events. Pure.
 *
 * History (possibly downsampled) and live records merge by step (series.js); server answers are
 * loaded by runload.js. A resumed run's new segment (a header, then steps that go back) replaces
 * what older segments logged at the steps it covers, from its first step to its last, as the
 * server's history does (docs/format.md): the older steps after a rollback's last step stay.
 */
(function (root, factory) {
  "use strict";
  const isNode = typeof module !== "undefined" && module.exports;
  const deps = isNode
    ? Object.assign({}, require("./schema.js"), require("./jsonl.js"), require("./series.js"), require("./smoothing.js"),
      require("./segments.js"), require("./alarms.js"), require("./runmarks.js"), require("./runload.js"))
    : root.GradmonLib;
  const api = factory(deps);
  if (isNode) module.exports = api;
  else Object.assign((root.GradmonLib = root.GradmonLib || {}), api);
})(typeof self !== "undefined" ? self : this, function (lib) {
  "use strict";

  // Step-record keys that are not curves: identity, bookkeeping, time, and flags (booleans, or 0/1
  // from a server).
  const NOT_CURVES = new Set(["type", ...lib.SCHEMA.NOT_SERIES, ...lib.SCHEMA.FLAG_FIELDS]);
  const MARK_FLAGS = lib.SCHEMA.MARK_FLAGS;
  const OVERFLOW = lib.SCHEMA.OVERFLOW_REASON;
  const lowerBound = lib.lowerBound;

  class RunData {
    constructor(name, options) {
      const opts = options || {};
      this.name = name;
      this.cap = opts.cap || lib.DEFAULT_CAP;
      // Bumped on every change, never reset (redraw keys: a reload must not repeat an older key).
      this.version = 0;
      this.layersVersion = 0; // bumped whenever `layers` is set
      this.reset();
    }

    reset() {
      this.series = new Map();
      this.headers = [];
      this.headerKeys = new Set();
      this.segments = new lib.SegmentCover(); // which steps a new segment replaces (segments.js)
      this.noted = new lib.RunMarks(this.segments); // marks and events (runmarks.js)
      this.cursor = null;
      this.exact = true; // the base series hold every step of the run (false when downsampled or decimated)
      this.detail = null; // a window fetched on zoom: {start, end, exact, smoothFrom, series: Map}
      this.ended = null;
      this.layers = null; // the latest `layers` record (per-parameter top-k table), decoded
      this.skippedLines = 0;
      this.malformed = 0;
      this.version++;
      this.smoothCache = new Map();
    }

    /** "kind:step" (nonfinite: "nonfinite:field:step") -> {kind, step, field, value, sources, seg}. */
    get marks() {
      return this.noted.marks;
    }

    /** The latest events other than alarms. */
    get events() {
      return this.noted.events;
    }

    /** Alarm, alarm_end and abort events, in file order, each once. */
    get alarmEvents() {
      return this.noted.alarmEvents;
    }

    /** Record keys that are not curves (runload.js skips them in history answers too). */
    get notCurves() {
      return NOT_CURVES;
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
        // Decimating a train series makes the base no longer every step (exact smoothing needs it).
        const onCompact = field.startsWith("eval/") || field.startsWith("system/") ? null : () => (this.exact = false);
        s = new lib.Series(this.cap, onCompact);
        this.series.set(field, s);
      }
      return s;
    }

    pointCount(field) {
      const s = this.series.get(field);
      return s ? s.length : 0;
    }

    /** The value of `field` at the last step that has it (null when none). */
    lastValue(field) {
      const s = this.series.get(field);
      return s && s.length ? s.values[s.length - 1] : null;
    }

    /** Whether a step carries a detector flag (spike or skip): left out of a chart's outlier range. */
    flagged(step) {
      return this.noted.flagged(step);
    }

    /** Whether any step carries a detector flag. */
    hasFlags() {
      return this.noted.hasFlags();
    }

    _put(field, step, value) {
      this.get(field).put(step, value, (st) => this.noted.flagged(st));
      this.segments.held(step);
    }

    /** A mark (`reason`: a skip's reason, e.g. "overflow"); see RunMarks.add. */
    addMark(kind, step, field, value, source, reason) {
      return this.noted.add(kind, step, field, value, source, reason);
    }

    /** Whether `step` is a loss-scale overflow (a skip whose non-finite norm is expected). */
    overflowAt(step) {
      return this.noted.overflowAt(step);
    }

    /** The run's rollbacks (automatic recovery's `rollback` events, docs/format.md), sorted by step. */
    rollbacks() {
      return this.events.filter((e) => e.kind === "rollback" && typeof e.step === "number").sort((a, b) => a.step - b.step);
    }

    /** Marks of a kind ("spike", "nonfinite", "skip"), sorted by step. */
    marksOf(kind) {
      return this.noted.of(kind);
    }

    /** Take one decoded or wire record (non-finite strings are decoded here). Returns true if it changed data. */
    ingestRecord(wire) {
      const rec = lib.normalizeRecord(lib.decodeNonFinite(wire));
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
          this.addHeader(rec);
          return true;
        case "event":
          this.noted.addEvent(rec);
          return true;
        case "end":
          this.ended = rec;
          return true;
        case "layers":
          return this.setLayers(rec);
        default:
          return false; // unknown record types are ignored (forward compatibility)
      }
    }

    /** A header seen again (a resubscribe resending it) is not a new segment. */
    addHeader(rec) {
      const key = rec.run_id !== undefined ? String(rec.run_id) + "@" + rec.start_time : JSON.stringify(rec);
      if (this.headerKeys.has(key)) return false;
      this.headerKeys.add(key);
      this.headers.push(rec);
      this.ended = null;
      this.segments.newSegment();
      return true;
    }

    /**
     * Keep the latest `layers` record in file order (a resumed run's lower step still wins; records
     * re-sent after a resubscribe end with the newest one again).
     */
    setLayers(rec) {
      if (!rec || !Array.isArray(rec.top)) return false;
      this.layers = rec;
      this.layersVersion++;
      return true;
    }

    /**
     * Drop what older segments than the current one hold at steps in [from, to]: a step of the
     * current segment newly covers them (the latest segment wins, step by step, docs/format.md), so
     * a rolled-back run shows each step once and keeps the old steps after the rollback's last one.
     */
    replaceRange(from, to) {
      for (const s of this.series.values()) s.removeRange(from, to);
      this.noted.replaceRange(from, to);
      if (this.detail && this.detail.start <= to && this.detail.end >= from) this.detail = null;
    }

    _ingestStep(rec) {
      const step = rec.step;
      const replaced = this.segments.extend(step);
      if (replaced) this.replaceRange(replaced[0], replaced[1]);
      if (typeof rec.ts === "number") this._put("ts", step, rec.ts);
      // A loss-scale overflow's non-finite norms are expected: the step is a skip (a non-finite
      // loss is never an overflow, and keeps its mark).
      const overflow = rec.skip_reason === OVERFLOW;
      let nonfinite = false;
      for (const k of Object.keys(rec)) {
        const v = rec[k];
        if (typeof v !== "number" || NOT_CURVES.has(k)) continue;
        this._put(k, step, v);
        if (!Number.isFinite(v) && !(overflow && k !== "loss")) {
          this.addMark("nonfinite", step, k, v, "cell");
          nonfinite = true;
        }
      }
      const markField = "grad_norm" in rec ? "grad_norm" : "loss";
      const reason = typeof rec.skip_reason === "string" ? rec.skip_reason : undefined;
      for (const [flag, kind] of MARK_FLAGS) {
        if (rec[flag] === true && !(kind === "nonfinite" && nonfinite)) {
          this.addMark(kind, step, markField, rec[markField], "cell", kind === "skip" ? reason : undefined);
        }
      }
    }

    /** Replace everything with a whole-run /history response (runload.js, docs/protocol.md). */
    loadHistory(resp, info) {
      lib.loadHistory(this, resp, info);
    }

    /** Keep a window of a zoomed range, or drop it with null (runload.js). */
    setDetail(resp, smoothFrom) {
      lib.setDetail(this, resp, smoothFrom);
    }

    /** The points to draw for `field`: the base series with the zoom window spliced in. */
    view(field) {
      const s = this.series.get(field);
      const base = s ? { steps: s.steps, values: s.values } : { steps: [], values: [] };
      const win = this.detail && this.detail.series.get(field);
      return win && win.start !== undefined && win.end !== undefined ? lib.spliceWindow(base.steps, base.values, win) : base;
    }

    /**
     * The smoothed curve of a train field: {steps, values, quality}. "exact": an EMA over every
     * step of the run (the base holds them all, or a zoom window starting at the first step);
     * "lead-in": over every step of a zoom window from `smoothFrom` on, the EMA started
     * lib.LEAD_IN_E / (1 - alpha) steps earlier (smoothing.js bounds the error); "approx": over the
     * points held (downsampled), shown as such on the chart.
     */
    smoothed(field, alpha) {
      const d = this.detail;
      const win = d && d.exact && d.series.get(field);
      const key = [alpha, this.version, this.exact].join("|");
      const hit = this.smoothCache.get(field);
      if (hit && hit.key === key) return hit.out;
      let out;
      if (this.exact) {
        const s = this.series.get(field) || { steps: [], values: [] };
        out = { steps: s.steps, values: lib.emaDebiased(s.values, alpha), quality: "exact" };
      } else if (win && d.smoothFrom !== undefined && lib.leadInOk(d.start, d.smoothFrom, this.firstStep, alpha)) {
        const all = lib.emaDebiased(win.values, alpha);
        const i = lowerBound(win.steps, d.smoothFrom);
        const exact = d.start <= this.firstStep;
        out = { steps: win.steps.slice(i), values: all.slice(i), quality: exact ? "exact" : "lead-in" };
      } else {
        const v = this.view(field);
        out = { steps: v.steps, values: lib.emaDebiased(v.values, alpha), quality: "approx" };
      }
      this.smoothCache.set(field, { key, out });
      return out;
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
      if (i === 0) return s.values[0] - (s.length > 1 ? (s.steps[0] - step) * lib.slope(s, 0) : 0);
      if (i >= s.length) return s.values[s.length - 1] + (s.length > 1 ? (step - s.steps[s.length - 1]) * lib.slope(s, s.length - 2) : 0);
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

  return { NOT_CURVES, RunData };
});
