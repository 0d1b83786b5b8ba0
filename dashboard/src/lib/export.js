/* CSV and JSON of what a chart shows: one part per (run, field), every step of the x range. Pure.
 *
 * A part: {run, field, exact, step: [...], wall_time: [...] | null, value: [...], smoothed: [...] |
 * null}. `exact` says whether the part has every step of the range (false only when the range
 * was longer than the server answers at full resolution). Values keep full precision; non-finite
 * ones are written as in the run log: "NaN", "Infinity", "-Infinity".
 */
(function (root, factory) {
  "use strict";
  const isNode = typeof module !== "undefined" && module.exports;
  const api = factory(isNode ? require("./series.js") : root.GradmonLib);
  if (isNode) module.exports = api;
  else Object.assign((root.GradmonLib = root.GradmonLib || {}), api);
})(typeof self !== "undefined" ? self : this, function (lib) {
  "use strict";

  function num(v) {
    if (typeof v !== "number") return v === undefined || v === null ? null : v;
    if (Number.isNaN(v)) return "NaN";
    if (v === Infinity) return "Infinity";
    if (v === -Infinity) return "-Infinity";
    return v;
  }

  function csvCell(v) {
    if (v === null || v === undefined) return "";
    const s = String(v);
    return /[",\r\n]/.test(s) ? '"' + s.replace(/"/g, '""') + '"' : s;
  }

  /** The points of parallel arrays with steps in [a, b] (all when a/b are not finite). */
  function sliceRange(steps, values, a, b) {
    const i = Number.isFinite(a) ? lib.lowerBound(steps, a) : 0;
    const j = Number.isFinite(b) ? lib.lowerBound(steps, b + 1e-9) : steps.length;
    return { steps: steps.slice(i, j), values: values.slice(i, j) };
  }

  /** Rows `run,field,step,wall_time,value[,smoothed]` (a smoothed column when any part has one). */
  function toCSV(parts) {
    const smoothed = parts.some((p) => p.smoothed);
    const head = ["run", "field", "step", "wall_time", "value"].concat(smoothed ? ["smoothed"] : []);
    const lines = [head.join(",")];
    for (const p of parts) {
      for (let i = 0; i < p.step.length; i++) {
        const row = [p.run, p.field, p.step[i], p.wall_time ? num(p.wall_time[i]) : null, num(p.value[i])];
        if (smoothed) row.push(p.smoothed ? num(p.smoothed[i]) : null);
        lines.push(row.map(csvCell).join(","));
      }
    }
    return lines.join("\n") + "\n";
  }

  /** {chart, title, x_range, smoothing, exported_at, series: [parts]} as strict JSON text. */
  function toJSON(parts, meta) {
    const doc = Object.assign({}, meta, {
      series: parts.map((p) => ({
        run: p.run,
        field: p.field,
        exact: p.exact,
        step: p.step,
        wall_time: p.wall_time ? p.wall_time.map(num) : null,
        value: p.value.map(num),
        smoothed: p.smoothed ? p.smoothed.map(num) : null,
      })),
    });
    return JSON.stringify(doc, null, 1) + "\n";
  }

  /** A file name from parts of text: letters, digits, ".", "_" and "-" only. */
  function fileName(parts, ext) {
    return parts.filter((p) => p !== null && p !== undefined && p !== "").map((p) => String(p).replace(/[^A-Za-z0-9._-]+/g, "_")).join("-") + "." + ext;
  }

  return { sliceRange, toCSV, toJSON, fileName };
});
