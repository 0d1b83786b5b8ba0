/* The compact tooltip of a chart: this chart's field(s) for each run at the hovered step. Pure. */
(function (root, factory) {
  "use strict";
  const isNode = typeof module !== "undefined" && module.exports;
  const api = factory(isNode ? require("./format.js") : root.GradmonLib);
  if (isNode) module.exports = api;
  else Object.assign((root.GradmonLib = root.GradmonLib || {}), api);
})(typeof self !== "undefined" ? self : this, function (lib) {
  "use strict";

  function esc(s) {
    return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
  }

  /** "run|field|role" (or "run|spikes") split from the right: run names may hold "|", fields do not. */
  function splitId(id) {
    const role = id.slice(id.lastIndexOf("|") + 1);
    const rest = id.slice(0, id.lastIndexOf("|"));
    if (role === "spikes" || role === "skips" || role === "rollbacks") return { run: rest, field: null, role };
    return { run: rest.slice(0, rest.lastIndexOf("|")), field: rest.slice(rest.lastIndexOf("|") + 1), role };
  }

  /**
   * Rows of the tooltip from ECharts' axis-tooltip params: [{run, step, value, raw, eval, marks}],
   * one per run, in the order the params list them. `value` is the smoothed value when smoothing is
   * on (`raw` the raw one), `step` the run's drawn point nearest the pointer; marks (non-finite,
   * spike, skip) only when at that very step.
   */
  function tooltipRows(params) {
    const rows = new Map();
    for (const p of Array.isArray(params) ? params : [params]) {
      const data = Array.isArray(p.data) ? p.data : p.data && p.data.value;
      if (!data) continue;
      const { run, field, role } = splitId(String(p.seriesId || ""));
      if (!rows.has(run)) rows.set(run, { run, marks: [], pending: [] });
      const r = rows.get(run);
      if (role === "raw" && field.startsWith("eval/")) r.evalPoint = data;
      else if (role === "raw") r.rawPoint = data;
      else if (role === "smooth") r.smoothPoint = data;
      else if (p.data && p.data.nonfinite) r.pending.push([data[2], p.data.field + " " + p.data.nonfinite]);
      else if (p.data && p.data.mark) r.pending.push([data[2], p.data.mark.kind + (p.data.mark.reason ? " (" + p.data.mark.reason + ")" : "")]);
    }
    const out = [];
    for (const r of rows.values()) {
      if (!r.rawPoint && !r.evalPoint) continue;
      const step = r.rawPoint ? r.rawPoint[2] : null;
      out.push({
        run: r.run,
        step,
        value: r.smoothPoint ? r.smoothPoint[1] : r.rawPoint ? r.rawPoint[1] : undefined,
        raw: r.smoothPoint && r.rawPoint ? r.rawPoint[1] : undefined,
        eval: r.evalPoint ? { step: r.evalPoint[2], value: r.evalPoint[1] } : null,
        marks: r.pending.filter(([s]) => s === step).map(([, text]) => text),
      });
    }
    return out;
  }

  /** The tooltip's HTML: "step N", then a row per run (swatch, name, value, raw, eval, marks). */
  function tooltipHtml(params, opts) {
    const rows = tooltipRows(params);
    const field = opts.field || "";
    const head = rows.find((r) => r.step !== null);
    const step = head ? head.step : null;
    const lines = rows.map((r) => {
      const at = r.step !== null && r.step !== step ? " <span class='tt-at'>@" + r.step + "</span>" : "";
      const marks = r.marks.length ? " <span class='tt-bad'>▲ " + r.marks.map(esc).join(", ") + "</span>" : "";
      let cells = "<td class='tt-v'>" + (r.value !== undefined ? esc(lib.formatField(field, r.value)) : "") + "</td>";
      if (opts.smoothing) cells += "<td class='tt-raw'>" + (r.raw !== undefined ? esc(lib.formatField(field, r.raw)) : "") + "</td>";
      if (r.eval) cells += "<td class='tt-eval'>eval " + esc(lib.formatValue(r.eval.value)) + (r.eval.step !== step ? " @" + r.eval.step : "") + "</td>";
      return "<tr><td><i class='tt-swatch' style='background:" + esc(opts.colorOf(r.run)) + "'></i>" + esc(r.run) + at + marks + "</td>" + cells + "</tr>";
    });
    const title = "step " + (step === null ? "?" : step) + (opts.smoothing ? " · smoothed <span class='tt-raw'>(raw)</span>" : "");
    return "<div class='tt'><div class='tt-head'>" + title + "</div><table>" + lines.join("") + "</table></div>";
  }

  return { tooltipRows, tooltipHtml, escapeHtml: esc };
});
