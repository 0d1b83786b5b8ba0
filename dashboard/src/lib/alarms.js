/* Alarm incidents from a run's events: what the banner and the browser notifications show.
 *
 * The page never decides what is an alarm: the writer (or the server's ingest) computes alarms at
 * full resolution and writes them as events (docs/format.md):
 *   {"type":"event","kind":"alarm","step":S,"reason":"grad_norm_spike",...,"value":V,"baseline":B,"message":...}
 * at an incident's first step, then, when it closes (or the run ends),
 *   {"type":"event","kind":"alarm_end","step":E,"start":S,"flagged":K,"message":...}
 * An alarm without its end is an ongoing incident. An `abort` event is an incident of its own
 * unless an alarm with reason "abort" stands for it. Unknown extra fields are carried along.
 * Alarms the server derived (for a log whose writer does not run the rule) carry
 * "source": "server" and are shown the same way. The same event may reach the page twice (a
 * history reload, a resubscribe resending records): `alarmKey` identifies it, so it is kept once.
 */
(function (root, factory) {
  "use strict";
  const api = factory();
  if (typeof module !== "undefined" && module.exports) module.exports = api;
  else Object.assign((root.GradmonLib = root.GradmonLib || {}), api);
})(typeof self !== "undefined" ? self : this, function () {
  "use strict";

  const REASON_TITLES = {
    nonfinite: "non-finite value",
    grad_norm_spike: "gradient-norm spike",
    loss_spike: "loss spike",
    abort: "training aborted",
  };

  function isStep(v) {
    return typeof v === "number" && Number.isInteger(v);
  }

  /**
   * Incidents of one run from its events (in file order): [{run, key, reason, start, end, flagged,
   * ongoing, field, value, baseline, message, ts, alarm}] sorted by start step. `end` is the last
   * flagged step (the start while ongoing); `flagged` the count of flagged steps (null while
   * ongoing, or when the end record does not say).
   */
  function incidentsOf(run, events) {
    const out = [];
    const open = []; // alarms still waiting for their end, in file order
    const abortAlarms = new Set();
    for (const ev of events || []) {
      if (!ev || ev.type !== "event") continue;
      if (ev.kind === "alarm" && isStep(ev.step)) {
        const inc = {
          run,
          key: run + "|" + (ev.reason || "alarm") + "|" + ev.step,
          reason: typeof ev.reason === "string" ? ev.reason : "alarm",
          start: ev.step,
          end: ev.step,
          flagged: null,
          ongoing: true,
          field: typeof ev.field === "string" ? ev.field : null,
          value: ev.value,
          baseline: ev.baseline,
          message: typeof ev.message === "string" ? ev.message : "",
          ts: ev.ts,
          alarm: ev,
        };
        if (inc.reason === "abort") abortAlarms.add(ev.step);
        out.push(inc);
        open.push(inc);
      } else if (ev.kind === "alarm_end") {
        const start = isStep(ev.start) ? ev.start : null;
        // The first open alarm it names: same start step (and reason, when the end carries one).
        const i = open.findIndex((a) => (start === null || a.start === start) && (!ev.reason || ev.reason === a.reason));
        if (i < 0) continue;
        const inc = open.splice(i, 1)[0];
        inc.ongoing = false;
        if (isStep(ev.step)) inc.end = Math.max(inc.start, ev.step);
        if (isStep(ev.flagged)) inc.flagged = ev.flagged;
        if (typeof ev.message === "string" && ev.message) inc.endMessage = ev.message;
      }
    }
    for (const ev of events || []) {
      if (!ev || ev.type !== "event" || ev.kind !== "abort" || !isStep(ev.step) || abortAlarms.has(ev.step)) continue;
      out.push({
        run, key: run + "|abort|" + ev.step, reason: "abort", start: ev.step, end: ev.step, flagged: null,
        ongoing: false, field: null, value: undefined, baseline: undefined,
        message: typeof ev.message === "string" ? ev.message : "", ts: ev.ts, alarm: ev,
      });
    }
    return out.sort((a, b) => a.start - b.start);
  }

  /**
   * What identifies an alarm, alarm_end or abort event of a run: its kind, step and reason (an
   * alarm_end carries no reason: its incident's start step stands for it).
   */
  function alarmKey(ev) {
    const which = ev.reason !== undefined ? ev.reason : ev.start;
    return ev.kind + "|" + ev.step + "|" + (which === undefined ? "" : String(which));
  }

  /** A short title for an incident's reason ("gradient-norm spike"; an unknown reason as written). */
  function reasonTitle(reason) {
    return REASON_TITLES[reason] || String(reason).replace(/_/g, " ");
  }

  /**
   * One line of text for an incident (without the run name): reason, steps, flagged count, value
   * against baseline. `format` formats numbers.
   */
  function incidentText(inc, format) {
    const parts = [reasonTitle(inc.reason)];
    if (inc.ongoing) parts.push("since step " + inc.start + " · ongoing");
    else if (inc.end > inc.start) parts.push("steps " + inc.start + "–" + inc.end);
    else parts.push("step " + inc.start);
    if (inc.flagged !== null) parts.push(inc.flagged + (inc.flagged === 1 ? " flagged step" : " flagged steps"));
    if (inc.value !== undefined && inc.value !== null) {
      let v = (inc.field ? inc.field + " " : "") + format(inc.value);
      if (typeof inc.baseline === "number" && Number.isFinite(inc.baseline)) v += " vs " + format(inc.baseline);
      parts.push(v);
    }
    return parts.join(" · ");
  }

  /** Keys of incidents not in `seen` (a Set, updated): the ones to notify about. */
  function newIncidents(incidents, seen) {
    const fresh = [];
    for (const inc of incidents) {
      if (seen.has(inc.key)) continue;
      seen.add(inc.key);
      fresh.push(inc);
    }
    return fresh;
  }

  return { REASON_TITLES, alarmKey, incidentsOf, reasonTitle, incidentText, newIncidents };
});
