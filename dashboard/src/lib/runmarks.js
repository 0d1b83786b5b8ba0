/* What a run's records flag, kept apart from its curves: marks (spike, skip, non-finite) and events
 * (alarms once each, the latest other events), each tagged with the segment it came with so a
 * newer segment can replace them step by step (docs/format.md, "Segments"). Pure.
 *
 * Marks are the writer's flags and non-finite values only (a loss-scale overflow is a skip, not a
 * non-finite mark); the page computes no spike rule of its own (alarms come as events, alarms.js).
 */
(function (root, factory) {
  "use strict";
  const isNode = typeof module !== "undefined" && module.exports;
  const deps = isNode ? Object.assign({}, require("./schema.js"), require("./jsonl.js"), require("./alarms.js")) : root.GradmonLib;
  const api = factory(deps);
  if (isNode) module.exports = api;
  else Object.assign((root.GradmonLib = root.GradmonLib || {}), api);
})(typeof self !== "undefined" ? self : this, function (lib) {
  "use strict";

  const OVERFLOW = lib.SCHEMA.OVERFLOW_REASON;
  const MAX_MARKS = 20000; // as the server's history
  const MAX_EVENTS = 1000;
  const MAX_ALARM_EVENTS = 5000;
  const ALARM_KINDS = new Set(["alarm", "alarm_end", "abort"]);
  const MARK_EVENT_KINDS = new Set(["spike", "skip", "nonfinite"]);

  class RunMarks {
    /** `segments`: the run's SegmentCover (segments.js), asked for the current tag and told what it holds. */
    constructor(segments) {
      this.segments = segments;
      this.marks = new Map(); // "kind:step" (nonfinite: "nonfinite:field:step") -> {kind, step, field, value, sources, seg}
      this.flagSteps = null; // steps of the spike and skip marks (built when asked, dropped when marks go)
      this.events = []; // the latest events other than alarms
      this.alarmEvents = []; // alarm, alarm_end and abort events, in file order, each once
      this.alarmKeys = new Set(); // alarmKey of each of them
      this.eventTags = new WeakMap(); // event record -> the segment tag it came with
    }

    /** Whether a step carries a detector flag (spike or skip): left out of a chart's outlier range. */
    flagged(step) {
      return this._flagSteps().has(step);
    }

    /** Whether any step carries a detector flag. */
    hasFlags() {
      return this._flagSteps().size > 0;
    }

    /** The steps with a spike or skip mark, as numbers (a redraw asks once per point in view). */
    _flagSteps() {
      if (!this.flagSteps) {
        this.flagSteps = new Set();
        for (const m of this.marks.values()) if (m.kind === "spike" || m.kind === "skip") this.flagSteps.add(m.step);
      }
      return this.flagSteps;
    }

    /** A mark (`reason`: a skip's reason, e.g. "overflow"); null when the cap is reached. */
    add(kind, step, field, value, source, reason) {
      // One spike/skip mark per step; non-finite marks per field (loss and norm can both be NaN).
      const key = kind === "nonfinite" ? "nonfinite:" + field + ":" + step : kind + ":" + step;
      const m = this.marks.get(key);
      const seg = this.segments.tag();
      if (m) {
        if (!m.sources.includes(source)) m.sources.push(source);
        if (m.value === undefined && value !== undefined) m.value = value;
        if (m.reason === undefined && reason !== undefined) m.reason = reason;
        if (seg > m.seg) m.seg = seg; // asserted again by a newer segment
        return m;
      }
      if (this.marks.size >= MAX_MARKS) return null; // as the server: the first ones are kept
      const mark = { kind, step, field, value, sources: [source], seg };
      if (reason !== undefined) mark.reason = reason;
      this.marks.set(key, mark);
      if (this.flagSteps && (kind === "spike" || kind === "skip")) this.flagSteps.add(step);
      this.segments.held(step);
      return mark;
    }

    /** A mark of a history response (docs/protocol.md). */
    addServerMark(m) {
      const reason = typeof m.reason === "string" ? m.reason : undefined;
      return this.add(m.kind, m.step, m.field || "grad_norm", lib.decodeNumber(m.value), "server", reason);
    }

    /** Whether `step` is a loss-scale overflow (a skip whose non-finite norm is expected). */
    overflowAt(step) {
      const m = this.marks.get("skip:" + step);
      return !!m && m.reason === OVERFLOW;
    }

    /** Marks of a kind ("spike", "nonfinite", "skip"), sorted by step. */
    of(kind) {
      const out = [];
      for (const m of this.marks.values()) if (m.kind === kind) out.push(m);
      return out.sort((a, b) => a.step - b.step);
    }

    /** An `event` record: an alarm kept once however often it arrives, any other kept among the latest. */
    addEvent(rec) {
      if (ALARM_KINDS.has(rec.kind)) {
        // An incident is kept once, however often its events arrive (history, live, resent).
        const key = lib.alarmKey(rec);
        if (this.alarmKeys.has(key)) return;
        this.alarmKeys.add(key);
        this.eventTags.set(rec, this.segments.tag());
        this.alarmEvents.push(rec);
        if (this.alarmEvents.length > MAX_ALARM_EVENTS) this.alarmKeys.delete(lib.alarmKey(this.alarmEvents.shift()));
      } else {
        this.eventTags.set(rec, this.segments.tag());
        this.events.push(rec);
        if (this.events.length > MAX_EVENTS) this.events.shift();
      }
      this.segments.held(rec.step);
      if (typeof rec.step === "number" && MARK_EVENT_KINDS.has(rec.kind)) {
        const value = typeof rec.grad_norm === "number" ? rec.grad_norm : undefined;
        const reason = rec.kind === "skip" && typeof rec.reason === "string" ? rec.reason : undefined;
        this.add(rec.kind, rec.step, "grad_norm", value, "event", reason);
      }
    }

    /** Drop the marks and events that segments older than the current one put at steps in [from, to]. */
    replaceRange(from, to) {
      const older = (tag) => this.segments.older(tag);
      const inRange = (s) => typeof s === "number" && s >= from && s <= to;
      for (const [k, m] of this.marks) if (inRange(m.step) && older(m.seg)) this.marks.delete(k);
      this.flagSteps = null;
      const keep = (e) => !(inRange(e.step) && older(this.eventTags.get(e)));
      this.events = this.events.filter(keep);
      this.alarmEvents = this.alarmEvents.filter(keep);
      this.alarmKeys = new Set(this.alarmEvents.map(lib.alarmKey));
    }
  }

  return { RunMarks };
});
